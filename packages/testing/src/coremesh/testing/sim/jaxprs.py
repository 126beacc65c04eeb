"""Walking a kernel's jaxpr: the simulator's checks look at every equation, nested ones too,
and at the memory space of each ref."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any


def all_eqns(jaxpr: Any) -> list[Any]:
    """Every equation of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``) and of the jaxprs in its
    equations' parameters (loops, conditionals, ``run_scoped``, ...)."""
    out: list[Any] = []
    stack = [getattr(jaxpr, "jaxpr", jaxpr)]
    while stack:
        inner = stack.pop()
        for eqn in getattr(inner, "eqns", ()):
            out.append(eqn)
            stack += sub_jaxprs(eqn)
    return out


def sub_jaxprs(eqn: Any) -> list[Any]:
    """The jaxprs in ``eqn``'s parameters (a loop's body, a conditional's branches, ...)."""
    subs = []
    for value in eqn.params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            sub = getattr(item, "jaxpr", item)
            if hasattr(sub, "eqns"):
                subs.append(sub)
    return subs


#: Primitives that take a ``device_id`` among their flattened arguments.
ADDRESSED = ("semaphore_signal", "dma_start")


def arguments(eqn: Any) -> tuple[str, Any]:
    """The name of ``eqn``'s argument-tree parameter (``semaphore_signal``'s ``args_tree``,
    ``dma_start``'s ``tree``) and its arguments unflattened; ``("", ())`` without one."""
    from jax._src import tree_util

    for key in ("args_tree", "tree"):
        tree = eqn.params.get(key)
        if tree is not None:
            return key, tree_util.tree_unflatten(tree, eqn.invars)
    return "", ()


def device_ids(eqn: Any) -> Iterator[dict[Any, Any]]:
    """The ``device_id`` dicts (named mesh axes) of a signal or DMA (none for other
    equations)."""
    if eqn.primitive.name in ADDRESSED:
        yield from (a for a in arguments(eqn)[1] if isinstance(a, dict))


@functools.cache
def _jaxpr_types() -> tuple[type, ...]:
    from jax._src import core as jax_core

    from coremesh.testing.sim import compat

    closed = compat.closed_jaxpr_class()
    return (jax_core.Jaxpr,) if closed is None else (jax_core.Jaxpr, closed)


def is_jaxpr(value: Any) -> bool:
    """Is ``value`` a ``Jaxpr``, or (jax 0.10) a ``ClosedJaxpr``?"""
    return isinstance(value, _jaxpr_types())


def with_vars(jaxpr: Any, **changes: Any) -> Any:
    """``jaxpr.replace(**changes)`` that keeps the values attached to its constvars. From jax
    0.11 a ``Jaxpr`` carries them (``ClosedJaxpr`` merged into it) and a constvar is only an
    input with a value attached: replacing ``constvars`` drops the values, so the constvars
    become leading invars. A ``run_scoped`` body rewritten so then has its captured refs among
    the refs it allocates, and the interpreter fails with "Cannot allocate HBM in
    `run_scoped`"."""
    consts = getattr(jaxpr, "consts", None)
    if "constvars" in changes and consts and "consts" not in changes:
        changes["consts"] = consts
    return jaxpr.replace(**changes)


def map_jaxprs(value: Any, f: Callable[[Any], Any]) -> Any:
    """``value`` (an equation's parameter) with each jaxpr in it, in tuples and lists too,
    replaced by ``f(jaxpr)``: how a rewrite reaches a loop's body or a conditional's branches."""
    if isinstance(value, tuple | list):
        return type(value)(map_jaxprs(item, f) for item in value)
    return f(value) if is_jaxpr(value) else value


def lax_primitives() -> frozenset[Any]:
    """The value primitives of ``jax.lax`` (elementwise, slicing, reductions, sorts, scans,
    FFT, linear algebra): what a kernel body computes with, as opposed to Pallas' and state's
    own primitives and the simulator's."""
    return primitives_of(
        *(
            f"jax._src.lax.{name}"
            for name in (
                "lax", "slicing", "windowed_reductions", "fft", "linalg", "special",
                "convolution", "ann", "control_flow.loops",
            )
        )
    )  # fmt: skip


@functools.cache
def kernel_primitives() -> frozenset[Any]:
    """:func:`lax_primitives` and the primitives of Pallas (``pl.load`` / ``pl.store`` with a
    mask, atomics, ``program_id``), of Pallas TPU (DMAs, semaphores, ``pltpu.roll``, ...) and
    of refs (``ref[...]``): what a user's kernel is made of before the simulator rewrites it."""
    return lax_primitives() | primitives_of(
        "jax._src.pallas.primitives",
        "jax._src.pallas.mosaic.primitives",
        "jax._src.state.primitives",
    )


@functools.cache
def primitives_of(*modules: str) -> frozenset[Any]:
    """The primitives the named modules define (those of them the installed jax has)."""
    import importlib

    from jax._src import core as jax_core

    found: set[Any] = set()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found.update(v for v in vars(module).values() if isinstance(v, jax_core.Primitive))
    return frozenset(found)


def memory_space(aval: Any) -> str:
    """The memory space of a ref's aval, as a lower-case name: ``"vmem"``, ``"smem"``,
    ``"any"``, ...; ``"none"`` or ``"default"`` where the kernel left it to the default."""
    space = getattr(aval, "memory_space", None)
    return str(space).lower().rsplit(".", 1)[-1] if space is not None else "none"


#: Equations that touch memory, each a callback when interpreted.
_ACCESSES = frozenset(
    {
        "get",
        "swap",
        "addupdate",
        "dma_start",
        "dma_wait",
        "semaphore_signal",
        "semaphore_wait",
        "load",
        "store",
    }
)
#: Trip count assumed for a ``while`` loop, whose count is known only at run time.
WHILE_TRIPS = 8


def _of_dtype(aval_or_dtype: Any, base: Any) -> bool:
    """Is ``aval_or_dtype`` (a ref's aval, an array's, or a dtype) of ``base`` or a subtype?"""
    import jax

    inner = getattr(aval_or_dtype, "inner_aval", aval_or_dtype)
    dtype = getattr(inner, "dtype", inner)
    try:
        return dtype is not None and bool(jax.dtypes.issubdtype(dtype, base))
    except TypeError:
        return False


def is_semaphore(aval_or_dtype: Any) -> bool:
    """Is it (a ref's aval, an array's, or a dtype) of semaphores, of either kind?"""
    from jax._src.pallas import core as pallas_core

    return _of_dtype(aval_or_dtype, pallas_core.semaphore_dtype)


def is_dma_semaphore(aval_or_dtype: Any) -> bool:
    """Is it (a ref's aval, an array's, or a dtype) of DMA semaphores?"""
    from jax._src.pallas.mosaic import core as mosaic_core

    return _of_dtype(aval_or_dtype, mosaic_core.dma_semaphore)


def accesses(jaxpr: Any) -> tuple[int, int]:
    """(static, dynamic) counts of the memory accesses of ``jaxpr``: the equations as written,
    and as run (a ``scan`` counts ``length`` times, a ``while`` :data:`WHILE_TRIPS` times, a
    ``cond`` its costliest branch). Each is an interpreter callback; the static count is what
    the compiled path traces and compiles."""
    static = dynamic = 0
    for eqn in getattr(getattr(jaxpr, "jaxpr", jaxpr), "eqns", ()):
        name = eqn.primitive.name
        if name in _ACCESSES:
            static, dynamic = static + 1, dynamic + 1
            continue
        subs = [accesses(sub) for sub in sub_jaxprs(eqn)]
        if not subs:
            continue
        if name == "cond":
            static += sum(s for s, _ in subs)
            dynamic += max(d for _, d in subs)
            continue
        trips = int(eqn.params.get("length", 1)) if name == "scan" else 1
        trips = WHILE_TRIPS if name == "while" else trips
        static += sum(s for s, _ in subs)
        dynamic += trips * sum(d for _, d in subs)
    return static, dynamic


def largest_product(jaxpr: Any) -> int:
    """The multiply-adds of the largest ``dot_general`` in ``jaxpr`` (nested ones included):
    the product XLA:CPU may spread over the host's threads by itself."""
    import math

    largest = 0
    for eqn in all_eqns(jaxpr):
        if eqn.primitive.name != "dot_general":
            continue
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        out = eqn.outvars[0].aval.shape
        largest = max(largest, math.prod(out) * math.prod(lhs[d] for d in lhs_contract))
    return largest


class PerJaxpr:
    """``rewrite`` of each jaxpr level the interpreter evaluates (``_interpret_jaxpr`` runs once
    per level and per call), made once per jaxpr: weakly keyed, shared by the cores' threads.
    ``rewrite`` returns None where it changes nothing."""

    def __init__(self, rewrite: Callable[[Any], Any | None]) -> None:
        self._rewrite = rewrite
        self._cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, jaxpr: Any) -> Any | None:
        with self._lock:
            if jaxpr not in self._cache:
                self._cache[jaxpr] = self._rewrite(jaxpr)
            return self._cache[jaxpr]
