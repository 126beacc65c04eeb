"""Errors the simulator raises on top of coremesh's hierarchy.

They are raised in place of the generic ``JaxRuntimeError`` a failing interpreted kernel would
surface with, so a test can ``pytest.raises(SimulationDeadlock)`` and a user reads what blocked
where instead of an XLA callback traceback.
"""

from __future__ import annotations

from jax._src.pallas.mosaic.error_handling import MosaicError
from jax.errors import JaxRuntimeError

from coremesh.core.errors import CapacityError, CoremeshError, DeadlockError


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


class CompilerParamsError(CoremeshError, ValueError):
    """A kernel's ``compiler_params`` that the TPU lowering rejects, refused before it runs.

    Also a ``ValueError``, as jax's own (JAX's tests expect that type).
    """


class LoweringRefusalError(CoremeshError, ValueError):
    """A kernel Mosaic's lowering refuses with a ``ValueError``, refused before it runs, with
    Mosaic's words (and its exception type, which code written for the chip catches)."""


class KernelCapacityError(CapacityError, JaxRuntimeError):  # type: ignore[misc]
    """A kernel's buffers over the chip's VMEM or SMEM, refused before it runs.

    Also a ``JaxRuntimeError``: on a TPU the compile fails with one, and code written for the chip
    (JAX's own tests do) expects it.
    """

    def __str__(self) -> str:  # JaxRuntimeError's own reads a field its __init__ would set
        return self._format()


class MosaicRefusalError(CoremeshError, MosaicError):  # type: ignore[misc]
    """A kernel Mosaic's compiler refuses, refused before it runs, with Mosaic's words.

    Also a ``MosaicError``: code that expects the compiler's rejection on a TPU (JAX's own tests
    do) gets it from the simulator too.
    """


class NotSimulatedError(CoremeshError, NotImplementedError):
    """The program uses something the CPU simulator cannot reproduce faithfully.

    Raised instead of running it, so a result is never silently wrong.
    """


#: Why a NotSimulatedError refuses instead of running.
NOT_SIMULATED_RULE = (
    "the CPU simulator refuses what it cannot reproduce instead of returning a result that may "
    "be wrong"
)
#: Where such a kernel can be checked instead.
ELSEWHERE = (
    "check this kernel with the compile-only target (coremesh.testing.aot) or on TPU hardware"
)


def not_simulated(what: str, *, chip: str | None, instead: str | None = None) -> NotSimulatedError:
    """The refusal of ``what`` (a sentence ending in "is not simulated: why"): the shared rule,
    and as the fix ``instead`` (how to write it so it simulates), then where to check it as is."""
    fix = ELSEWHERE if instead is None else f"{instead}; or {ELSEWHERE}"
    return NotSimulatedError(what, rule=NOT_SIMULATED_RULE, chip=chip, fix=fix)


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


class SimulationFault(CoremeshError, JaxRuntimeError):  # type: ignore[misc]  # noqa: N818
    """An operation inside a simulated kernel failed (an index out of bounds, a DMA to a device
    that does not exist, a copy between refs of different shapes, ...).

    On a chip most of these corrupt memory or hang; the simulator stops the run and raises this
    from the call in place of the ``JaxRuntimeError`` stock interpret mode raises. It is still a
    ``JaxRuntimeError``, so code written for a failing call on TPU (and JAX's own tests, e.g.
    ``test_core_map_exception_no_hang``) catches it. ``device``, ``core``, ``kernel``,
    ``location`` (the user's ``file:line``), ``operation``, ``buffer`` and ``index`` say where;
    ``blocked`` lists the waits of other cores the fault left blocked. ``__cause__`` is the
    interpreter's own exception, with its traceback.
    """

    def __init__(
        self,
        what: str,
        *,
        device: int | None,
        core: int | None,
        kernel: str | None,
        location: str | None,
        operation: str,
        buffer: str | None = None,
        index: str | None = None,
        rule: str | None = None,
        chip: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.device = device
        self.core = core
        self.kernel = kernel
        self.location = location
        self.operation = operation
        self.buffer = buffer
        self.index = index
        self.blocked: tuple[str, ...] = ()
        super().__init__(what, rule=rule, chip=chip, fix=fix)

    def add_blocked(self, wait: str) -> None:
        """Note a wait of another core that the fault stopped (listed after the fault); a
        core is in one wait at a time, so its first description (``"device d, core c: ..."``)
        stands."""
        core = wait.partition(":")[0]
        if all(b.partition(":")[0] != core for b in self.blocked):
            self.blocked = (*self.blocked, wait)
            self.args = (self._format(),)

    def _format(self) -> str:
        text = super()._format()
        blocked = getattr(self, "blocked", ())
        return text + "".join(f"\n  left blocked: {w}" for w in blocked)

    def __str__(self) -> str:
        return self._format()


class UninitializedReadError(SimulationFault):
    """A kernel loaded, or a DMA read, memory that nothing wrote (``simulate()`` tracks a
    "written" map per fresh buffer, :mod:`coremesh.testing.sim.shadow`). On the chip those bytes
    are whatever the memory held before; stock interpret mode returns NaN in silence."""


class UnfinishedKernelError(CoremeshError, RuntimeError):
    """A kernel ended with work outstanding: a semaphore above zero or a DMA never waited.

    The chip refuses to finish such a kernel (its semaphores must be zero at exit), and the data
    of a DMA nobody waited for is undefined.
    """
