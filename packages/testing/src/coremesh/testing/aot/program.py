"""What the compile-only tools take: a program that can be built for any device mesh.

A program is rebuilt for every chip because its device mesh (and often its core mesh) differs per
chip. Anything with this shape is a program (the core_map guide's ``GuideProgram`` is one)::

    class MyProgram:
        name = "add_one"
        uses_sparsecore = False                     # optional; True: needs SparseCores
        def build(self, mesh):                      # mesh: 1-d jax Mesh, axis "device"
            return jax.jit(jax.shard_map(..., mesh=mesh, ...))
        def arg_specs(self, num_devices):           # global shapes and dtypes
            return (jax.ShapeDtypeStruct((1024 * num_devices, 1024), jnp.float32),)
        def in_specs(self):                         # how each argument is split over "device"
            return (jax.P("device", None),)

Optional extras the tools use when present: ``xla_reference`` (a program computing the same result
with plain ``jax.numpy``, for the cycle comparison), ``work(num_devices)`` (a ``Work`` for the
roofline) and ``declared(num_devices)`` (a ``Declared`` listing blocks and scratch to validate
before tracing).

``FunctionProgram`` builds one from functions; ``jitted_program`` wraps a function, jitted or not,
that takes its mesh from context (``jax.shard_map`` without ``mesh=``): a ``ContextMeshProgram``,
which one process compiles for one chip's mesh only (the shard_map keeps the first mesh it is
traced under), so the compile matrix builds it for any other chip in a fresh process.
``as_programs`` turns what a ``MODULE:ATTR`` reference names into programs (see ``load``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from coremesh.core.errors import CoremeshError

if TYPE_CHECKING:
    from coremesh.testing.aot.roofline import Work
    from coremesh.testing.aot.validate import Declared


@runtime_checkable
class Program(Protocol):
    """A jitted program built per device mesh, with its arguments' shapes and partition specs."""

    @property
    def name(self) -> str: ...

    def build(self, mesh: Any) -> Callable[..., Any]: ...

    def arg_specs(self, num_devices: int) -> Sequence[Any]: ...

    def in_specs(self) -> Sequence[Any]: ...


@dataclasses.dataclass(frozen=True)
class Arg:
    """One argument: global ``shape``, ``dtype`` and its ``PartitionSpec`` over ``"device"``.

    ``spec=None`` means replicated (``P()``).
    """

    shape: tuple[int, ...]
    dtype: Any
    spec: Any = None

    def partition_spec(self) -> Any:
        if self.spec is not None:
            return self.spec
        from jax.sharding import PartitionSpec

        return PartitionSpec()


ArgsLike = Sequence[Arg] | Callable[[int], Sequence[Arg]]


@dataclasses.dataclass(frozen=True)
class FunctionProgram:
    """A program from a builder function ``build(mesh) -> jitted`` and its arguments.

    ``args`` is a sequence of ``Arg`` or a function of the device count returning one.
    """

    name: str
    builder: Callable[[Any], Callable[..., Any]]
    args: ArgsLike
    uses_sparsecore: bool = False
    xla_reference: Any = None
    work_fn: Callable[[int], Work] | None = None
    declared_fn: Callable[[int], Declared] | None = None

    def build(self, mesh: Any) -> Callable[..., Any]:
        return self.builder(mesh)

    def _args(self, num_devices: int) -> Sequence[Arg]:
        return self.args(num_devices) if callable(self.args) else self.args

    def arg_specs(self, num_devices: int) -> tuple[Any, ...]:
        import jax

        return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self._args(num_devices))

    def in_specs(self) -> tuple[Any, ...]:
        return tuple(a.partition_spec() for a in self._args(1))

    def work(self, num_devices: int) -> Work | None:
        return None if self.work_fn is None else self.work_fn(num_devices)

    def declared(self, num_devices: int) -> Declared | None:
        return None if self.declared_fn is None else self.declared_fn(num_devices)


@dataclasses.dataclass(frozen=True)
class ContextMeshProgram(FunctionProgram):
    """A function that takes its device mesh from context, jitted afresh for each chip.

    ``fn`` is the Python function under the jit (a ``jax.shard_map`` without ``mesh=``, often).
    Such a shard_map keeps the first mesh it is traced under, so one process can compile ``fn``
    for one chip's mesh only; ``source`` (where ``fn`` is defined) lets another process rebuild it
    for the next chip (see ``bound_to_other_mesh``).
    """

    fn: Callable[..., Any] | None = None
    source: ProgramRef | None = None

    def build(self, mesh: Any) -> Callable[..., Any]:
        if self.fn is not None:
            _remember_mesh(self.fn, mesh)
        return self.builder(mesh)


#: The abstract mesh each context-mesh function was first built for in this process.
_FIRST_MESH: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _remember_mesh(fn: Callable[..., Any], mesh: Any) -> None:
    with contextlib.suppress(TypeError):  # a callable that takes no weak reference
        _FIRST_MESH.setdefault(fn, mesh.abstract_mesh)


def bound_to_other_mesh(program: Any, mesh: Any) -> bool:
    """True when ``program`` takes its mesh from context and this process already built it for
    another device mesh: ``jax.shard_map`` without ``mesh=`` keeps the first mesh it was traced
    under (on every jax line coremesh supports), so compiling it here would fail or build the
    wrong chip. ``compile_on`` compiles such a program in a fresh process instead."""
    fn = getattr(program, "fn", None) if isinstance(program, ContextMeshProgram) else None
    if fn is None:
        return False
    try:
        first = _FIRST_MESH.get(fn)
    except TypeError:
        return False
    return first is not None and first != mesh.abstract_mesh


def jitted_program(
    fn: Callable[..., Any],
    args: ArgsLike,
    *,
    name: str | None = None,
    uses_sparsecore: bool = False,
    xla_reference: Any = None,
    source: ProgramRef | None = None,
) -> ContextMeshProgram:
    """A program from a function that takes its device mesh from context.

    ``fn`` is traced inside ``jax.set_mesh(<the chip's device mesh>)``, so ``jax.shard_map``
    without ``mesh=`` and a TensorCore mesh of the default core count build for the chip being
    compiled. ``fn`` may be jitted or not; each chip gets a fresh ``jax.jit`` of the function a
    jitted ``fn`` wraps (only the jit is taken off, never the ``shard_map`` under it): jit's trace
    cache does not tell one chip's context mesh from another's of the same shape. Jit options
    such as ``static_argnums`` are not carried over; give a ``FunctionProgram`` builder to keep
    them. ``source`` says where ``fn`` is defined (``load`` sets it); without it the compile
    matrix looks for the program at module level when a second chip needs a fresh process.
    """
    python_fn: Callable[..., Any] = fn
    wrapped = getattr(fn, "__wrapped__", None)
    if hasattr(fn, "lower") and callable(wrapped):
        python_fn = wrapped  # the jit's own function, with its shard_map

    return ContextMeshProgram(
        name=name or str(getattr(fn, "__name__", "program")),
        builder=_jit_per_chip(python_fn),
        args=args,
        uses_sparsecore=uses_sparsecore,
        xla_reference=xla_reference,
        fn=python_fn,
        source=source,
    )


def target_program(
    fn: Callable[..., Any],
    args: ArgsLike,
    *,
    name: str | None = None,
    uses_sparsecore: bool = False,
    xla_reference: Any = None,
) -> FunctionProgram:
    """A program whose kernels and ``shard_map`` take the chip from the active coremesh target.

    coremesh's ops build their meshes from ``current_target()`` and pass ``mesh=`` to
    ``shard_map`` themselves, so nothing keeps a first chip's mesh and one process compiles
    ``fn`` for every chip (a fresh ``jax.jit`` per chip, as its trace cache cannot tell chips of
    one mesh shape apart). For a function with a ``jax.shard_map`` without ``mesh=``, use
    :func:`jitted_program`.
    """
    return FunctionProgram(
        name=name or str(getattr(fn, "__name__", "program")),
        builder=_jit_per_chip(fn),
        args=args,
        uses_sparsecore=uses_sparsecore,
        xla_reference=xla_reference,
    )


def _jit_per_chip(fn: Callable[..., Any]) -> Callable[[Any], Callable[..., Any]]:
    """A builder giving each chip a fresh ``jax.jit`` of ``fn``: jit's trace cache does not
    tell one chip's context from another's of the same mesh shape."""

    def build(_mesh: Any) -> Callable[..., Any]:
        import jax

        return jax.jit(fn)  # type: ignore[no-any-return]

    return build


def is_program(obj: object) -> bool:
    return all(callable(getattr(obj, a, None)) for a in ("build", "arg_specs", "in_specs"))


def program_name(program: Any) -> str:
    return str(getattr(program, "name", None) or type(program).__name__)


def uses_sparsecore(program: Any) -> bool:
    return bool(getattr(program, "uses_sparsecore", False))


def xla_reference(program: Any) -> Any:
    """The program's plain-XLA counterpart, or None."""
    ref = getattr(program, "xla_reference", None)
    if ref is None:
        return None
    if is_program(ref):
        return ref
    raise ProgramError(
        f"{program_name(program)}.xla_reference is not a program",
        rule="xla_reference has build(mesh), arg_specs(num_devices) and in_specs()",
        fix="wrap the jax.numpy version with FunctionProgram or jitted_program",
    )


class ProgramError(CoremeshError, TypeError):
    """Something named as a program is not one, or cannot be found."""


def as_programs(obj: Any, *, what: str = "object", source: ProgramRef | None = None) -> list[Any]:
    """Programs from ``obj``: a program, a mapping or sequence of them, a ``(fn, args)`` pair
    (see ``jitted_program``), or a function with no required parameters returning any of these.
    ``source`` is the reference ``obj`` was found at, kept by the pairs so that another process
    can rebuild them (an entry of a mapping ``source`` names directly is keyed: ``NAME[key]``).
    """
    return _programs(obj, what, source, direct=True)


def _programs(obj: Any, what: str, source: ProgramRef | None, *, direct: bool) -> list[Any]:
    if is_program(obj):
        return [obj]
    if isinstance(obj, Mapping):
        return [
            p
            for k, v in obj.items()
            for p in _programs(v, what, _entry(source, k) if direct else source, direct=False)
        ]
    if isinstance(obj, tuple) and len(obj) == 2 and callable(obj[0]) and not is_program(obj[0]):
        fn, args = obj
        name = getattr(fn, "__name__", what)
        return [jitted_program(fn, _as_args(args), name=name, source=source)]
    if isinstance(obj, Iterable) and not isinstance(obj, str | bytes):
        return [p for v in obj for p in _programs(v, what, source, direct=False)]
    if callable(obj) and _no_required_params(obj):
        return _programs(obj(), what, source, direct=False)
    raise ProgramError(
        f"{what} is not a program: {type(obj).__name__}",
        rule="a program has build(mesh), arg_specs(num_devices) and in_specs(); a reference may "
        "also name a mapping or list of programs, a (fn, args) pair, or a function with "
        "no required parameters that returns one of these",
        fix="see coremesh.testing.aot.program for the accepted forms",
    )


def _entry(source: ProgramRef | None, key: object) -> ProgramRef | None:
    """The reference of one entry of the mapping at ``source`` (``source`` if it has a key)."""
    if source is None or source.key is not None or not isinstance(key, str):
        return source
    return dataclasses.replace(source, key=key)


def _as_args(args: Any) -> list[Arg]:
    out = []
    for a in args:
        if isinstance(a, Arg):
            out.append(a)
        elif hasattr(a, "shape") and hasattr(a, "dtype"):
            sharding = getattr(a, "sharding", None)
            out.append(Arg(tuple(a.shape), a.dtype, getattr(sharding, "spec", None)))
        else:
            raise ProgramError(
                f"argument {a!r} has no shape and dtype",
                rule="arguments are Arg(shape, dtype, spec) or jax.ShapeDtypeStruct",
                fix="describe each argument with coremesh.testing.aot.Arg",
            )
    return out


def _no_required_params(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not inspect.Parameter.empty
        or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


# --------------------------------------------------------------------------- references
# A child process rebuilds a program from a reference: MODULE:ATTR, MODULE:ATTR[KEY] (one entry of
# a mapping) or PATH/TO/FILE.py:ATTR[KEY].

_REF = re.compile(r"^(?P<module>.+):(?P<attr>[A-Za-z_][\w.]*)(?:\[(?P<key>[^\]]+)\])?$")


@dataclasses.dataclass(frozen=True)
class ProgramRef:
    """Where a program lives, so another process can import it: module (or file) and attribute."""

    module: str
    attr: str
    key: str | None = None
    file: str | None = None
    #: The file as the user wrote it (``mykernel.py``), for messages; ``file`` is absolute.
    given: str | None = dataclasses.field(default=None, compare=False)

    def __str__(self) -> str:
        key = f"[{self.key}]" if self.key is not None else ""
        return f"{self.where}:{self.attr}{key}"

    @property
    def where(self) -> str:
        """The module or file as the user named it (not the module name a file is loaded as)."""
        if self.given:
            return self.given
        loaded_from_file = self.file is not None and self.module.startswith(_FILE_MODULE_PREFIX)
        return str(self.file) if loaded_from_file else self.module

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProgramRef:
        return cls(str(d["module"]), str(d["attr"]), d.get("key"), d.get("file"), d.get("given"))

    @classmethod
    def parse(cls, text: str) -> ProgramRef:
        m = _REF.match(text.strip())
        if m is None:
            raise ProgramError(
                f"{text!r} is not a program reference",
                rule="references look like package.module:NAME, package.module:NAME[key] or "
                "path/to/file.py:NAME",
                fix="name the module and the attribute, separated by ':'",
            )
        module, attr, key = m["module"], m["attr"], m["key"]
        if module.endswith(".py") or os.sep in module or "/" in module:
            path = os.path.abspath(module)
            return cls(_module_name_for_file(path), attr, key, path, module)
        return cls(module, attr, key)

    def resolve(self) -> Any:
        """Import the module and return the named object (one mapping entry if ``key``)."""
        module = _import(self)
        obj: Any = module
        for part in self.attr.split("."):
            if not hasattr(obj, part):
                public = [n for n in dir(module) if not n.startswith("_")]
                raise ProgramError(
                    f"{self.where} has no attribute {self.attr!r}",
                    rule="a reference names a module-level object",
                    fix=f"check the spelling; {self.where} defines {', '.join(public)[:300]}",
                )
            obj = getattr(obj, part)
        if self.key is None:
            return obj
        if callable(obj) and not is_program(obj) and _no_required_params(obj):
            obj = obj()  # a function returning the collection (as `coremesh.programs` names)
        if isinstance(obj, Mapping):
            if self.key not in obj:
                raise ProgramError(
                    f"{self.where}:{self.attr} has no entry {self.key!r}",
                    rule=f"its entries are {', '.join(map(str, obj))}",
                    fix="use one of those keys",
                )
            return obj[self.key]
        if isinstance(obj, Sequence):
            for p in obj:
                if program_name(p) == self.key:
                    return p
        raise ProgramError(
            f"{self.where}:{self.attr} has no program named {self.key!r}",
            rule="[key] picks a mapping entry or a program by name",
            fix="drop [key] or use a name the collection has",
        )


#: Modules loaded from a file reference are named this plus the file's stem.
_FILE_MODULE_PREFIX = "_coremesh_aot_file_"


def _module_name_for_file(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    return _FILE_MODULE_PREFIX + re.sub(r"\W", "_", stem)


def _import(ref: ProgramRef) -> ModuleType:
    if ref.file is None:
        try:
            return importlib.import_module(ref.module)
        except ImportError as e:
            raise ProgramError(
                f"cannot import {ref.module}: {e}",
                rule="the module must be importable from the current directory or sys.path",
                fix="install the package, run from its directory, or pass path/to/file.py:NAME",
            ) from e
    if ref.module in sys.modules:
        return sys.modules[ref.module]
    if not os.path.isfile(ref.file):
        raise ProgramError(  # no fix line: the path it looked for is the whole story
            f"{ref.where}: no such file (looked for {ref.file})",
            rule="a file reference names a Python source file",
        )
    try:
        return importlib.import_module(ref.module)
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(ref.module, ref.file)
    if spec is None or spec.loader is None:
        raise ProgramError(
            f"cannot load {ref.file}",
            rule="a file reference names a Python source file",
            fix="check the path",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[ref.module] = module
    directory = os.path.dirname(ref.file)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        del sys.modules[ref.module]
        raise ProgramError(
            f"{ref.where}:{e.lineno}: {e.msg}",
            rule="a file reference names a Python source file that imports",
            fix="fix the syntax error on that line",
        ) from e
    except ImportError as e:
        del sys.modules[ref.module]
        raise ProgramError(
            f"{ref.where} imports {e.name or 'a module'}, which is not installed ({e})",
            rule="the file's imports must be installed in this environment",
            fix=f"pip install what {ref.where} imports, or run coremesh from its environment",
        ) from e
    return module


def load(text: str) -> list[Any]:
    """The programs a reference string names (``MODULE:ATTR``, ``...[KEY]``, ``FILE.py:ATTR``)."""
    ref = ProgramRef.parse(text)
    return as_programs(ref.resolve(), what=str(ref), source=ref)


def reference_of(program: Any) -> ProgramRef | None:
    """Find where ``program`` lives so a child process can import it, or None.

    Looks in the module that defines the program's class or its builder function for a
    module-level name bound to it, or a mapping/list holding it.
    """
    explicit = getattr(program, "__coremesh_ref__", None)
    if isinstance(explicit, str):
        return ProgramRef.parse(explicit)
    source = getattr(program, "source", None)
    if isinstance(source, ProgramRef):
        return source
    candidates = [type(program).__module__]
    builder = getattr(program, "builder", None)
    for fn in (builder, getattr(program, "build", None), getattr(program, "fn", None)):
        mod = getattr(fn, "__module__", None)
        if mod:
            candidates.insert(0, mod)
    for modname in dict.fromkeys(candidates):
        module = sys.modules.get(modname)
        if module is None:
            continue
        found = _find_in_module(module, program)
        if found is None:
            continue
        attr, key = found
        file = getattr(module, "__file__", None)
        if modname == "__main__" and file:
            return ProgramRef(_module_name_for_file(file), attr, key, os.path.abspath(file))
        return ProgramRef(modname, attr, key, os.path.abspath(file) if file else None)
    return None


def _find_in_module(module: ModuleType, program: Any) -> tuple[str, str | None] | None:
    for name, value in list(vars(module).items()):
        if name.startswith("__"):
            continue
        if value is program:
            return name, None
        if isinstance(value, Mapping):
            for k, v in value.items():
                if v is program and isinstance(k, str):
                    return name, k
        elif isinstance(value, list | tuple):
            for v in value:
                if v is program:
                    return name, program_name(program)
    return None
