"""Deadline watchdog: a semaphore wait that can never finish becomes :class:`SimulationDeadlock`.

The interpreter waits for a semaphore by polling it forever, so a kernel that waits for a signal
nobody sends hangs the process. The simulator's semaphore wait reports to this watchdog. A wait is
declared a deadlock once it has lasted ``deadline`` seconds *and* no interpreter callback has
started anywhere during that time: nothing that could still signal it is making progress. The
error names the waiting device, core and semaphore with its count, and lists every other pending
wait, which is usually the other half of the cycle.

The watchdog is process-wide, like the interpreter state it watches; the chip its errors name is
the active simulator's (:mod:`coremesh.testing.sim.chip`). It also carries the first
simulator failure of a run (deadlock, bad index) across XLA, which turns exceptions raised in host
callbacks into a generic ``JaxRuntimeError``; the simulator re-raises the recorded error.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Any

from coremesh.testing.sim.chip import current_name
from coremesh.testing.sim.errors import SimulationDeadlock, SimulationFault

DEFAULT_DEADLINE_S = 20.0


@dataclasses.dataclass
class Wait:
    """One pending semaphore wait of one simulated core."""

    device: int
    core: int
    semaphore: str
    needed: int
    since: float
    count: int = 0

    def describe(self) -> str:
        return (
            f"device {self.device}, core {self.core}: {self.semaphore}, count {self.count}, "
            f"waiting for {self.needed}"
        )


class Watchdog:
    """Tracks pending waits and interpreter progress; decides when a wait is a deadlock."""

    def __init__(self) -> None:
        self.deadline = DEFAULT_DEADLINE_S
        self._lock = threading.Lock()
        self._waits: dict[int, Wait] = {}
        self._keys = itertools.count()
        self._last_progress = time.monotonic()
        self._failure: Exception | None = None
        #: (device, core, wait) of waits a failure stopped, in this run
        self._stopped: list[tuple[int | None, int | None, str]] = []

    # Progress ---------------------------------------------------------------------------

    def progress(self) -> None:
        """Something ran that may signal a semaphore (called on every interpreter callback)."""
        self._last_progress = time.monotonic()

    # Waits ------------------------------------------------------------------------------

    def begin_wait(self, device: int, core: int, semaphore: str, needed: int) -> int:
        key = next(self._keys)
        with self._lock:
            self._waits[key] = Wait(device, core, semaphore, needed, time.monotonic())
        return key

    def end_wait(self, key: int) -> None:
        with self._lock:
            self._waits.pop(key, None)

    def abandon(self, key: int) -> None:
        """The wait ``key`` was aborted: list it after the fault that stopped it, if any."""
        with self._lock:
            wait = self._waits.get(key)
        if wait is not None:
            self.stopped(wait.device, wait.core, wait.describe())

    def stopped(self, device: int | None, core: int | None, text: str) -> None:
        """A core's wait was stopped by a failure: listed after the fault (it may not be
        recorded yet; :meth:`record` adds the ones noted before it)."""
        with self._lock:
            self._stopped.append((device, core, text))
            failure = self._failure
        if isinstance(failure, SimulationFault) and (device, core) != (
            failure.device,
            failure.core,
        ):
            failure.add_blocked(text)

    def check(self, key: int, count: int) -> None:
        """Raise :class:`SimulationDeadlock` if the wait ``key`` can no longer finish; stop it
        at once if a fault was recorded (the run is over, and the fault is its error)."""
        if self._failure is not None:
            raise RuntimeError("stopped: another simulated core failed")
        now = time.monotonic()
        with self._lock:
            wait = self._waits[key]
            wait.count = count
            if now - max(wait.since, self._last_progress) < self.deadline:
                return
            others = tuple(w.describe() for k, w in self._waits.items() if k != key)
        err = SimulationDeadlock(
            f"deadlock: device {wait.device}, core {wait.core} waits on {wait.semaphore} for a "
            f"count of {wait.needed}; its count is {count} and nothing has run that could "
            f"signal it for {self.deadline:g} s"
            + ("".join(f"\n  also blocked: {o}" for o in others) if others else ""),
            device=wait.device,
            core=wait.core,
            semaphore=wait.semaphore,
            count=count,
            needed=wait.needed,
            blocked=others,
            rule="every semaphore_wait needs matching semaphore_signal calls or DMA completions "
            "on the same device and core",
            chip=current_name(),
            fix="check the device_id / core_index of the matching signal or remote copy, and "
            "that every core reaches it; if the kernel really waits longer, pass a larger "
            "deadline= to simulate()",
        )
        self.record(err)
        raise err

    def pending(self) -> tuple[Wait, ...]:
        with self._lock:
            return tuple(self._waits.values())

    # Failures ---------------------------------------------------------------------------

    def record(self, err: Exception) -> None:
        """Remember the first simulator failure of the current run."""
        with self._lock:
            if self._failure is None:
                self._failure = err
                if isinstance(err, SimulationFault):
                    for device, core, text in self._stopped:
                        if (device, core) != (err.device, err.core):
                            err.add_blocked(text)

    def take(self) -> Exception | None:
        with self._lock:
            err, self._failure = self._failure, None
            self._stopped.clear()
            return err

    def reset(self) -> None:
        with self._lock:
            self._waits.clear()
            self._stopped.clear()
            self._failure = None
        self.progress()


def semaphore_description(sem: Any, core: int | None = None) -> str:
    """How errors name one of the interpreter's semaphores (``core``: the core waiting on it)."""
    from coremesh.testing.sim import subcore_barrier

    fixed = sem.shared_memory.fixed_id_sem
    if fixed.get(sem.id) is sem:
        barrier = subcore_barrier.describe(int(sem.id), core)
        if barrier is not None:
            return barrier
    if fixed.get(sem.id) is sem:
        return f"the barrier semaphore (collective_id={sem.id})"
    return f"semaphore #{sem.id - 2000} of the kernel (id {sem.id})"


WATCHDOG = Watchdog()
