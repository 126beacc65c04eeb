"""``explore()``: run a kernel under many DMA schedules and report the first that disagrees.

A chip may complete a kernel's DMAs in any order the semaphores allow, so a kernel that is right
under the order one run happens to take can be wrong on the next. :func:`explore` runs ``fn`` on
the active simulator under ``schedules`` orders (:func:`coremesh.testing.sim.schedule.schedules`:
issue order first, the reference, then in-order and newest-first waits, then seeded random
orders) and reports the first whose result differs from the reference's or that raises, with the
schedule that reproduces it and the waits that were overtaken in that run (see
:mod:`coremesh.testing.sim.schedule`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from coremesh.core.errors import CoremeshError
from coremesh.core.targets import current_target
from coremesh.testing.sim import schedule as sched
from coremesh.testing.sim.schedule import OvertakenWait, Schedule
from coremesh.testing.sim.simulator import Simulator

#: Most schedules one exploration runs (each is a full run of the kernel).
MAX_SCHEDULES = 4096


class ScheduleDependenceError(CoremeshError, AssertionError):
    """A kernel's result depends on the order its DMAs complete in."""


@dataclasses.dataclass(frozen=True)
class Difference:
    """Where one schedule's output differs from the reference's."""

    output: str
    count: int
    size: int
    first_index: tuple[int, ...] | None
    value: Any
    reference: Any
    max_abs_diff: float | None
    detail: str = ""
    #: elements NaN here where the reference has a number (unwritten memory, usually)
    nans: int = 0

    def describe(self) -> str:
        if self.detail:
            return f"output {self.output}: {self.detail}"
        at = (
            f"; first at {self.first_index}: {self.value!r}, reference {self.reference!r}"
            if self.first_index is not None
            else ""
        )
        worst = (
            f"; max abs difference {self.max_abs_diff:g}" if self.max_abs_diff is not None else ""
        )
        nans = f" ({self.nans} NaN where the reference has a number)" if self.nans else ""
        return f"output {self.output}: {self.count} of {self.size} elements differ{nans}{at}{worst}"


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first schedule whose run disagreed with the reference's."""

    schedule: Schedule
    reference: Schedule
    error: BaseException | None = None
    difference: Difference | None = None
    overtaken: tuple[OvertakenWait, ...] = ()

    def describe(self) -> str:
        if self.error is not None:
            first = str(self.error).strip().splitlines() or [type(self.error).__name__]
            what = f"schedule {self.schedule} raised {type(self.error).__name__}: {first[0]}"
        else:
            assert self.difference is not None
            what = (
                f"schedule {self.schedule} differs from {self.reference} (the reference): "
                + self.difference.describe()
            )
        lines = [what, f"  reproduce: simulate(..., schedule={self.schedule.spelled()})"]
        if self.overtaken:
            lines.append(
                "  waits that returned before an earlier DMA on their semaphore finished (the "
                "completion order the kernel relies on):"
            )
            lines += [f"    {w.describe()}" for w in self.overtaken]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Exploration:
    """What :func:`explore` found: the schedules run and the first divergence, if any."""

    name: str
    schedules: tuple[Schedule, ...]
    divergence: Divergence | None
    chip: str | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    @property
    def run(self) -> int:
        """How many schedules ran (exploring stops at the first divergence)."""
        return len(self.schedules)

    def check(self) -> None:
        """Raise :class:`ScheduleDependenceError` if a schedule disagreed."""
        if self.divergence is None:
            return
        raise ScheduleDependenceError(
            f"{self.name}'s result depends on the order its DMAs complete in: "
            + self.divergence.describe(),
            rule="a DMA wait returns once its semaphore has counted the DMA's bytes, from "
            "whichever DMA sent them; a chip completes DMAs in any order, so a kernel must be "
            "right under every order its waits allow",
            chip=self.chip,
            fix="give each DMA whose data is read next its own semaphore, or wait for all the "
            "DMAs on a shared semaphore before reading any of their destinations",
        )

    def __str__(self) -> str:
        head = f"explored {self.run} DMA schedule(s) of {self.name}"
        if self.divergence is None:
            return f"{head}: every result matches {self.schedules[0]}'s"
        return f"{head}: " + self.divergence.describe()


def explore(
    fn: Callable[..., Any],
    *args: Any,
    schedules: int = 16,
    seed: int = 0,
    atol: float = 0.0,
    rtol: float = 0.0,
    **kwargs: Any,
) -> Exploration:
    """Run ``fn(*args, **kwargs)`` under ``schedules`` DMA schedules on the active simulator.

    The first schedule (every DMA completing when it starts, in issue order) is the reference;
    exploring stops at the first schedule whose outputs differ from it (beyond ``atol`` /
    ``rtol``; NaN equals NaN) or that raises. Random schedules use seeds ``seed``, ``seed + 1``,
    ...: the report's schedule, passed to ``simulate(schedule=...)``, reproduces the run. A
    deadlock under a schedule is reported, not waited out: the simulator's ``deadline`` holds.
    """
    sim = _simulator()
    count: object = schedules
    if not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= MAX_SCHEDULES):
        raise CoremeshError(
            f"schedules={schedules!r}",
            rule=f"explore runs 1 to {MAX_SCHEDULES} schedules",
            fix="pass schedules=8 in tests, 64 for a thorough search",
        )
    order = sched.schedules(schedules, Schedule.random(seed).seed)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    chip = sim.chip.name
    reference: list[tuple[str, np.ndarray]] = []
    for i, schedule in enumerate(order):
        sched.OVERTAKEN.drain()
        try:
            with sched.using(schedule):
                out = sim.run(fn, *args, **kwargs)
        except Exception as err:
            found = Divergence(schedule, order[0], error=err, overtaken=sched.OVERTAKEN.drain())
            return Exploration(name, order[: i + 1], found, chip)
        leaves = _leaves(out)
        if i == 0:
            reference = leaves
            continue
        diff = _compare(reference, leaves, atol, rtol)
        if diff is not None:
            found = Divergence(
                schedule, order[0], difference=diff, overtaken=sched.OVERTAKEN.drain()
            )
            return Exploration(name, order[: i + 1], found, chip)
    sched.OVERTAKEN.drain()
    return Exploration(name, order, None, chip)


def _simulator() -> Simulator:
    try:
        target: object = current_target()
    except CoremeshError:
        target = None
    if not isinstance(target, Simulator):
        active = type(target).__name__ if target is not None else "none"
        raise CoremeshError(
            f"explore() runs on the simulator; the active target is {active}",
            rule="DMA schedules are the simulator's: a chip picks its own order",
            fix="call explore() inside `with coremesh.testing.simulate(...):`",
        )
    if target.interpret_params.dma_execution_mode != "on_wait":
        raise CoremeshError(
            "explore() inside simulate(dma_execution_mode='eager')",
            rule="eager mode completes every DMA when it starts, which leaves no order to explore",
            fix="explore inside simulate() with the default dma_execution_mode",
        )
    if "dma_schedule" not in _enabled():
        raise CoremeshError(
            "explore() with the dma_schedule patch disabled",
            rule="the dma_schedule patch is what runs DMAs in each schedule's order",
            fix="drop 'dma_schedule' from simulate(disable_patches=...)",
        )
    return target


def _enabled() -> frozenset[str]:
    from coremesh.testing.sim import patches

    return patches.enabled()


def _leaves(out: Any) -> list[tuple[str, np.ndarray]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(out)
    return [(jax.tree_util.keystr(path) or "[0]", np.asarray(leaf)) for path, leaf in flat]


def _compare(
    want: list[tuple[str, np.ndarray]], got: list[tuple[str, np.ndarray]], atol: float, rtol: float
) -> Difference | None:
    if [p for p, _ in want] != [p for p, _ in got]:
        return Difference(
            "structure", 0, 0, None, None, None, None, detail="outputs differ in structure"
        )
    for (path, a), (_, b) in zip(want, got, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            detail = f"{b.dtype}{list(b.shape)}, reference {a.dtype}{list(a.shape)}"
            return Difference(path, a.size, a.size, None, None, None, None, detail=detail)
        if np.issubdtype(a.dtype, np.inexact):
            close = np.isclose(a, b, atol=atol, rtol=rtol, equal_nan=True)
        else:
            close = a == b
        if close.all():
            continue
        bad = np.argwhere(~close)
        first = tuple(int(i) for i in bad[0]) if a.ndim else ()
        worst = nans = None
        if np.issubdtype(a.dtype, np.number):
            delta = np.abs(a.astype(np.float64) - b.astype(np.float64))[~close]
            finite = delta[np.isfinite(delta)]
            worst = float(finite.max()) if finite.size else None
        if np.issubdtype(a.dtype, np.inexact):
            nans = int((np.isnan(b) & ~np.isnan(a)).sum())
        return Difference(
            path,
            int((~close).sum()),
            int(a.size),
            first,
            b[first].item(),
            a[first].item(),
            worst,
            nans=nans or 0,
        )
    return None
