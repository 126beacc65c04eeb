"""The scratch buffers and semaphores a collective needs, declared once and bound by name.

A remote DMA writes into the *same* buffer of its peer that the sender names locally, so every
participant must allocate identical scratch in the same order. A :class:`ScratchSpec` lists
what a block needs; a caller either adds ``spec.types`` to its kernel's scratch and passes
``spec.bind(refs)`` to the block, or lets the block allocate it with ``pl.run_scoped``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from coremesh.core import CoremeshError
from coremesh.core.capacity import nbytes


@dataclasses.dataclass(frozen=True)
class ScratchSpec:
    """Named scratch entries (``pltpu.VMEM(...)``, ``pltpu.SemaphoreType...``), in order."""

    entries: tuple[tuple[str, Any], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.entries)

    @property
    def types(self) -> list[Any]:
        """The scratch types, for ``scratch_types=`` / ``pl.run_scoped``."""
        return [t for _, t in self.entries]

    def __len__(self) -> int:
        return len(self.entries)

    def __add__(self, other: ScratchSpec) -> ScratchSpec:
        clash = set(self.names) & set(other.names)
        if clash:
            raise CoremeshError(
                f"scratch entries {sorted(clash)} are declared twice",
                rule="each scratch entry of a kernel has its own name",
                fix="prefix the specs of different collectives (ScratchSpec.prefixed)",
            )
        return ScratchSpec(self.entries + other.entries)

    def prefixed(self, prefix: str) -> ScratchSpec:
        return ScratchSpec(tuple((f"{prefix}{n}", t) for n, t in self.entries))

    def vmem_bytes(self) -> int:
        """Bytes of VMEM the buffers take (semaphores excluded)."""
        total = 0
        for _, t in self.entries:
            shape, dtype = getattr(t, "shape", None), getattr(t, "dtype", None)
            if (
                shape is not None
                and dtype is not None
                and "vmem" in str(getattr(t, "memory_space", "")).lower()
            ):
                total += nbytes(shape, dtype)
        return total

    def bind(self, refs: Sequence[Any]) -> Scratch:
        """The allocated refs, in the order of ``types``, as a :class:`Scratch`."""
        if len(refs) != len(self.entries):
            raise CoremeshError(
                f"{len(refs)} scratch refs for a spec of {len(self.entries)} entries "
                f"({', '.join(self.names)})",
                rule="bind() takes exactly the refs allocated for spec.types, in order",
                fix="pass the refs of spec.types (and only those) to bind()",
            )
        return Scratch(dict(zip(self.names, refs, strict=True)))

    def run_scoped(self, body: Callable[[Scratch], None]) -> None:
        """Allocate the scratch for the duration of ``body`` (inside a kernel body)."""
        from jax.experimental import pallas as pl

        if not self.entries:
            body(Scratch({}))
            return
        pl.run_scoped(lambda *refs: body(self.bind(refs)), *self.types)


@dataclasses.dataclass(frozen=True)
class Scratch(Mapping[str, Any]):
    """Allocated scratch refs by name; ``scratch.sub("fwd.")`` views one prefix."""

    refs: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        try:
            return self.refs[name]
        except KeyError:
            raise CoremeshError(
                f"scratch has no entry {name!r} (it has {', '.join(self.refs) or 'none'})",
                rule="a block's scratch comes from the ScratchSpec the block asked for",
                fix="allocate the spec returned by the matching scratch_for(...) call",
            ) from None

    def get(self, name: str, default: Any = None) -> Any:
        return self.refs.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self.refs

    def __iter__(self) -> Iterator[str]:
        return iter(self.refs)

    def __len__(self) -> int:
        return len(self.refs)

    def sub(self, prefix: str) -> Scratch:
        return Scratch({n[len(prefix) :]: r for n, r in self.refs.items() if n.startswith(prefix)})
