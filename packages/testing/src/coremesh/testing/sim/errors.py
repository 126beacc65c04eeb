"""Errors the simulator raises on top of coremesh's hierarchy.

They are raised in place of the generic ``JaxRuntimeError`` a failing interpreted kernel would
surface with, so a test can ``pytest.raises(SimulationDeadlock)`` and a user reads what blocked
where instead of an XLA callback traceback.
"""

from __future__ import annotations

from coremesh.core.errors import CoremeshError, DeadlockError


class SimulationDeadlock(DeadlockError):  # noqa: N818  (the name the project's API uses)
    """A simulated core waits on a semaphore that no core or DMA will signal.

    ``device``, ``core``, ``semaphore``, ``count`` and ``needed`` describe the wait that hit the
    deadline; ``blocked`` lists every wait that was pending at that moment, as text.
    """

    def __init__(
        self,
        what: str,
        *,
        device: int,
        core: int,
        semaphore: str,
        count: int,
        needed: int,
        blocked: tuple[str, ...] = (),
        rule: str | None = None,
        chip: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.device = device
        self.core = core
        self.semaphore = semaphore
        self.count = count
        self.needed = needed
        self.blocked = blocked
        super().__init__(what, rule=rule, chip=chip, fix=fix)


class NotSimulatedError(CoremeshError, NotImplementedError):
    """The program uses something the CPU simulator cannot reproduce faithfully.

    Raised instead of running it, so a result is never silently wrong.
    """


class SimulationRaceError(CoremeshError, AssertionError):
    """The race detector found unsynchronised accesses to one buffer from two cores or DMAs."""


def race_error(found: list[str], chip: str | None) -> SimulationRaceError:
    """The error for the races found in ``found`` (one entry per kernel run or race)."""
    return SimulationRaceError(
        f"data race(s) detected in {len(found)} kernel run(s) ({'; '.join(found)}); each race "
        "was reported as 'RACE DETECTED' with the buffer, the ranges and the source lines",
        rule="two cores or DMAs touched overlapping memory, at least one writing, with no "
        "semaphore wait ordering them",
        chip=chip,
        fix="order the accesses with a semaphore signal/wait (or a DMA wait), give each core a "
        "disjoint slice, or use a semaphore per pipeline step",
    )
