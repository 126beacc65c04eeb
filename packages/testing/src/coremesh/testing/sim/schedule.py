"""DMA schedules: the order in which the simulator completes DMAs, chosen by a seeded policy.

A chip completes DMAs when the hardware finishes them, not in program order, and a DMA
semaphore only counts bytes: a wait for one DMA returns as soon as enough bytes have arrived on
its semaphore, from whichever DMA. A kernel that is right under one completion order and wrong
under another has a bug the chip may or may not show. The interpreter runs each DMA at one fixed
point (``'eager'``: when it starts; ``'on_wait'``: when a wait needs it, the newest first); a
:class:`Schedule` chooses instead:

* ``"on_wait"``: the interpreter's own order (the newest pending DMA of a semaphore first);
* ``"eager"``: every DMA completes when it starts (issue order, as ``'eager'`` mode);
* ``"in_order"``: at a wait, the oldest pending DMA first;
* ``"random"`` with a seed: each DMA completes at its start, when a wait needs it, or after one to
  four further DMA starts or waits of the core that issued it; a wait needing one takes the
  pending DMAs of its semaphore in a seeded order.

Every choice is a hash of (seed, issuing device, core, its n-th DMA in the kernel), so a seed
fixes the schedule of each core's own DMAs; which of two devices first reaches a shared DMA can
still vary with thread timing. The signals DMAs send are the ones reordered; a signal sent with
``pl.semaphore_signal`` arrives at once under every policy. Pallas keeps the two apart (signal and
wait refuse a DMA semaphore at trace time, on every jax line), so a later-arriving signal could only
make its waiter wait longer: the waiter's own DMAs and operations, and so its result, stay the same,
except through a race between cores, which ``races=True`` finds.

While a schedule is active, the simulator also notes each *overtaken wait*: a DMA wait that
returned while a DMA its issuer started earlier on the same semaphore was still in flight, i.e.
the wait was satisfied by a later DMA's bytes. A kernel whose result changes with the schedule
usually relies on that wait finishing in issue order; :mod:`coremesh.testing.explore` names it.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from coremesh.core.errors import CoremeshError

POLICIES = ("on_wait", "eager", "in_order", "random")

_MASK = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A DMA completion policy and its seed (the seed matters to ``"random"`` only)."""

    policy: str = "on_wait"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise CoremeshError(
                f"Schedule(policy={self.policy!r})",
                rule=f"a DMA schedule's policy is one of {', '.join(map(repr, POLICIES))}",
                fix="pass e.g. Schedule('random', seed=3) or Schedule('in_order')",
            )
        seed: object = self.seed
        if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= _MASK):
            raise CoremeshError(
                f"Schedule(seed={self.seed!r})",
                rule="a schedule's seed is an integer in [0, 2**64)",
                fix="pass seed=0, 1, ...",
            )

    @classmethod
    def random(cls, seed: int) -> Schedule:
        return cls("random", seed)

    def __str__(self) -> str:
        return f"random(seed={self.seed})" if self.policy == "random" else self.policy

    def spelled(self) -> str:
        """How to pass this schedule to ``simulate(schedule=...)``."""
        if self.policy == "random":
            return f"Schedule('random', seed={self.seed})"
        return f"Schedule({self.policy!r})"


def schedules(n: int, seed: int = 0) -> tuple[Schedule, ...]:
    """The first ``n`` schedules :func:`coremesh.testing.explore` runs: the three fixed orders
    (issue order first, the reference), then ``random`` with seeds ``seed``, ``seed + 1``, ..."""
    fixed = (Schedule("eager"), Schedule("in_order"), Schedule("on_wait"))
    return (fixed + tuple(Schedule.random(seed + i) for i in range(max(0, n - 3))))[:n]


# ------------------------------------------------------------------------ the active schedule

_active: list[Schedule | None] = [None]


def active() -> Schedule | None:
    return _active[-1]


@contextmanager
def using(schedule: Schedule | None) -> Iterator[None]:
    """Run the kernels called inside under ``schedule`` (None: the interpreter's own mode)."""
    _active.append(schedule)
    try:
        yield
    finally:
        _active.pop()


# ------------------------------------------------------------------------ overtaken waits


@dataclasses.dataclass(frozen=True)
class OvertakenWait:
    """A DMA wait that returned while an earlier DMA of the same issuer on its semaphore had not
    finished: the wait was satisfied by a later DMA's bytes."""

    device: int
    core: int
    semaphore: str
    wait_at: str | None
    issuer: tuple[int, int]
    started_at: str | None

    def describe(self) -> str:
        at = f" at {self.wait_at}" if self.wait_at else ""
        started = f" (started at {self.started_at})" if self.started_at else ""
        return (
            f"device {self.device}, core {self.core}: the DMA wait on {self.semaphore}{at} "
            f"returned while a DMA started earlier on it by device {self.issuer[0]}, core "
            f"{self.issuer[1]}{started} was still in flight"
        )


class _Log:
    """Overtaken waits since the last drain, each kind once (bounded)."""

    def __init__(self, most: int = 256) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[Any, ...], OvertakenWait] = {}
        self._most = most

    def add(self, wait: OvertakenWait) -> None:
        key = (wait.semaphore, wait.wait_at, wait.started_at)
        with self._lock:
            if key not in self._seen and len(self._seen) < self._most:
                self._seen[key] = wait

    def drain(self) -> tuple[OvertakenWait, ...]:
        with self._lock:
            found, self._seen = tuple(self._seen.values()), {}
            return found


OVERTAKEN = _Log()


# ------------------------------------------------------------------------ per-kernel state


def _mix(*parts: int) -> int:
    """A 64-bit hash of ``parts`` (splitmix64 steps), stable across processes."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (p & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 31
    return h


@dataclasses.dataclass
class _Kernel:
    """What the schedule tracks during one kernel (one interpreter shared memory)."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    started: collections.Counter[tuple[int, int]] = dataclasses.field(
        default_factory=collections.Counter
    )
    ops: collections.Counter[tuple[int, int]] = dataclasses.field(
        default_factory=collections.Counter
    )
    #: issuing core -> [(op count at which it completes, priority, DMA)]
    due: dict[tuple[int, int], list[tuple[int, int, Any]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )
    #: (semaphore id, global core id) -> [(DMA, side)] in issue order
    inflight: dict[tuple[int, int], list[tuple[Any, str]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )


_state_lock = threading.Lock()
_ATTR = "_coremesh_schedule"


def _kernel(sm: Any) -> _Kernel:
    state = sm.__dict__.get(_ATTR)
    if state is None:
        with _state_lock:
            state = sm.__dict__.get(_ATTR)
            if state is None:
                state = _Kernel()
                setattr(sm, _ATTR, state)
    return state  # type: ignore[no-any-return]


def _issuer(dma: Any) -> tuple[int, int]:
    return int(dma.src_device_id), int(dma.src_local_core_id)


def _register(sm: Any, schedule: Schedule, dma: Any) -> None:
    """Give a newly started DMA its order, priority and completion point."""
    state = _kernel(sm)
    issuer = _issuer(dma)
    with state.lock:
        n = state.started[issuer]
        state.started[issuer] = n + 1
        state.ops[issuer] += 1
        h = _mix(schedule.seed, issuer[0], issuer[1], n)
        dma._coremesh_order = n
        dma._coremesh_priority = h >> 8
        state.inflight[(dma.dst_sem.id, int(dma.dst_global_core_id))].append((dma, "recv"))
        if dma.src_sem is not None:
            state.inflight[(dma.src_sem.id, int(dma.src_global_core_id))].append((dma, "send"))
        if schedule.policy == "eager":
            when: int | None = 0
        elif schedule.policy == "random":
            pick = h & 7  # 0-1: at start; 2-3: only when waited for; 4-7: 1 to 4 ops later
            when = 0 if pick < 2 else None if pick < 4 else pick - 3
        else:
            when = None
        if when is not None:
            state.due[issuer].append((state.ops[issuer] + when, dma._coremesh_priority, dma))


def _run_due(sm: Any, core: tuple[int, int]) -> None:
    """Complete the DMAs ``core`` issued whose point has come (highest priority first); called
    on that core's thread with no interpreter lock held."""
    state = _kernel(sm)
    with state.lock:
        pending = state.due.get(core)
        if not pending:
            return
        now = state.ops[core]
        ready = sorted((d for d in pending if d[0] <= now), key=lambda d: -d[1])
        if not ready:
            return
        state.due[core] = [d for d in pending if d[0] > now]
    for _, _, dma in ready:
        dma.execute_read_and_write()


def _tick(sm: Any, core: tuple[int, int]) -> None:
    state = _kernel(sm)
    with state.lock:
        state.ops[core] += 1
    _run_due(sm, core)


def _done(dma: Any, side: str) -> bool:
    state = str(dma.state.name)
    return state == "COMPLETED" if side == "recv" else state != "STARTED"


def _note_overtaken(sem: Any, gcid: int, logging_info: Any) -> None:
    """After a DMA wait returned: was an earlier DMA of the same issuer left in flight?"""
    sm = sem.shared_memory
    state = _kernel(sm)
    with state.lock:
        entries = state.inflight.get((sem.id, gcid))
        if not entries:
            return
        finished = [e for e in entries if _done(*e)]
        left = [e for e in entries if not _done(*e)]
        entries[:] = left
    for dma, _ in left:
        issuer, order = _issuer(dma), getattr(dma, "_coremesh_order", -1)
        if any(
            _issuer(d) == issuer and getattr(d, "_coremesh_order", -1) > order for d, _ in finished
        ):
            from coremesh.testing.sim.deadlock import semaphore_description
            from coremesh.testing.sim.faults import user_location

            device, core = divmod(gcid, sm.num_cores_per_device)
            OVERTAKEN.add(
                OvertakenWait(
                    device,
                    core,
                    semaphore_description(sem),
                    user_location(getattr(logging_info, "source_info", None)),
                    issuer,
                    user_location(getattr(dma, "source_info", None)),
                )
            )
            return


# ------------------------------------------------------------------------ the patch


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's semaphore task queue, its DMA task hand-off and its semaphore wait."""
    from jax._src.pallas.mosaic.interpret import shared_memory as memory

    orig_append = memory.SharedMemory.append_semaphore_task
    orig_enqueue = memory.Semaphore.enqueue_task
    orig_wait = memory.Semaphore.wait

    def append_semaphore_task(self: Any, semaphore_id: int, global_core_id: int, task: Any) -> Any:
        # dma_start (on_wait) queues a DMA's parts as tasks on its semaphores (send side
        # first, receive side last); the schedule decides when the DMA completes.
        schedule = active()
        dma = getattr(task, "__self__", None)
        if schedule is None or dma is None or not hasattr(dma, "dst_sem"):
            return orig_append(self, semaphore_id, global_core_id, task)
        if not hasattr(dma, "_coremesh_order"):
            _register(self, schedule, dma)
        out = orig_append(self, semaphore_id, global_core_id, task)
        if getattr(task, "__name__", "") != "execute_read":  # the receive side: the last part
            _run_due(self, _issuer(dma))
        return out

    def enqueue_task(self: Any, task: Any, global_core_id: int) -> Any:
        # A wait that needs a DMA pops the last task of its core's list: keep the list in the
        # order the schedule wants them taken.
        schedule = active()
        if schedule is None or schedule.policy in ("on_wait", "eager"):
            return orig_enqueue(self, task, global_core_id)
        with self.cv:
            tasks = self.tasks[global_core_id]
            if schedule.policy == "in_order":
                tasks.insert(0, task)
            else:
                bisect.insort(tasks, task, key=_priority)
            self.cv.notify_all()
        return None

    def wait(self: Any, value: Any, global_core_id: Any, **kw: Any) -> Any:
        if active() is None:
            return orig_wait(self, value, global_core_id, **kw)
        gcid = int(global_core_id)
        core = divmod(gcid, self.shared_memory.num_cores_per_device)
        _tick(self.shared_memory, (int(core[0]), int(core[1])))
        out = orig_wait(self, value, global_core_id, **kw)
        if kw.get("has_tasks"):
            _note_overtaken(self, gcid, kw.get("logging_info"))
        return out

    return [
        (memory.SharedMemory, "append_semaphore_task", append_semaphore_task),
        (memory.Semaphore, "enqueue_task", enqueue_task),
        (memory.Semaphore, "wait", wait),
    ]


def _priority(task: Any) -> int:
    return int(getattr(getattr(task, "__self__", None), "_coremesh_priority", 0))
