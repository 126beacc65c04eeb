"""``simulate()``: run unchanged Pallas TPU programs on the CPU as a chosen TPU slice.

Inside the context, kernels traced by ``pl.core_map``, ``pl.kernel`` and ``pl.pallas_call`` run in
Pallas' TPU interpret mode (``pltpu.force_tpu_interpret_mode``) with the simulator's fixes
(:mod:`coremesh.testing.sim.patches`), ``pltpu.get_tpu_info()`` and
``pltpu.create_tensorcore_mesh(axis)`` (``pltpu.TensorCoreMesh(axis_name=axis)`` from jax 0.11)
answer for the simulated chip, ``jax.devices()`` lists the simulated devices (host CPU devices),
and ``coremesh.core.current_target()`` is the simulator. Memory is tiled as the chip's is: a ref's
last (8, 128) tiles are whole, and a DMA into their padding is in bounds (the interpreter's
``buffer_bounds="padded"``; the padding counts as unwritten, :mod:`.shadow`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection
from types import TracebackType
from typing import Any, Literal

import jax
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
from jax._src.pallas.mosaic.interpret.params import InterpretParams
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.core.chips import Chip, get_chip
from coremesh.core.errors import CoremeshError, MeshError
from coremesh.core.targets import auto_mesh, using_target
from coremesh.testing.sim import fast_path as fast_path_module
from coremesh.testing.sim import patches, schedule
from coremesh.testing.sim.chip import SimulatedChip
from coremesh.testing.sim.deadlock import DEFAULT_DEADLINE_S, WATCHDOG
from coremesh.testing.sim.devices import configure_host_devices, cpu_devices
from coremesh.testing.sim.errors import race_error
from coremesh.testing.sim.refusals import check_devices
from coremesh.testing.sim.schedule import Schedule

DmaMode = Literal["on_wait", "eager"]

#: coremesh chip name -> the name of jax's chip version.
_CHIP_VERSIONS = {
    "v4": "TPU_V4",
    "v5e": "TPU_V5E",
    "v5p": "TPU_V5P",
    "v6e": "TPU_V6E",
    "TPU7x": "TPU_7X",
}

#: Longest deadline accepted: a test must fail, not hang.
MAX_DEADLINE_S = 600.0


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_flag(name: str, value: object, rule: str) -> None:
    """Refuse a non-bool for an on/off option (``"yes"`` or ``1`` would read as on)."""
    if not isinstance(value, bool):
        raise CoremeshError(f"{name}={value!r}", rule=rule, fix=f"pass {name}=True or False")


def _is_seconds(value: object, most: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= most


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimParams(InterpretParams):  # type: ignore[misc]
    """Interpret-mode parameters that also carry the simulator's chip (the same object).

    jax keys its trace and compile caches on the interpret parameters, so a program traced for
    one chip is never reused for another.
    """

    chip: SimulatedChip | None = None
    #: the patches left out: a program traced with a check is not reused without it
    patches_off: frozenset[str] = frozenset()
    #: why no kernel runs compiled ("": the fast path is on; see ``fast_path``)
    fast_path_off: str = ""
    #: compile only kernels whose accesses, as run, outweigh compiling them (``"auto"``)
    fast_path_auto: bool = False
    #: interpreter core -> the one whose VMEM_SHARED it uses (``sim.shared_vmem``; set for
    #: kernels whose subcores or MPMD bodies run on threads)
    shared_vmem_cores: tuple[int, ...] = ()
    #: the fields a call's own ``InterpretParams`` set (such a call is interpreted)
    own_fields: frozenset[str] = frozenset()


class Simulator:
    """A simulated TPU slice; a :class:`coremesh.core.Target`. Enter it to run kernels.

    It owns one :class:`~coremesh.testing.sim.chip.SimulatedChip`: its ``chip`` and
    ``cores_per_device``, its interpret parameters, the patches and the watchdog all read that.
    """

    name = "simulator"

    def __init__(
        self,
        chip: str | Chip = "v5p",
        devices: int = 4,
        *,
        cores_per_device: int | None = None,
        dma_execution_mode: DmaMode = "on_wait",
        races: bool = False,
        deadline: float = DEFAULT_DEADLINE_S,
        uninitialized_memory: Literal["nan", "zero"] = "nan",
        grid_seed: int | None = None,
        check_uninitialized: bool = True,
        schedule: Schedule | None = None,
        disable_patches: Collection[str] = (),
        fast_path: bool | Literal["auto"] = "auto",
        matmul: Literal["chip", "host"] = "chip",
    ) -> None:
        record = get_chip(chip)
        if record.name not in _CHIP_VERSIONS:
            raise CoremeshError(
                f"the simulator has no model of {record.name}",
                rule=f"it simulates {', '.join(_CHIP_VERSIONS)}",
                chip=record.name,
                fix="pick one of those chips",
            )
        cores = record.check_cores_per_device(cores_per_device or record.default_cores_per_device)
        if not _is_count(devices):
            raise MeshError(
                f"devices={devices!r}",
                rule="a simulated slice has a whole number of devices, at least 1",
                chip=record.name,
                fix="pass devices=1, 2, 4, ...",
            )
        check_devices(devices, record, cores)
        if dma_execution_mode not in ("on_wait", "eager"):
            raise CoremeshError(
                f"dma_execution_mode={dma_execution_mode!r}",
                rule="DMAs run 'eager' (when started) or 'on_wait' (when waited for)",
                fix="pass dma_execution_mode='on_wait' or 'eager'",
            )
        if uninitialized_memory not in ("nan", "zero"):
            raise CoremeshError(
                f"uninitialized_memory={uninitialized_memory!r}",
                rule="fresh buffers hold NaN (max int) or zeros",
                fix="pass uninitialized_memory='nan' or 'zero'",
            )
        if not _is_seconds(deadline, MAX_DEADLINE_S):
            raise CoremeshError(
                f"deadline={deadline!r}",
                rule=f"the deadlock deadline is a number of seconds in (0, {MAX_DEADLINE_S:g}]",
                fix=f"pass e.g. deadline={DEFAULT_DEADLINE_S:g}",
            )
        seed: object = grid_seed  # callers may pass anything; check it as a plain object
        if seed is not None and not (
            isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0
        ):
            raise CoremeshError(
                f"grid_seed={grid_seed!r}",
                rule="the seed of the parallel grid order is a non-negative integer",
                fix="pass grid_seed=0, 1, ... (or None for the interpreter's default)",
            )
        _check_flag(
            "check_uninitialized",
            check_uninitialized,
            "reads of unwritten memory are checked (True) or not (False)",
        )
        if fast_path != "auto":
            _check_flag(
                "fast_path",
                fast_path,
                "core-local kernels run as compiled XLA where it pays ('auto'), wherever they "
                "can (True), or all kernels run in the interpreter (False)",
            )
        if matmul not in ("chip", "host"):
            raise CoremeshError(
                f"matmul={matmul!r}",
                rule="matrix products are the chip's MXU's ('chip': float32 operands at the "
                "default precision rounded to bfloat16) or XLA:CPU's own ('host')",
                fix="pass matmul='chip' or 'host'",
            )
        unknown = set(disable_patches) - set(patches.PATCH_NAMES)
        if unknown:
            raise CoremeshError(
                f"unknown simulator patch(es) {sorted(unknown)}",
                rule=f"the patches are {', '.join(patches.PATCH_NAMES)}",
                fix="name patches from that list",
            )
        check_schedule(schedule, dma_execution_mode, disable_patches)
        self._schedule = schedule
        self._chip = SimulatedChip(record, cores, _tpu_info(record, cores))
        self._n = devices
        self._races = races
        self._deadline = float(deadline)
        self._disabled = (
            frozenset(disable_patches)
            | (frozenset() if check_uninitialized else frozenset({"uninitialized_reads"}))
            | (frozenset() if matmul == "chip" else frozenset({"chip_matmul"}))
        )
        self._params = SimParams(
            chip=self._chip,
            num_cores_or_threads=cores,
            dma_execution_mode=dma_execution_mode,
            detect_races=races,
            uninitialized_memory=uninitialized_memory,
            random_seed=grid_seed,
            # memory is tiled on the chip: a ref's last tile is whole, and a DMA may read or
            # write its padding (emit_pipeline's edge blocks do); the padding is unwritten
            buffer_bounds="padded",
            patches_off=self._disabled,
            fast_path_auto=fast_path == "auto",
            fast_path_off=fast_path_module.off_reason(
                fast_path=fast_path is not False,
                races=races,
                schedule=schedule,
                disabled=frozenset(disable_patches),
            ),
        )
        self._paths: dict[str, str] = {}
        self._devices: tuple[Any, ...] = ()
        self._stacks: list[tuple[contextlib.ExitStack, float]] = []
        self._race_reports: list[str] = []

    # Target protocol ------------------------------------------------------------------------

    @property
    def chip(self) -> Chip:
        return self._chip.chip

    @property
    def num_devices(self) -> int:
        return self._n

    @property
    def cores_per_device(self) -> int:
        return self._chip.cores_per_device

    def activate(self) -> contextlib.AbstractContextManager[object]:
        return self

    # Simulator ------------------------------------------------------------------------------

    @property
    def simulated_chip(self) -> SimulatedChip:
        """The chip, core mode and jax chip info the simulator answers for."""
        return self._chip

    @property
    def interpret_params(self) -> InterpretParams:
        return self._params

    @property
    def races(self) -> bool:
        return self._races

    @property
    def schedule(self) -> Schedule | None:
        """The DMA schedule kernels run under (None: ``dma_execution_mode`` alone)."""
        return self._schedule

    @property
    def deadline(self) -> float:
        return self._deadline

    @property
    def devices(self) -> tuple[Any, ...]:
        """The host CPU devices standing in for the simulated TPU devices (once entered)."""
        if not self._devices:
            raise CoremeshError(
                "the simulator's devices exist only inside its context",
                rule="host devices are chosen when the context is entered",
                fix="use sim.devices inside `with simulate(...) as sim:`",
            )
        return self._devices

    @property
    def race_reports(self) -> tuple[str, ...]:
        """Kernels in which races were found so far (with ``races=True``)."""
        return tuple(self._race_reports)

    @property
    def paths(self) -> dict[str, str]:
        """Kernel -> the path its last call in this simulator took: ``"compiled"`` (core-local
        work as XLA, :mod:`coremesh.testing.sim.fast_path`) or ``"interpreted: <reason>"``."""
        self._paths.update(fast_path_module.PATHS.drain())
        return dict(self._paths)

    def path_report(self) -> str:
        """One line per kernel: its name and the path it took."""
        return "\n".join(f"{kernel}: {path}" for kernel, path in self.paths.items())

    def mesh(self, axis_name: str = "device") -> jax.sharding.Mesh:
        """A 1-D device mesh over the simulated devices, as ``jax.make_mesh`` makes it
        (``Explicit`` axis: place arrays with ``NamedSharding`` before ``shard_map``)."""
        return jax.make_mesh((self._n,), (axis_name,), devices=self.devices)

    def device_mesh(self, axis_name: str = "device") -> jax.sharding.Mesh:
        """The Target protocol's mesh: the same devices with an ``Auto`` axis, so
        ``shard_map`` over it reshards whatever arrays it is given."""
        return auto_mesh(self.devices, axis_name)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn``, wait for its result and fail on races; the result is a jax value."""
        out = jax.block_until_ready(fn(*args, **kwargs))
        self._raise_races()
        return out

    def __enter__(self) -> Simulator:
        cores = self._chip.cores_per_device
        configure_host_devices(self._n, prefer=self._n * (cores + 1), chip=self._chip.name)
        patches.check_jax_version()
        self._devices = tuple(cpu_devices()[: self._n])
        outermost = patches.installed_chip() is None
        patches.install(self, without=self._disabled)
        stack = contextlib.ExitStack()
        stack.callback(patches.uninstall)
        try:
            if outermost:
                ipc.reset_tpu_interpret_mode_state()
                WATCHDOG.reset()
                patches.RACES.drain()
                fast_path_module.PATHS.drain()
            stack.enter_context(pltpu.force_tpu_interpret_mode(self._params))
            stack.enter_context(jax.default_device(self._devices[0]))
            stack.enter_context(using_target(self))
            stack.enter_context(schedule.using(self._schedule))
        except BaseException:
            stack.close()
            raise
        self._stacks.append((stack, WATCHDOG.deadline))
        WATCHDOG.deadline = self._deadline
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, deadline = self._stacks.pop()
        failure = WATCHDOG.take() if exc is not None else None
        if failure is not None:
            ipc.reset_tpu_interpret_mode_state()
        self._paths.update(fast_path_module.PATHS.drain())
        try:
            if exc is None:
                self._raise_races()
        finally:
            WATCHDOG.deadline = deadline
            if not self._stacks:
                self._devices = ()
            stack.close()
        if failure is not None and failure is not exc:
            raise failure from (failure.__cause__ or exc)

    def _raise_races(self) -> None:
        found = patches.RACES.drain()
        self._race_reports += found
        if found and self._races:
            raise race_error(found, self._chip.name)

    def __repr__(self) -> str:
        return (
            f"Simulator({self._chip.name}, devices={self._n}, "
            f"cores_per_device={self._chip.cores_per_device}, "
            f"dma={self._params.dma_execution_mode!r}, races={self._races}"
            + (f", schedule={self._schedule})" if self._schedule is not None else ")")
        )


def check_schedule(value: object, dma_execution_mode: str, disabled: Collection[str]) -> None:
    """Refuse a schedule the simulator cannot honour, before anything runs."""
    if value is None:
        return
    if not isinstance(value, Schedule):
        raise CoremeshError(
            f"schedule={value!r}",
            rule="a DMA schedule is a coremesh.testing.Schedule (policy and seed) or None",
            fix="pass schedule=Schedule('random', seed=0), Schedule('in_order'), ... or leave it "
            "out for the interpreter's own order",
        )
    if dma_execution_mode != "on_wait":
        raise CoremeshError(
            f"schedule={value} with dma_execution_mode={dma_execution_mode!r}",
            rule="a schedule decides when each DMA completes; 'eager' mode completes them all "
            "when they start, so it leaves the schedule nothing to choose",
            fix="leave dma_execution_mode out (or use Schedule('eager'))",
        )
    if "dma_schedule" in disabled:
        raise CoremeshError(
            f"schedule={value} with the dma_schedule patch disabled",
            rule="the dma_schedule patch is what runs DMAs in the schedule's order",
            fix="drop 'dma_schedule' from disable_patches or leave schedule= out",
        )


def _tpu_info(chip: Chip, cores: int) -> Any:
    """jax's ``TpuInfo`` for ``chip`` with ``cores`` TensorCores per device."""
    tpu_info = jax_compat.tpu_info_module()
    version = tpu_info.ChipVersion[_CHIP_VERSIONS[chip.name]]
    return tpu_info.get_tpu_info_for_chip(version, cores)


def simulate(
    chip: str | Chip = "v5p",
    devices: int = 4,
    *,
    cores_per_device: int | None = None,
    dma_execution_mode: DmaMode = "on_wait",
    races: bool = False,
    deadline: float = DEFAULT_DEADLINE_S,
    uninitialized_memory: Literal["nan", "zero"] = "nan",
    grid_seed: int | None = None,
    check_uninitialized: bool = True,
    schedule: Schedule | None = None,
    disable_patches: Collection[str] = (),
    fast_path: bool | Literal["auto"] = "auto",
    matmul: Literal["chip", "host"] = "chip",
) -> Simulator:
    """A context in which unchanged Pallas TPU code runs on the CPU as ``devices`` x ``chip``.

    Args:
      chip: a coremesh chip name or alias (``"v4"``, ``"v5e"``, ``"v5p"``, ``"v6e"``,
        ``"TPU7x"``).
      devices: simulated TPU devices, each one host CPU device. jax fixes the host device count
        when its CPU backend starts: enter the first ``simulate()`` before any JAX operation (the
        pytest plugin arranges 16 for tests).
      cores_per_device: TensorCores per device; the chip's default mode if None (v4/v5p: 2).
      dma_execution_mode: ``"on_wait"`` runs a DMA when it is waited for (latest, out of order:
        finds missing waits), ``"eager"`` when it starts.
      races: run the interpreter's race detector; a race fails the run with
        :class:`SimulationRaceError` (at ``run()`` or when the context exits).
      deadline: seconds a semaphore wait may go without anything running that could signal it
        before it is a :class:`SimulationDeadlock`.
      uninitialized_memory: what fresh VMEM/SMEM/outputs hold: ``"nan"`` (max int for integers)
        exposes reads of unwritten memory.
      grid_seed: the seed of the order in which the interpreter visits the grid points of
        ``pallas_call`` dimensions with PARALLEL semantics (it always shuffles them, as cores on
        real hardware may take them in any order; None is its default seed, 0). Run a kernel
        under several seeds: one whose result depends on that order has a bug.
      check_uninitialized: track which elements of fresh buffers (scratch, outputs, pipeline
        blocks) were written; a result computed from, or holding, memory nothing wrote raises
        :class:`UninitializedReadError` naming the first read of it (an integer load raises at
        the load). False turns the check off (reads return ``uninitialized_memory``'s fill).
      schedule: the order in which DMAs complete (:class:`coremesh.testing.Schedule`: at their
        start, at the wait, in issue order, or seeded random); None leaves it to
        ``dma_execution_mode``. :func:`coremesh.testing.explore` runs a kernel under many.
      disable_patches: names from ``patches.PATCH_NAMES`` to leave out; for regression tests
        that show what each fix is for.
      fast_path: ``"auto"`` (the default) runs a kernel whose cores touch only their own
        VMEM/SMEM and their device's HBM through DMAs they wait for themselves (``pallas_call``
        pipelines, ``pl.kernel`` / ``core_map`` over a TensorCore mesh with local DMAs) as
        compiled XLA, with the same checks and results
        (:mod:`coremesh.testing.sim.fast_path`), when its memory accesses as run outweigh
        compiling it (a kernel of a few hundred accesses runs sooner interpreted than
        compiled); True compiles every kernel that can be; False interprets every kernel
        (upstream's interpreter plus the fixes: the reference the fast path is tested
        against). Every kernel under ``races=True``, a ``schedule`` or ``disable_patches`` is
        interpreted. ``sim.paths`` says which path each kernel took, and why.
      matmul: ``"chip"`` (the default) computes every ``dot_general`` in the context, in
        kernels and out, as the chip's MXU does: ``float32`` operands at the default precision
        rounded to ``bfloat16``, sums in passes of the MXU's width, so a kernel and its ``jnp``
        reference agree as they do on the chip (:mod:`coremesh.testing.sim.chip_matmul`);
        ``"host"`` keeps XLA:CPU's ``float32`` products.

    It is always the simulator. Tests that should also run on a TPU VM (``nox -s tpu_tests``)
    take their slice from the pytest plugin's ``sim`` or ``slice_target`` fixture instead, which
    hands out the local TPU there.

    Example::

        with coremesh.testing.simulate(chip="v5p", devices=4) as sim:
            mesh = jax.make_mesh((4,), ("device",))
            y = my_jitted_shard_mapped_kernel(x)
    """
    return Simulator(
        chip,
        devices,
        cores_per_device=cores_per_device,
        dma_execution_mode=dma_execution_mode,
        races=races,
        deadline=deadline,
        uninitialized_memory=uninitialized_memory,
        grid_seed=grid_seed,
        check_uninitialized=check_uninitialized,
        schedule=schedule,
        disable_patches=disable_patches,
        fast_path=fast_path,
        matmul=matmul,
    )
