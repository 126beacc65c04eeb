"""The simulated chip: the one record of what the simulator answers for, and which one is active.

A :class:`~coremesh.testing.sim.simulator.Simulator` builds one :class:`SimulatedChip` and keeps
it. Its interpret parameters carry that object (so jax's caches key on it), and while the
simulator's context is open it is the active slice here, where the patches (``get_tpu_info``,
``jax.devices()``, mesh checks) and the deadlock watchdog read the chip from. Nothing copies it.

The active slices form a process-wide stack, as the patches and the interpreter state are
process-wide: interpreter callbacks run on threads other than the one that entered the context,
so a context variable would not reach them.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Protocol

from coremesh.core.chips import Chip


@dataclasses.dataclass(frozen=True, eq=False)
class SimulatedChip:
    """A chip in one core mode, with jax's ``TpuInfo`` for it.

    Equal and hashed by chip name and core count: it keys jax's trace and compile caches through
    the interpret parameters, so a program traced for one chip is never reused for another.
    """

    chip: Chip
    cores_per_device: int
    tpu_info: Any  # jax's TpuInfo for the chip in this core mode

    @property
    def name(self) -> str:
        return self.chip.name

    @property
    def has_sparsecore(self) -> bool:
        return self.tpu_info.sparse_core is not None

    def _key(self) -> tuple[str, int]:
        return (self.chip.name, self.cores_per_device)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimulatedChip) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


class ActiveSlice(Protocol):
    """What the patches read from the simulator whose context is open."""

    @property
    def simulated_chip(self) -> SimulatedChip: ...

    @property
    def devices(self) -> tuple[Any, ...]: ...

    @property
    def interpret_params(self) -> Any: ...


_lock = threading.Lock()
_active: list[ActiveSlice] = []


def enter(slice_: ActiveSlice) -> None:
    """Make ``slice_`` the innermost active slice (the simulator's context opens)."""
    with _lock:
        _active.append(slice_)


def leave() -> None:
    """Drop the innermost active slice (the simulator's context closes)."""
    with _lock:
        _active.pop()


def active_slice() -> ActiveSlice | None:
    """The innermost open simulator, or None outside every ``simulate()`` context."""
    return _active[-1] if _active else None


def current() -> SimulatedChip:
    """The chip of the innermost open simulator (the patches run only inside one)."""
    return _active[-1].simulated_chip


def current_name() -> str | None:
    """The name of the innermost simulated chip, or None outside every context (for errors)."""
    slice_ = active_slice()
    return slice_.simulated_chip.name if slice_ is not None else None
