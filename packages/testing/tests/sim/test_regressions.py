"""One regression test per simulator patch, on every supported jax line: without the patch, the
stock interpreter's failure where the patch applies (``Patch.needed()``) and upstream's own working
behaviour where a later jax fixed it; with the patch, the working program. Stock failures that
hang run in a subprocess with a timeout, so the test proves the hang without hanging the suite."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core import jax_compat, jax_versions
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.plugin import Pending, launch
from coremesh.testing.sim import (
    PATCH_NAMES,
    NotSimulatedError,
    SimulationDeadlock,
    SimulationRaceError,
    Simulator,
    compat,
    simulate,
)
from coremesh.testing.sim.patches import PATCHES, Patch
from coremesh.testing.sim.simulator import DmaMode

pytestmark = pytest.mark.sim

#: Seconds a stock run gets before it counts as hung (a fixed run needs a few).
HANG_TIMEOUT = 45.0

GUIDE_RUN = """
import jax
import numpy as np
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.sim import simulate

# One host device per simulated device, as stock interpret mode is run (simulate() would otherwise
# ask for spare host devices, whose extra threads can hide the stock hang).
jax.config.update("jax_num_cpu_devices", {devices})
jax.devices()

with simulate(chip="v5p", devices={devices}, disable_patches={disabled!r}, deadline=600) as sim:
    program = PROGRAMS[{name!r}]
    mesh = sim.mesh()
    inputs = program.make_inputs(mesh)
    got = np.asarray(program.build(mesh)(*inputs))
    np.testing.assert_array_equal(got, program.expected(*map(np.asarray, inputs)))
print("RESULT OK")
"""

DEADLOCK_RUN = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from coremesh.core import MeshError, jax_compat, jax_versions
from coremesh.testing.sim import simulate

def body(x_hbm, o_hbm, sem):
    pl.semaphore_wait(sem, 1)  # nobody signals

with simulate(chip="v5p", devices=1, disable_patches={disabled!r}, deadline=2) as sim:
    f = jax.jit(pl.kernel(body, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          mesh=jax_compat.tensorcore_mesh("core"),
                          scratch_types=[pltpu.SemaphoreType.REGULAR]))
    try:
        f(jnp.zeros((8, 128), jnp.float32))
    except Exception as err:
        print("RESULT", type(err).__name__)
"""


def _code(template: str, **kw: Any) -> str:
    return textwrap.dedent(template.format(**kw))


@pytest.fixture(scope="module")
def hanging_runs() -> Iterator[dict[str, Pending]]:
    """Start every run that may hang at once, so their timeouts overlap."""
    env = {"JAX_PLATFORMS": "cpu"}
    runs = {
        "io_callback": launch(
            _code(GUIDE_RUN, devices=4, name="add_one", disabled=["io_callback_host_copy"]),
            HANG_TIMEOUT,
            env,
        ),
        "watchdog_off": launch(
            _code(DEADLOCK_RUN, disabled=["deadlock_watchdog"]), HANG_TIMEOUT / 2, env
        ),
        "watchdog_on": launch(_code(DEADLOCK_RUN, disabled=[]), HANG_TIMEOUT, env),
    }
    yield runs
    for run in runs.values():
        run.wait()


def patch(name: str) -> Patch:
    return next(p for p in PATCHES if p.name == name)


def guide_result(sim: Simulator, name: str) -> tuple[np.ndarray, np.ndarray]:
    program = PROGRAMS[name]
    mesh = sim.mesh()
    inputs = program.make_inputs(mesh)
    got = np.asarray(sim.run(program.build(mesh), *inputs))
    return got, program.expected(*map(np.asarray, inputs), num_cores=sim.cores_per_device)


def test_every_patch_has_a_regression_test() -> None:
    covered = {
        "simulated_chip",
        "host_devices",
        "io_callback_host_copy",
        "padding_copy",  # test_callback_copies.py
        "partial_manual_refusal",
        "intercore",
        "signal_core",
        "regular_dma_semaphores",  # test_regular_dma.py
        "dma_add",  # test_dma_add.py
        "sparsecore_axes",
        "sparsecore_primitives",
        "subcore_barrier",  # test_subcore_barrier.py
        "fetch_and_add",  # test_fetch_and_add.py
        "semaphore_read",  # test_semaphore_read.py
        "mpmd_kernels",  # test_mpmd.py
        "out_memory_kinds",
        "host_memory_space",
        "nested_ref_views",
        "pinned_buffers",
        "custom_vjp_callbacks",
        "padded_aliased_outputs",
        "chip_matmul",  # test_chip_matmul.py
        "scalar_division",  # test_scalar_division.py
        "kernels_under_remat",  # test_kernel_effects.py
        "closed_scalars",
        "own_interpret_params",  # tests/sim/test_own_interpret_params.py
        "compile_cache",
        "idle_cores",
        "interpreter_checks",
        "fast_transforms",
        "deadlock_watchdog",
        "dma_schedule",  # test_schedule.py
        "dma_clocks",
        "race_report",
        "fault_report",  # test_faults.py
        "kernel_refusals",  # test_refusals.py
        "made_outside",  # test_uninitialized.py
        "uninitialized_reads",  # test_uninitialized.py
        "poison_buffers",
        "grid_bound_arrays",
        "fast_path",  # test_fast_path.py
        "scoped_refs",  # test_scoped_refs.py
        "view_refs",  # test_ref_views.py
        "masked_swap",  # test_ref_views.py
        "value_ops",  # test_value_ops.py
        "kernel_semaphores",  # test_kernel_semaphores.py
        "key_refs",  # test_key_refs.py
        "kernel_key_impls",  # test_kernel_key_impls.py
        "resident_aliases",  # test_resident_aliases.py
        "core_local_smem",  # test_core_local_smem.py
        "mpmd_operand_spaces",  # test_core_local_smem.py
        "hardware_prng",  # test_hardware_prng.py
        "pipeline_primitive",  # test_pipeline_primitive.py
        "sparsecore_bitcast",  # test_sparsecore_bitcast.py
    }
    assert covered == set(PATCH_NAMES)


# simulated_chip ---------------------------------------------------------------------------


def stock_tensorcore_mesh() -> Any:
    """jax's own spelling of the guide's mesh on this line (no coremesh in between)."""
    if jax_versions.at_least("0.11.0"):
        return pltpu.TensorCoreMesh(axis_name="core")
    return pltpu.create_tensorcore_mesh("core")


def test_simulated_chip() -> None:
    with simulate(devices=1, disable_patches=["simulated_chip"]):
        with pytest.raises(ValueError, match="Unsupported TPU device kind: cpu"):
            pltpu.get_tpu_info()
        # reads num_cores of a CPU device (AttributeError); jax 0.12.1 asks the chip table,
        # which has no entry for one (ValueError)
        with pytest.raises((AttributeError, ValueError)):
            stock_tensorcore_mesh()
        assert not pltpu.is_tpu_device()
        with pytest.raises(AttributeError):
            _ = jax.devices()[0].num_cores  # what JAX's core_map tests read
    with simulate(devices=1):
        assert pltpu.get_tpu_info().num_cores == 2
        assert dict(stock_tensorcore_mesh().shape) == {"core": 2}
        assert pltpu.is_tpu_device()
        assert [d.num_cores for d in jax.devices()] == [2]
        # jax's own lowering keeps the host's answer: the device lowers as a CPU.
        assert not jax_compat.tpu_info_module().is_tpu_device()
    with simulate("v5e", devices=2):
        assert [d.num_cores for d in jax.devices()] == [1, 1]
    assert not pltpu.is_tpu_device()  # outside the simulator, as stock
    with pytest.raises(AttributeError):
        _ = jax.devices()[0].num_cores


# host_devices -----------------------------------------------------------------------------


def test_host_devices() -> None:
    host = len(jax.devices("cpu"))
    assert host > 4
    with simulate(devices=4, disable_patches=["host_devices"]):
        # The guide builds its mesh from jax.device_count(): every host device, not 4.
        assert jax.make_mesh((jax.device_count(),), ("device",)).size == host
    with simulate(devices=4):
        assert jax.make_mesh((jax.device_count(),), ("device",)).size == 4


# io_callback_host_copy --------------------------------------------------------------------


#: Does stock interpret mode hang on the 4-device add_one (io_callback's device_put)? Measured
#: per line, one stock run at a time and beside others: jax 0.10.2 hangs every time (3 of 3 alone),
#: 0.11.2's jaxlib only under load (0 of 3 alone; it hung beside this suite's other stock runs),
#: 0.12.0.1 in no run here (the bench, this suite, alone or loaded). "sometimes" accepts a hang or
#: the right result.
IO_CALLBACK_HANGS = {"0.10.2": "always", "0.11.2": "sometimes", "0.12.0.1": "never"}


def test_io_callback_host_copy(hanging_runs: dict[str, Pending]) -> None:
    # The patch stays on every line: the device_put it skips also costs ~4x (nox -s bench).
    stock = hanging_runs["io_callback"].wait()
    hangs = IO_CALLBACK_HANGS[jax_versions.line_of()]
    finished = "RESULT OK" in stock.stdout
    detail = f"{stock.stdout}{stock.stderr}"
    if hangs == "always":
        assert stock.timed_out, f"expected add_one to hang:\n{detail}"
    elif hangs == "never":
        assert finished, detail
    else:
        assert stock.timed_out or finished, detail
    with simulate(devices=4) as sim:
        got, want = guide_result(sim, "add_one")
        np.testing.assert_array_equal(got, want)


def test_callbacks_run_outside_the_callers_mesh() -> None:
    """JAX's test_shard_map_check_vma: a pallas_call under jax.set_mesh with Explicit axes. The
    simulator's callback (io_callback_impl, swapped by this patch) must leave the caller's mesh
    as upstream's does from jax 0.12, or the 2-core chip's per-core programs are traced in it
    and fail: 'Closing over inputs to shard_map ... sharded on `Explicit` axes'."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    def copy(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...]

    with simulate(devices=1):
        mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
        with jax.set_mesh(mesh):
            x = jax.device_put(jnp.arange(128 * 128, dtype=jnp.float32).reshape(128, 128),
                               NamedSharding(mesh, P("x")))  # fmt: skip

            @jax.jit
            @partial(jax.shard_map, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
            def inner(x: jax.Array) -> jax.Array:
                return pl.pallas_call(copy, out_shape=jax.typeof(x))(x)

            got = np.asarray(inner(x))
    np.testing.assert_array_equal(got, np.arange(128 * 128, dtype=np.float32).reshape(128, 128))


# partial_manual_refusal -------------------------------------------------------------------


def partly_manual_copy(sim: Simulator) -> Any:
    """A kernel under a shard_map over axis x of an (x, y) mesh: y stays automatic."""
    from jax.sharding import PartitionSpec as P

    def copy(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...]

    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=sim.devices, axis_types=(auto, auto))
    return jax.jit(
        jax.shard_map(
            lambda x: pl.pallas_call(copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x),
            mesh=mesh,
            in_specs=P("x"),
            out_specs=P("x"),
            axis_names={"x"},
            check_vma=False,
        )
    )


def test_partial_manual_refusal() -> None:
    x = jnp.zeros((16, 128), jnp.float32)
    stock = pytest.raises(NotImplementedError, match="all mesh axes are partitioned manually")
    with simulate("v5e", 4, disable_patches=["partial_manual_refusal"]) as sim, stock:
        partly_manual_copy(sim)(x)
    refused = pytest.raises(NotSimulatedError, match=r"mesh axes \['y'\] are automatic")
    with simulate("v5e", 4) as sim, refused:
        partly_manual_copy(sim)(x)


# intercore --------------------------------------------------------------------------------


def local_signal_kernel(x_hbm: Any, o_hbm: Any, vmem: Any, dsem: Any, rsem: Any) -> None:
    """Each core signals and waits its own semaphore: no core_index, no device_id."""
    c = jax.lax.axis_index("core")
    cols = pl.ds(c * 128, 128)
    pltpu.async_copy(x_hbm.at[:, cols], vmem, dsem).wait()
    pl.semaphore_signal(rsem, 1)
    pl.semaphore_wait(rsem, 1)
    vmem[...] = vmem[...] + 1
    pltpu.async_copy(vmem, o_hbm.at[:, cols], dsem).wait()


def run_local_signal(sim: Simulator) -> np.ndarray:
    mesh = sim.mesh()
    spec = jax.P("device", None)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    def f(x: Any) -> Any:
        return pl.kernel(
            local_signal_kernel,
            out_type=x,
            mesh=jax_compat.tensorcore_mesh("core"),
            scratch_types=[
                pltpu.VMEM((x.shape[0], 128), x.dtype),
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.REGULAR,
            ],
        )(x)

    x = jnp.arange(16 * 256, dtype=jnp.float32).reshape(16, 256)
    return np.asarray(sim.run(f, jax.device_put(x, jax.NamedSharding(mesh, spec))))


def test_intercore_device_id_naming_a_core() -> None:
    with simulate(devices=2, disable_patches=["intercore"]) as sim:
        if patch("intercore").needed():
            with pytest.raises(NotImplementedError, match="'core'"):
                guide_result(sim, "swap_kernel")
        else:  # jax 0.12 maps the core axis and delivers to the named core by itself
            got, want = guide_result(sim, "swap_kernel")
            np.testing.assert_array_equal(got, want)
    with simulate(devices=2) as sim:
        for name in ("swap_kernel", "swap_core_map"):
            got, want = guide_result(sim, name)
            np.testing.assert_array_equal(got, want)


# signal_core ------------------------------------------------------------------------------


def test_signal_without_core_index_goes_to_the_signalling_core() -> None:
    # Stock sends both cores' signals to core 0: core 1 waits forever (caught as a deadlock).
    assert patch("signal_core").needed()  # still so in jax 0.12.0.1
    with simulate(devices=1, disable_patches=["signal_core"], deadline=2) as sim:
        with pytest.raises(SimulationDeadlock) as info:
            run_local_signal(sim)
        assert info.value.core == 1
    with simulate(devices=1) as sim:
        want = np.arange(16 * 256, dtype=np.float32).reshape(16, 256) + 1
        np.testing.assert_array_equal(run_local_signal(sim), want)


# sparsecore_axes --------------------------------------------------------------------------


def test_sparsecore_axes() -> None:
    # (the uninitialized-read check would catch the rows stock leaves unwritten)
    with simulate(devices=1, disable_patches=["sparsecore_axes", "uninitialized_reads"]) as sim:
        got, want = guide_result(sim, "sc_add_one")
    rows_per_subcore = want.shape[0] // 64
    correct_rows = (got == want).all(axis=1)
    # Every subcore thinks it is subcore 0: only subcore 0's rows come out right.
    assert correct_rows[:rows_per_subcore].all()
    assert not correct_rows[rows_per_subcore:].any()
    with simulate(devices=1) as sim:
        got, want = guide_result(sim, "sc_add_one")
        np.testing.assert_array_equal(got, want)


# sparsecore_primitives --------------------------------------------------------------------


def gather_on_subcores(sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(lanes, dtype=jnp.int32) * 5

    def kernel(x_hbm: Any, o_hbm: Any, v: Any, out: Any) -> None:
        pltpu.sync_copy(x_hbm, v)
        out[...] = plsc.load_gather(v, [jnp.arange(lanes, dtype=jnp.int32)[::-1]])
        pltpu.sync_copy(out, o_hbm)

    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
    )
    f = jax.jit(
        pl.kernel(
            kernel, out_type=x, mesh=mesh, scratch_types=[pltpu.VMEM((lanes,), jnp.int32)] * 2
        )
    )
    return np.asarray(sim.run(f, x)), np.asarray(x)[::-1]


def test_sparsecore_primitives() -> None:
    with (
        simulate(devices=1, disable_patches=["sparsecore_primitives"]) as sim,
        pytest.raises(TypeError, match="must be int32 or float32"),  # a buffer id, int16
    ):
        gather_on_subcores(sim)
    with simulate(devices=1) as sim:
        got, want = gather_on_subcores(sim)
        np.testing.assert_array_equal(got, want)


def indexed_dma_gather(sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    table = jnp.arange(512 * 128, dtype=jnp.float32).reshape(512, 128)
    idx = jnp.arange(lanes, dtype=jnp.int32) * 7

    def kernel(t_hbm: Any, i_hbm: Any, o_hbm: Any, i_vmem: Any, rows: Any) -> None:
        pltpu.sync_copy(i_hbm, i_vmem)
        pltpu.sync_copy(t_hbm.at[i_vmem], rows)
        pltpu.sync_copy(rows, o_hbm)

    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
    )
    f = jax.jit(
        pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct((lanes, 128), jnp.float32),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes, 128), jnp.float32)],
        )
    )
    return np.asarray(sim.run(f, table, idx)), np.asarray(table)[np.asarray(idx)]


def test_sparsecore_primitives_indexed_dma() -> None:
    # Stock, the DMA takes the index buffer's id for the row index: it reads that one row
    # (or past the table's end) and cannot write it to the 8 rows it was given.
    with (
        simulate(devices=1, disable_patches=["sparsecore_primitives", "fault_report"]) as sim,
        pytest.raises(jax.errors.JaxRuntimeError, match=r"Out-of-bounds (read|write) of"),
    ):
        indexed_dma_gather(sim)
    with simulate(devices=1) as sim:
        got, want = indexed_dma_gather(sim)
        np.testing.assert_array_equal(got, want)


# closed_scalars ---------------------------------------------------------------------------


def closed_scalar_kernel(kind: str) -> Any:
    """``jax.jit(f)`` whose kernel body closes over ``f``'s traced scalar ``n`` and writes
    ``3 * n + 1`` to 16 int32 outputs, on one core of a TensorCore, vector-subcore or
    scalar-subcore mesh."""
    out = jax.ShapeDtypeStruct((16,), jnp.int32)
    if kind == "tensorcore":
        mesh: Any = stock_tensorcore_mesh()
        scratch: Any = pltpu.VMEM((16,), jnp.int32)
    elif kind == "vector_subcore":
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
        scratch = pltpu.VMEM((16,), jnp.int32)
    else:
        mesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=2)
        scratch = pltpu.SMEM((16,), jnp.int32)

    def f(n: jax.Array) -> jax.Array:
        def body(o_hbm: Any, buf: Any) -> None:
            first = jax.lax.axis_index("core") == 0
            if kind == "vector_subcore":
                first = first & (jax.lax.axis_index("subcore") == 0)

            @pl.when(first)
            def _() -> None:
                if kind == "scalar_subcore":
                    for i in range(16):
                        buf[i] = 3 * n + 1
                else:
                    buf[...] = jnp.full((16,), 3 * n + 1, jnp.int32)
                pltpu.sync_copy(buf, o_hbm)

        return pl.kernel(body, out_type=out, mesh=mesh, scratch_types=[scratch])()

    return jax.jit(f)


@pytest.mark.parametrize("kind", ["tensorcore", "vector_subcore", "scalar_subcore"])
def test_closed_scalars(kind: str) -> None:
    n = jnp.int32(41)
    want = np.full(16, 3 * 41 + 1, np.int32)
    with simulate(devices=1, disable_patches=["closed_scalars"]):
        if not jax_versions.at_least("0.12.1"):
            with pytest.raises(TypeError, match="same dtypes, got int32, int16"):
                closed_scalar_kernel(kind)(n)  # the body got the scalar's int16 buffer id
        else:  # jax 0.12.1 (untested) hands the body the scalar; the fast path still needs it
            np.testing.assert_array_equal(np.asarray(closed_scalar_kernel(kind)(n)), want)
    for fast_path in (False, True):
        with simulate(devices=1, fast_path=fast_path):
            got = np.asarray(closed_scalar_kernel(kind)(n))
        np.testing.assert_array_equal(got, want)


def test_closed_scalar_sizes_a_dynamic_pipeline_grid() -> None:
    """JAX's megacore test shape: a traced grid size split between a v5p's two TensorCores by
    ``emit_pipeline(core_axis_name=...)``; each core counts its own iterations."""

    @jax.jit
    def f(n: jax.Array) -> jax.Array:
        def body(o_hbm: Any, count: Any) -> None:
            count[...] = jnp.zeros_like(count)

            def step() -> None:
                count[...] += 1

            pltpu.emit_pipeline(
                step,
                grid=(n,),
                in_specs=[],
                out_specs=[],
                core_axis_name="core",
                dimension_semantics=(pltpu.PARALLEL,),
            )()
            pltpu.sync_copy(count, o_hbm.at[jax.lax.axis_index("core")])

        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((2, 8, 128), jnp.int32),
            mesh=stock_tensorcore_mesh(),
            scratch_types=[pltpu.VMEM((8, 128), jnp.int32)],
        )()

    with simulate(devices=1):
        got = np.asarray(f(jnp.int32(5)))
    # 5 iterations over 2 cores: the first core takes the extra one (pipeline.py _partition_grid)
    np.testing.assert_array_equal(got[:, 0, 0], [3, 2])
    assert (got == got[:, :1, :1]).all()


# compile_cache ----------------------------------------------------------------------------


@pytest.fixture
def count_compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from jax._src import stages

    calls = [0]
    orig = stages.Lowered.compile

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return orig(self, *args, **kwargs)

    monkeypatch.setattr(stages.Lowered, "compile", counting)
    return calls


@pytest.mark.parametrize(("disabled", "warm_compiles"), [(["compile_cache"], 2), ([], 0)])
def test_compile_cache(count_compiles: list[int], disabled: list[str], warm_compiles: int) -> None:
    """A warm call of a 2-core kernel: stock compiles each core's program again."""
    with simulate(devices=1, disable_patches=disabled) as sim:
        program = PROGRAMS["swap_kernel"]
        mesh = sim.mesh()
        fn, inputs = program.build(mesh), program.make_inputs(mesh)
        sim.run(fn, *inputs)  # cold
        count_compiles[0] = 0
        got = np.asarray(sim.run(fn, *inputs))  # warm
        assert count_compiles[0] == warm_compiles
        np.testing.assert_array_equal(got, program.expected(*map(np.asarray, inputs)))


# idle_cores -------------------------------------------------------------------------------


def _blockwise_add(semantics: str) -> Any:
    """A pallas_call over 4 blocks adding each block's grid index, of one dimension with
    ``semantics`` (v5p splits a ``parallel`` one between its 2 cores)."""

    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32)

    spec = pl.BlockSpec((8, 128), lambda i: (0, i))
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((8, 512), jnp.float32),
        grid=(4,),
        in_specs=[spec],
        out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=(semantics,)),
    )


@pytest.mark.parametrize(
    ("disabled", "semantics", "core_programs"),
    [(["idle_cores"], "arbitrary", 1), ([], "arbitrary", 0), ([], "parallel", 1)],
)
def test_idle_cores(
    monkeypatch: pytest.MonkeyPatch, disabled: list[str], semantics: str, core_programs: int
) -> None:
    """Stock compiles a program for v5p's cores even when core 1 has no grid step."""
    from coremesh.testing.sim import patches

    compiled = [0]
    orig = patches._compile_core_program

    def counting(*args: Any) -> Any:
        compiled[0] += 1
        return orig(*args)

    monkeypatch.setattr(patches, "_compile_core_program", counting)
    x = np.arange(8 * 512, dtype=np.float32).reshape(8, 512)
    with simulate(chip="v5p", devices=1, disable_patches=disabled, fast_path=False) as sim:
        got = np.asarray(sim.run(jax.jit(_blockwise_add(semantics)), x))
    assert compiled[0] == core_programs
    np.testing.assert_array_equal(got, x + np.repeat(np.arange(4, dtype=np.float32), 128))


# interpreter_checks -----------------------------------------------------------------------


def _primitives(jaxpr: Any) -> set[str]:
    """The names of the primitives in ``jaxpr`` and every jaxpr nested in its equations."""
    from jax._src import core

    names: set[str] = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


@pytest.mark.parametrize(
    ("disabled", "interpreter_checked"), [(["interpreter_checks"], True), ([], False)]
)
def test_interpreter_checks(
    monkeypatch: pytest.MonkeyPatch, disabled: list[str], interpreter_checked: bool
) -> None:
    """Under jax_enable_checks stock type-checks the interpreter's program (its host callbacks)
    as the kernel's lowering traces it; the kernel's own jaxpr is checked either way."""
    from jax._src import config, core

    checked: list[set[str]] = []
    orig = core.check_jaxpr

    def recording(jaxpr: Any) -> Any:
        checked.append(_primitives(jaxpr))
        return orig(jaxpr)

    monkeypatch.setattr(core, "check_jaxpr", recording)
    x = np.arange(8 * 512, dtype=np.float32).reshape(8, 512)
    with (
        simulate(chip="v5e", devices=1, disable_patches=disabled, fast_path=False) as sim,
        config.enable_checks(True),
    ):
        got = np.asarray(sim.run(jax.jit(_blockwise_add("arbitrary")), x))
    interpreter = [names for names in checked if "io_callback" in names]
    kernel = [names for names in checked if "swap" in names and "io_callback" not in names]
    assert bool(interpreter) == interpreter_checked
    assert kernel  # the kernel's body (its loads and stores), checked when traced
    np.testing.assert_array_equal(got, x + np.repeat(np.arange(4, dtype=np.float32), 128))


# fast_transforms --------------------------------------------------------------------------


@pytest.mark.parametrize(("disabled", "generic"), [(["fast_transforms"], True), ([], False)])
def test_fast_transforms(
    monkeypatch: pytest.MonkeyPatch, disabled: list[str], generic: bool
) -> None:
    """Stock converts every callback's index transforms through jax's pytree flattening."""
    from jax._src.state import indexing

    flattens = [0]
    orig = indexing.NDIndexer.tree_flatten

    def counting(self: Any) -> Any:
        flattens[0] += 1
        return orig(self)

    monkeypatch.setattr(indexing.NDIndexer, "tree_flatten", counting)
    with simulate(devices=1, disable_patches=disabled) as sim:
        program = PROGRAMS["swap_kernel"]
        mesh = sim.mesh()
        fn, inputs = program.build(mesh), program.make_inputs(mesh)
        sim.run(fn, *inputs)
        flattens[0] = 0
        got = np.asarray(sim.run(fn, *inputs))
    assert (flattens[0] > 0) == generic
    np.testing.assert_array_equal(got, program.expected(*map(np.asarray, inputs), num_cores=2))


def test_int_tree_matches_jax_tree_map() -> None:
    from jax._src import indexing as slices
    from jax._src.state import indexing

    from coremesh.testing.sim.patches import int_tree

    nd = indexing.NDIndexer(
        (slices.Slice(np.int32(3), 8, 1), np.int64(2), slices.Slice(0, np.int32(128), 2)),
        (64, 4, 256),
        (),
    )
    tree = ((nd,), None, [np.array(7, np.int32)], (nd, nd))
    assert int_tree(tree) == jax.tree.map(int, tree)
    assert type(int_tree(tree)[0][0].indices[1]) is int


# deadlock_watchdog ------------------------------------------------------------------------


def test_deadlock_watchdog(hanging_runs: dict[str, Pending]) -> None:
    stock = hanging_runs["watchdog_off"].wait()
    assert stock.timed_out, f"expected an endless wait:\n{stock.stdout}{stock.stderr}"
    fixed = hanging_runs["watchdog_on"].wait()
    assert not fixed.timed_out
    assert "RESULT SimulationDeadlock" in fixed.stdout, fixed.stderr


# dma_clocks -------------------------------------------------------------------------------


def two_dmas_into_one_buffer(x_hbm: Any, o_hbm: Any, vmem: Any, sems: Any) -> None:
    first = pltpu.make_async_copy(x_hbm.at[0], vmem, sems.at[0])
    second = pltpu.make_async_copy(x_hbm.at[1], vmem, sems.at[1])
    first.start()
    second.start()  # in flight with the first, into the same buffer: a write-write race
    first.wait()
    second.wait()
    pltpu.sync_copy(vmem, o_hbm)


def run_two_dmas(sim: Simulator) -> np.ndarray:
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2, 8, 128)
    f = pl.kernel(
        two_dmas_into_one_buffer,
        out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        mesh=jax_compat.tensorcore_mesh("core", num_cores=1),
        scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )
    return np.asarray(sim.run(jax.jit(f), x))


@pytest.mark.parametrize("dma", ["on_wait", "eager"])
def test_dma_clocks(dma: DmaMode) -> None:
    # A v5e device has 1 core: stock clocks have 1 spare entry, which both DMAs draw.
    stock = ["dma_clocks"]
    with simulate("v5e", 1, races=True, dma_execution_mode=dma, disable_patches=stock) as sim:
        got = run_two_dmas(sim)  # stock: the race goes unreported
        assert not sim.race_reports
    x = np.arange(2 * 8 * 128, dtype=np.float32).reshape(2, 8, 128)
    assert any(np.array_equal(got, x[k]) for k in (0, 1))  # one DMA's rows, whichever landed last
    with (
        pytest.raises(SimulationRaceError, match=r"data race\(s\) detected"),
        simulate("v5e", 1, races=True, dma_execution_mode=dma) as sim,
    ):
        run_two_dmas(sim)


# race_report ------------------------------------------------------------------------------


def write_write_race(x_hbm: Any, o_hbm: Any, vmem: Any, sem: Any) -> None:
    pltpu.async_copy(x_hbm.at[:, pl.ds(0, 128)], vmem, sem).wait()
    pltpu.async_copy(vmem, o_hbm.at[:, pl.ds(0, 128)], sem).wait()  # both cores, one block


def run_racy(sim: Simulator) -> None:
    mesh = sim.mesh()
    spec = jax.P("device", None)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    def f(x: Any) -> Any:
        return pl.kernel(
            write_write_race,
            out_type=x,
            mesh=jax_compat.tensorcore_mesh("core"),
            scratch_types=[pltpu.VMEM((x.shape[0], 128), x.dtype), pltpu.SemaphoreType.DMA],
        )(x)

    x = jax.device_put(jnp.ones((8, 256), jnp.float32), jax.NamedSharding(mesh, spec))
    sim.run(f, x)


def test_race_report(capfd: pytest.CaptureFixture[str]) -> None:
    # (both cores write columns 0..127, and nobody the rest: the uninitialized-read check would
    # report that result; the race is the subject here)
    with simulate(
        devices=1, races=True, disable_patches=["race_report", "uninitialized_reads"]
    ) as sim:
        if patch("race_report").needed():
            run_racy(sim)  # stock: no failure ...
            assert "RACE DETECTED" in capfd.readouterr().out  # ... only a printed line
        else:  # jax 0.12 raises at the racing access; the simulator names it as its own error
            with pytest.raises(SimulationRaceError, match="RACE DETECTED"):
                run_racy(sim)
    with (
        pytest.raises(SimulationRaceError),
        simulate(devices=1, races=True, check_uninitialized=False) as sim,
    ):
        run_racy(sim)


# poison_buffers ---------------------------------------------------------------------------


def half_copied(dtype: Any) -> Any:
    """The upper half of an (8, 128) block copied through a pipeline; the rest never written."""

    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[:4, :] = x_ref[:4, :]

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        pltpu.emit_pipeline(
            body,
            grid=(1,),
            in_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        )(x_hbm, o_hbm)

    return pl.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((8, 128), dtype),
        mesh=jax_compat.tensorcore_mesh("core", num_cores=1),
    )


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8])
def test_poison_buffers(dtype: Any) -> None:
    x = np.ones((8, 128), dtype)
    lowest, highest = jnp.iinfo(dtype).min, jnp.iinfo(dtype).max
    with pl.enable_poison_buffers(True):
        with simulate("v5p", 1, disable_patches=["poison_buffers"]):
            stock = np.asarray(jax.jit(half_copied(dtype))(x))
        with simulate("v5p", 1):
            fixed = np.asarray(jax.jit(half_copied(dtype))(x))
    np.testing.assert_array_equal(stock[:4], x[:4])
    assert (stock[4:] == highest).all()  # the interpreter's integer fill
    np.testing.assert_array_equal(fixed[:4], x[:4])
    assert (fixed[4:] == lowest).all()  # Mosaic's poison: what JAX's test_poison_buffers expects
    with simulate("v5p", 1):  # poisoning off: the fill stays the interpreter's
        assert (np.asarray(jax.jit(half_copied(dtype))(x))[4:] == highest).all()


# grid_bound_arrays ------------------------------------------------------------------------


def count_steps(n: Any) -> Any:
    """JAX's test_dynamic_grid_with_smem_output: a grid sized by ``n`` counts its own steps."""

    def body(_: Any, o_ref: Any) -> None:
        o_ref[0] = jax.lax.cond(pl.program_id(0) == 0, lambda: 1, lambda: o_ref[0] + 1)

    return pl.pallas_call(
        body,
        out_shape=pltpu.SMEM((1,), jnp.int32),
        grid_spec=pl.GridSpec(
            grid=(n,),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        ),
    )(n)


def test_grid_bound_arrays() -> None:
    n = jnp.array([5], jnp.int32)  # a grid size of shape (1,)
    with (
        simulate("v5p", 1, disable_patches=["grid_bound_arrays"]),
        pytest.raises(TypeError, match="Pred must be a scalar"),
    ):
        jax.jit(count_steps)(n)
    with simulate("v5p", 1):
        np.testing.assert_array_equal(np.asarray(jax.jit(count_steps)(n)), [5])
        np.testing.assert_array_equal(np.asarray(jax.jit(count_steps)(jnp.int32(3))), [3])


# out_memory_kinds -------------------------------------------------------------------------


def copy_to_pinned_host(x: Any) -> Any:
    """A kernel's copy as the result of a jit whose out_shardings put it in pinned host memory
    (JAX's test_basic_output_memory_space_constraint with pl.HOST, on one device)."""

    def kernel(x_ref: Any, y_ref: Any) -> None:
        y_ref[...] = x_ref[...] * 2

    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(jax.devices()[:1], "x"),
        jax.sharding.PartitionSpec(),
        memory_kind="pinned_host",
    )
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
    return jax.jit(call, out_shardings=sharding)(x)


def test_out_memory_kinds() -> None:
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    with (
        simulate("v5p", 1, disable_patches=["out_memory_kinds"]),
        pytest.raises(ValueError, match="safe_zip"),
    ):
        copy_to_pinned_host(x)
    with simulate("v5p", 1):
        y = copy_to_pinned_host(x)
        assert y.sharding.memory_kind == "pinned_host"
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2)


# host_memory_space ------------------------------------------------------------------------


def copy_hbm_to_host(x: Any) -> Any:
    """JAX's test_hbm_to_host_host_output_dma: a DMA from HBM into a result in host memory."""

    def kernel(x_hbm: Any, y_host: Any) -> None:
        def body(sem: Any) -> None:
            pltpu.async_copy(x_hbm, y_host, sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(jax.devices()[:1], "x"),
        jax.sharding.PartitionSpec(),
        memory_kind="pinned_host",
    )
    if jax_versions.at_least("0.11.0"):  # the trees spell the result so
        out_shape = pl.MemoryRef(jax.core.ShapedArray(x.shape, x.dtype), pl.HOST)
    else:
        out_shape = pl.HOST(shape=x.shape, dtype=x.dtype)
    call = pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.HOST),
        out_shape=out_shape,
    )
    return jax.jit(call, out_shardings=sharding)(x)


def test_host_memory_space() -> None:
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    with simulate("v5p", 1, disable_patches=["host_memory_space"]):
        if patch("host_memory_space").needed():
            with pytest.raises(KeyError, match="host"):
                copy_hbm_to_host(x)
        else:  # jax 0.11 gives host memory an index of its own
            np.testing.assert_array_equal(np.asarray(copy_hbm_to_host(x)), np.asarray(x))
    with simulate("v5p", 1):
        y = copy_hbm_to_host(x)
        assert y.sharding.memory_kind == "pinned_host"
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


# nested_ref_views -------------------------------------------------------------------------


def nested_pipelines(x: Any) -> Any:
    """JAX's test_transformed_refs_as_inputs_nested: two pipelines, the outer over a view of
    the operand (``x_ref.at[1]``), the inner over the outer's blocks. As emit_pipeline
    primitives, the inner one's DMAs copy views of views."""
    out_type = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)

    @pl.kernel(out_type=out_type, mesh=stock_tensorcore_mesh())
    def run_kernel(x_ref: Any, o_ref: Any) -> None:
        def outer_body(outer_x: Any, outer_o: Any) -> None:
            def inner_body(x: Any, o: Any) -> None:
                o[...] = x[...] + 1

            pltpu.emit_pipeline(
                inner_body,
                grid=(jnp.array(2),),  # a grid size known when it runs
                in_specs=[pl.BlockSpec((16, 128), lambda i: (0, i))],
                out_specs=[pl.BlockSpec((16, 128), lambda i: (0, i))],
                dimension_semantics=(pltpu.PARALLEL,),
            )(outer_x, outer_o)

        pltpu.emit_pipeline(
            outer_body,
            grid=(jnp.array(2),),  # a grid size known when it runs
            in_specs=[pl.BlockSpec((16, 256), lambda i: (0, i))],
            out_specs=[pl.BlockSpec((16, 256), lambda i: (0, i))],
            dimension_semantics=(pltpu.PARALLEL,),  # split between the 2 cores
        )(x_ref.at[1], o_ref)

    return run_kernel(x)


def test_nested_ref_views() -> None:
    from jax._src import config

    x = jnp.arange(2 * 16 * 512, dtype=jnp.float32).reshape(2, 16, 512)
    with (
        simulate("v5p", 1, disable_patches=["nested_ref_views"]),
        config.use_emit_pipeline_primitive(True),
    ):
        if jax_versions.at_least("0.11.0"):
            stock = (  # jax 0.12.1 refuses the view of a view as it builds it
                "TransformedRef cannot wrap a TransformedRef"
                if compat.transformed_ref_refuses_nesting()
                else "__jax_array__"
            )
            with pytest.raises(ValueError, match=stock):
                nested_pipelines(x)
        else:  # 0.10's primitive is expanded by patch pipeline_primitive, views flattened
            np.testing.assert_array_equal(np.asarray(nested_pipelines(x)), np.asarray(x)[1] + 1)
    with simulate("v5p", 1), config.use_emit_pipeline_primitive(True):
        np.testing.assert_array_equal(np.asarray(nested_pipelines(x)), np.asarray(x)[1] + 1)
    with simulate("v5p", 1):  # the pipeline traced as Python: views already flat
        np.testing.assert_array_equal(np.asarray(nested_pipelines(x)), np.asarray(x)[1] + 1)


# pinned_buffers ---------------------------------------------------------------------------


@jax.jit
def add_one_pinned(x: Any) -> Any:
    """JAX's PinnedBufferTest::test_basic with a kernel that changes the buffer: an array pinned,
    aliased through a pallas_call that adds one to it in place (HBM -> VMEM -> HBM), unpinned."""
    from jax._src.state.primitives import pin, unpin

    def kernel(x_hbm: Any, y_hbm: Any) -> None:
        def body(scratch: Any, sem: Any) -> None:
            pltpu.async_copy(x_hbm, scratch, sem).wait()
            scratch[...] = scratch[...] + 1
            pltpu.async_copy(scratch, y_hbm, sem).wait()

        pl.run_scoped(body, pltpu.VMEM(x_hbm.shape, x_hbm.dtype), pltpu.SemaphoreType.DMA)

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        input_output_aliases={0: 0},
    )(pin(x))
    return unpin(out)


def test_pinned_buffers() -> None:
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    with (
        simulate("v5p", 1, disable_patches=["pinned_buffers"]),
        pytest.raises(TypeError, match=r"No xla_shape_handler.*AbstractLinVal"),
    ):
        add_one_pinned(x)
    with simulate("v5p", 1):
        np.testing.assert_array_equal(np.asarray(add_one_pinned(x)), np.asarray(x) + 1)
        # no TPU memory colour in the CPU program (JAX's test checks the same)
        assert '"color"' not in add_one_pinned.lower(x).compile().as_text()


# custom_vjp_callbacks ---------------------------------------------------------------------


def doubled(x: Any) -> Any:
    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@jax.custom_vjp
def double(x: Any) -> Any:
    """x * 2 by a kernel, its gradient by the same kernel (as splash attention's backward pass
    is kernels of its own)."""
    return doubled(x)


double.defvjp(lambda x: (doubled(x), None), lambda _, g: (doubled(g),))


def test_custom_vjp_callbacks() -> None:
    from jax._src import config

    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) / 100
    grad = jax.grad(lambda x: jnp.sum(jax.jit(double)(x) ** 2))  # as splash attention's call
    with (
        simulate("v5p", 1, disable_patches=["custom_vjp_callbacks"]),
        config.enable_checks(True),  # JaxTestCase's default: the custom_vjp is type-checked
    ):
        if patch("custom_vjp_callbacks").needed():
            with pytest.raises(NotImplementedError, match="Effects not supported in `custom_vjp`"):
                grad(x)
        else:  # jax 0.12 allows the interpreter's callbacks in custom derivatives
            np.testing.assert_allclose(np.asarray(grad(x)), 8 * np.asarray(x), rtol=1e-6)
    with simulate("v5p", 1), config.enable_checks(True):
        np.testing.assert_allclose(np.asarray(grad(x)), 8 * np.asarray(x), rtol=1e-6)


# padded_aliased_outputs -------------------------------------------------------------------


def add_one_in_place(x: Any) -> Any:
    """x + 1 into x's own buffer, in (8, 128) blocks over a (16, 16) array: the blocks are
    padded past the array's 16 columns, as gmm's n=16 output is past its 128-wide tiles."""

    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] + 1.0

    block = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(2,),
        in_specs=[block],
        out_specs=block,
        input_output_aliases={0: 0},
    )(x)


def test_padded_aliased_outputs() -> None:
    # Every supported line reads the aliased output back at the padded input's shape.
    x = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    with (
        simulate("v5p", 1, disable_patches=["padded_aliased_outputs"]),
        pytest.raises(ValueError, match="doesn't match function result type"),
    ):
        jax.jit(add_one_in_place)(x)
    with simulate("v5p", 1):
        np.testing.assert_array_equal(np.asarray(jax.jit(add_one_in_place)(x)), x + 1)
