"""Backend discovery through the ``coremesh.backends`` entry-point group.

Loading is lazy (nothing is imported until a backend is asked for) and cached. Two distributions
claiming one name are refused; a backend that fails to import is named in the error. A backend
asked for by name that is missing fails loudly; one picked by discovery for a mesh kind warns
when more than one could serve it, unless ``using_backend`` chose one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

from coremesh.core.errors import BackendError, CoremeshWarning
from coremesh.core.kernel import Kernel, KernelSpec
from coremesh.core.mesh import CoreKind

GROUP = "coremesh.backends"


@runtime_checkable
class Backend(Protocol):
    """What a backend distribution registers under ``coremesh.backends``."""

    @property
    def name(self) -> str: ...

    @property
    def core_kinds(self) -> frozenset[CoreKind]: ...

    def is_available(self) -> bool:
        """Cheap and side-effect free: can this backend build kernels in this process?"""
        ...

    def make_kernel(self, spec: KernelSpec) -> Kernel: ...


@functools.cache
def _entry_points() -> Mapping[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        if ep.name in found and found[ep.name].value != ep.value:
            raise BackendError(
                f"two backends are registered as {ep.name!r}: {found[ep.name].value} and "
                f"{ep.value}",
                rule="backend names are unique across installed distributions",
                fix="uninstall one of the distributions, or rename its entry point",
            )
        found[ep.name] = ep
    return found


@functools.cache
def _load(name: str) -> Backend:
    ep = _entry_points()[name]
    try:
        obj: Any = ep.load()
    except Exception as e:
        raise BackendError(
            f"backend {name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}",
            rule="a registered backend must import cleanly",
            fix=f"reinstall the distribution that provides {ep.value.split(':')[0]}",
        ) from e
    backend = obj() if isinstance(obj, type) else obj
    if not isinstance(backend, Backend):
        raise BackendError(
            f"entry point {name!r} ({ep.value}) is not a coremesh Backend",
            rule="it must have name, core_kinds, is_available() and make_kernel()",
            fix="point the entry point at a Backend object or class",
        )
    return backend


def available_backends() -> tuple[str, ...]:
    """Names of every registered backend (not imported yet)."""
    return tuple(sorted(_entry_points()))


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; loud if it is missing or cannot run here."""
    if name not in _entry_points():
        have = ", ".join(available_backends()) or "none"
        raise BackendError(
            f"no coremesh backend named {name!r}",
            rule=f"installed backends: {have}",
            fix=f"pip install coremesh-{name}",
        )
    backend = _load(name)
    if not backend.is_available():
        raise BackendError(
            f"backend {name!r} is installed but cannot run in this process",
            rule="is_available() returned False",
            fix="check its README for what it needs (jax with Pallas TPU support)",
        )
    return backend


_preferred: contextvars.ContextVar[tuple[Backend, ...]] = contextvars.ContextVar(
    "coremesh_preferred_backends", default=()
)


@contextlib.contextmanager
def using_backend(backend: str | Backend) -> Iterator[Backend]:
    """Build kernels of ``backend``'s kinds with it inside the block (innermost wins).

    Every kernel goes through ``backend_for``, so this reroutes user kernels and the ops'
    kernels alike: e.g. a second TensorCore backend installed beside ``coremesh-tensorcore``.
    """
    chosen = get_backend(backend) if isinstance(backend, str) else backend
    if not isinstance(chosen, Backend):
        raise BackendError(
            f"{backend!r} is not a coremesh Backend",
            rule="it must have name, core_kinds, is_available() and make_kernel()",
            fix="pass a backend name from available_backends() or a Backend object",
        )
    token = _preferred.set((chosen, *_preferred.get()))
    try:
        yield chosen
    finally:
        _preferred.reset(token)


def backend_for(kind: CoreKind) -> Backend:
    """The backend that serves meshes of ``kind``; warns when several could."""
    for chosen in _preferred.get():
        if kind in chosen.core_kinds:
            return chosen
    candidates = [n for n in available_backends() if kind in _load(n).core_kinds]
    usable = [n for n in candidates if _load(n).is_available()]
    if not usable:
        raise BackendError(
            f"no installed backend serves {kind.value} meshes",
            rule=f"backends found: {', '.join(available_backends()) or 'none'}",
            fix="pip install coremesh-tensorcore (TensorCore) or coremesh-sparsecore (SparseCore)",
        )
    if len(usable) > 1:
        warnings.warn(
            f"several backends serve {kind.value} meshes ({', '.join(usable)}); using "
            f"{usable[0]!r}. Ask for one with coremesh.core.get_backend(name).",
            CoremeshWarning,
            stacklevel=3,
        )
    return _load(usable[0])


def refresh() -> None:
    """Forget what was discovered (after installing a backend into a running process)."""
    _entry_points.cache_clear()
    _load.cache_clear()
