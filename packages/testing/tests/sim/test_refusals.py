"""What the chip refuses, the simulator refuses: memory, unfinished kernels, barriers, slices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh import tensorcore as tc
from coremesh.core import jax_compat, jax_versions
from coremesh.core.capacity import padded_nbytes
from coremesh.core.chips import get_chip
from coremesh.core.errors import CapacityError, CollectiveIdError, MeshError
from coremesh.testing.sim import SimulationFault, UnfinishedKernelError, patches, simulate
from coremesh.testing.sim.refusals import MAX_HOST_DEVICES

pytestmark = pytest.mark.sim

MiB = 2**20
X = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def run(body: Any, scratch: list[Any], **kw: Any) -> Any:
    f = pl.kernel(
        body, out_type=X, mesh=jax_compat.tensorcore_mesh("core"), scratch_types=scratch, **kw
    )
    return jax.jit(f)(jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128))


def copy_through(x_hbm: Any, o_hbm: Any, *scratch: Any) -> None:
    pltpu.sync_copy(x_hbm, o_hbm)


@pytest.mark.parametrize(
    ("scratch", "space", "needed"),
    [
        # 256 MiB of VMEM scratch on a v5p (16 MiB scoped limit, 64 MiB physical)
        ([pltpu.VMEM((65536, 1024), jnp.float32)], "VMEM", 256 * MiB),
        # (n, 1) float32 takes whole (8, 128) tiles: 3 x 48 KiB raw, 3 x 6 MiB padded
        ([pltpu.VMEM((12288, 1), jnp.float32)] * 3, "VMEM", 18 * MiB),
        # 2 MiB of SMEM on a core with 1 MiB
        ([pltpu.SMEM((2**19,), jnp.int32)], "SMEM", 2 * MiB),
    ],
)
def test_scratch_over_the_chips_memory_is_refused_before_running(
    scratch: list[Any], space: str, needed: int
) -> None:
    chip = get_chip("v5p")
    padded = sum(padded_nbytes(s.shape, s.dtype, chip) for s in scratch)
    assert padded == needed  # the count is the compile check's, tile-padded
    with (
        simulate(chip="v5p", devices=1),
        pytest.raises(CapacityError, match=f"needs {padded / MiB:.2f} MiB of {space}") as info,
    ):
        run(copy_through, scratch)
    assert info.value.chip == "v5p"
    assert "scratch and pipeline buffers" in str(info.value)


def test_scratch_that_fits_runs() -> None:
    with simulate(chip="v5p", devices=1):
        out = run(copy_through, [pltpu.VMEM((1024, 1024), jnp.float32)])  # 4 MiB
    np.testing.assert_array_equal(np.asarray(out), np.arange(8 * 128).reshape(8, 128))


def test_raising_the_vmem_limit_lets_a_large_scratch_run() -> None:
    # 24 MiB is over v5p's 16 MiB scoped default but within its physical VMEM.
    params = pltpu.CompilerParams(vmem_limit_bytes=32 * MiB)
    scratch = [pltpu.VMEM((6144, 1024), jnp.float32)]
    with simulate(chip="v5p", devices=1):
        with pytest.raises(CapacityError, match="CompilerParams"):
            run(copy_through, scratch)
        out = run(copy_through, scratch, compiler_params=params)
    np.testing.assert_array_equal(np.asarray(out), np.arange(8 * 128).reshape(8, 128))


def test_map_blocks_pipeline_buffers_over_vmem_are_refused() -> None:
    # A 128 MiB block: the pipeline's VMEM buffers alone are 8x the scoped limit. Lowering is
    # enough to see it; nothing of that size is allocated.
    a = jax.ShapeDtypeStruct((8192, 4096), jnp.float32)
    with simulate(chip="v5p", devices=1):
        f = jax.jit(lambda x: tc.map_blocks(lambda b: b + 1, x, block=(8192, 4096)))
        with pytest.raises(CapacityError, match="of VMEM"):
            f.lower(a)


def signals_itself(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    pl.semaphore_signal(sem, 1)  # never waited for
    pltpu.sync_copy(x_hbm, o_hbm)


def signals_the_barrier(x_hbm: Any, o_hbm: Any) -> None:
    pl.semaphore_signal(pltpu.get_barrier_semaphore(), 1)  # never waited for
    pltpu.sync_copy(x_hbm, o_hbm)


def starts_a_copy(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    pltpu.make_async_copy(x_hbm, o_hbm, sem).start()  # no .wait()


def test_a_semaphore_left_above_zero_is_refused() -> None:
    with simulate(devices=1) as sim:
        with pytest.raises(UnfinishedKernelError) as info:
            run(signals_itself, [pltpu.SemaphoreType.REGULAR])
        for core in range(sim.cores_per_device):
            assert f"core {core}: semaphore #0 of the kernel (id 2000) ends at count 1" in str(
                info.value
            )


def test_a_barrier_semaphore_left_above_zero_is_refused() -> None:
    params = pltpu.CompilerParams(collective_id=3)
    with simulate(devices=1) as sim:
        with pytest.raises(UnfinishedKernelError) as info:
            run(signals_the_barrier, [], compiler_params=params)
        # both cores signalled their own core once
        assert str(info.value).count("the barrier semaphore (collective_id=3) ends at count 1") == (
            sim.cores_per_device
        )


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_a_dma_never_waited_for_is_refused(mode: str) -> None:
    with (
        simulate(devices=1, dma_execution_mode=mode),  # type: ignore[arg-type]
        pytest.raises(UnfinishedKernelError) as info,
    ):
        run(starts_a_copy, [pltpu.SemaphoreType.DMA])
    text = str(info.value)
    if mode == "on_wait":  # the copy has not happened: it waits in the semaphore's queue
        assert "1 DMA(s) signalling semaphore #0 of the kernel (id 2000) were never waited" in text
        assert "test_refusals.py" in text  # where it was started
    else:  # it ran when started, and its semaphore was never brought back to zero
        assert "semaphore #0 of the kernel (id 2000) ends at count" in text
    assert "wait" in (info.value.fix or "")


def barrier_round(x_hbm: Any, o_hbm: Any) -> None:
    sem = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(sem, 1)
    pl.semaphore_wait(sem, 1)
    pltpu.sync_copy(x_hbm, o_hbm)


def test_a_barrier_semaphore_without_a_collective_id_is_refused() -> None:
    with simulate(devices=1):
        with pytest.raises(CollectiveIdError, match="no collective_id") as info:
            run(barrier_round, [])
        assert "test_refusals.py" in str(info.value)  # the get_barrier_semaphore line
        through_coremesh = jax.jit(tc.kernel(barrier_round, out_type=X, collective_id=None))
        with pytest.raises(CollectiveIdError, match="no collective_id"):
            through_coremesh(jnp.zeros((8, 128), jnp.float32))
        # With an id it runs, and the round trip brings the barrier back to zero.
        out = run(barrier_round, [], compiler_params=pltpu.CompilerParams(collective_id=0))
    np.testing.assert_array_equal(np.asarray(out), np.arange(8 * 128).reshape(8, 128))


def tagged_barrier_round(x_hbm: Any, o_hbm: Any) -> None:
    sem = pltpu.get_barrier_semaphore("round")  # jax 0.11 and later
    pl.semaphore_signal(sem, 1)
    pl.semaphore_wait(sem, 1)
    pltpu.sync_copy(x_hbm, o_hbm)


def test_a_barrier_semaphore_whose_collective_id_jax_assigns_runs() -> None:
    # From jax 0.11 Mosaic assigns the id itself under jax_pallas_auto_assign_collective_ids
    # ('yes' / 'override') or for a tagged barrier; jax 0.10 has neither, and needs the id.
    from jax._src import config as jax_config

    want = np.arange(8 * 128).reshape(8, 128)
    auto = getattr(jax_config, "jax_pallas_auto_assign_collective_ids", None)
    with simulate(devices=1):
        if auto is None:
            with pytest.raises(CollectiveIdError, match="no collective_id"):
                run(barrier_round, [])
            return
        for mode in ("yes", "override"):
            with auto(mode):
                np.testing.assert_array_equal(np.asarray(run(barrier_round, [])), want)
        np.testing.assert_array_equal(np.asarray(run(tagged_barrier_round, [])), want)
        with pytest.raises(CollectiveIdError, match="no collective_id"):
            run(barrier_round, [])  # 'no', the default


@pytest.mark.parametrize(
    ("devices", "match"),
    [
        (10**6, "the largest v5p slice has 8960 chips"),
        (8961, "the largest v5p slice has 8960 chips"),
        (MAX_HOST_DEVICES + 1, f"this host runs at most {MAX_HOST_DEVICES}"),
        (4096, f"this host runs at most {MAX_HOST_DEVICES}"),
    ],
)
def test_more_devices_than_a_slice_or_the_host_has_are_refused(devices: int, match: str) -> None:
    with pytest.raises(MeshError, match=match):
        simulate(chip="v5p", devices=devices)
    assert patches.installed_chip() is None


def test_the_slice_limit_follows_the_chip_and_its_core_mode() -> None:
    # v5e's largest slice is 256 chips of one core each; TPU7x has two devices per chip.
    with pytest.raises(MeshError, match="the largest v5e slice has 256 chips, 256 devices"):
        simulate(chip="v5e", devices=257)
    assert get_chip("TPU7x").devices_per_chip() == 2
    with pytest.raises(MeshError, match="9216 chips, 18432 devices"):
        simulate(chip="TPU7x", devices=20000)


def test_stock_interpreter_runs_what_the_chip_refuses() -> None:
    # The kernel_refusals patch's regression: without it an unwaited DMA leaves the output
    # unwritten (NaN) and no error, and a barrier without an id fails inside a callback, as a
    # generic XLA error, or with fault_report on, a fault while running.
    with simulate(
        devices=1, disable_patches=["kernel_refusals", "fault_report", "uninitialized_reads"]
    ):
        out = np.asarray(run(starts_a_copy, [pltpu.SemaphoreType.DMA]))
        assert np.isnan(out).all()
        with pytest.raises(jax.errors.JaxRuntimeError, match="NoneType"):
            run(barrier_round, [])
    with (
        simulate(devices=1, disable_patches=["kernel_refusals"]),
        pytest.raises(SimulationFault, match="needs a collective_id") as info,
    ):
        run(barrier_round, [])
    assert info.value.operation == "pltpu.get_barrier_semaphore()"
    assert isinstance(info.value.__cause__, TypeError)


def test_a_dma_read_but_not_yet_written_is_pending_only_on_its_receive_side() -> None:
    """A sender may end once its send wait returned, with the write to the receiver still to
    run (on_wait: at the receiver's wait); the receive side stays outstanding until it does."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim.refusals import _pending_dma

    class Dma:
        def __init__(self, state: Any) -> None:
            self.state = state

        def execute_read(self) -> None: ...

        def execute_read_and_write(self) -> None: ...

    started, read, done = (Dma(ipc.DmaState[s]) for s in ("STARTED", "READ", "COMPLETED"))
    assert _pending_dma(started.execute_read) is started
    assert _pending_dma(started.execute_read_and_write) is started
    assert _pending_dma(read.execute_read) is None
    assert _pending_dma(read.execute_read_and_write) is read
    assert _pending_dma(done.execute_read) is None
    assert _pending_dma(done.execute_read_and_write) is None
    assert _pending_dma(lambda: None) is None  # a task that is not a DMA's


def scalar_op(op: Any, dtype: Any) -> Any:
    """``y[0] = op(x[1], x[2])`` on SMEM scalars: the scalar unit, as in JAX's own tests."""

    def kernel(x_ref: Any, y_ref: Any) -> None:
        y_ref[0] = op(x_ref[1], x_ref[2])

    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        out_shape=jax.ShapeDtypeStruct((3,), dtype),
    )


def vector_op(op: Any, dtype: Any) -> Any:
    """``y = op(x, x)`` on a (32, 128) VMEM block: the vector unit."""

    def kernel(x_ref: Any, y_ref: Any) -> None:
        y_ref[...] = op(x_ref[...], x_ref[...])

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), dtype))


OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": jnp.add,
    "max": jnp.maximum,
    "shift": jnp.left_shift,
}


def compile_error(fn: Any, shape: tuple[int, ...], dtype: Any) -> str | None:
    """libtpu's Mosaic compile of ``fn`` for one v5p device: its error text, or None: the
    reference the simulator's refusals are checked against."""
    from jax._src.pallas.mosaic.error_handling import MosaicError

    from coremesh.testing.aot.topology import CompileTarget

    with CompileTarget.for_chip("v5p", devices=1).activate():
        try:
            jax.jit(fn).trace(jax.ShapeDtypeStruct(shape, dtype)).lower().compile()
        except MosaicError as err:
            return " ".join(str(err).split())
    return None


@pytest.mark.parametrize("unit", ["scalar", "vector"])
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint16, jnp.int32])
def test_narrow_integer_arithmetic_is_refused_where_mosaic_refuses_it(
    unit: str, name: str, dtype: Any
) -> None:
    from jax._src.pallas.mosaic.error_handling import MosaicError

    from coremesh.testing.sim import MosaicRefusalError

    op = OPS[name]
    fn, shape = (
        (scalar_op(op, dtype), (3,)) if unit == "scalar" else (vector_op(op, dtype), (32, 128))
    )
    refused = compile_error(fn, shape, dtype)
    x = (np.arange(np.prod(shape)) % 5).astype(dtype).reshape(shape)
    with simulate("v5p", 1):
        if refused is None:
            got = np.asarray(jax.jit(fn)(x))
        else:
            with pytest.raises(MosaicRefusalError) as info:
                jax.jit(fn)(x)
    if refused is None:
        want = op(x[1], x[2]) if unit == "scalar" else op(x, x)
        np.testing.assert_array_equal(got[0] if unit == "scalar" else got, want)
        return
    assert isinstance(info.value, MosaicError)  # what code written for the chip catches
    said = str(info.value)
    words = said.split("Not implemented: ", 1)[1].split(" (", 1)[0]
    assert f"Not implemented: {words}" in refused  # Mosaic's own words
    assert "x.astype(jnp.int32)" in said


def copy_blocks(grid: tuple[int, ...], limit: int) -> Any:
    """A (128, 128) float32 copy through BlockSpec blocks, under a VMEM limit of ``limit``."""

    def kernel(x_ref: Any, y_ref: Any) -> None:
        y_ref[...] = x_ref[...]

    kw: dict[str, Any] = {}
    if grid:
        rows = 128 // grid[0]
        kw = {
            "grid": grid,
            "in_specs": [pl.BlockSpec((rows, 128), lambda i: (i, 0))],
            "out_specs": pl.BlockSpec((rows, 128), lambda i: (i, 0)),
        }
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=limit),
        **kw,
    )


@pytest.mark.parametrize(("grid", "limit"), [((), 96), ((), 128), ((2,), 96), ((2,), 128)])
def test_blockspec_blocks_count_against_the_vmem_limit_as_the_compiler_counts_them(
    grid: tuple[int, ...], limit: int
) -> None:
    from coremesh.testing.aot.topology import CompileTarget
    from coremesh.testing.sim.errors import KernelCapacityError

    fn = copy_blocks(grid, limit * 1024)
    x = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
    with CompileTarget.for_chip("v5p", devices=1).activate():
        try:
            jax.jit(fn).trace(jax.ShapeDtypeStruct(x.shape, x.dtype)).lower().compile()
            compiles = True
        except jax.errors.JaxRuntimeError:
            compiles = False
    with simulate("v5p", 1):
        if compiles:
            np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x)), x)
        else:
            with pytest.raises(KernelCapacityError) as info:
                jax.jit(fn)(x)
            assert isinstance(info.value, jax.errors.JaxRuntimeError)  # as the compile fails
            assert "BlockSpec blocks" in str(info.value)
    # one step: each block once (128 KiB); two steps: double-buffered halves (128 KiB)
    assert compiles == (limit >= 128)


@pytest.mark.parametrize("moves", [False, True])
def test_a_window_that_stays_put_is_single_buffered_as_the_compiler_does(moves: bool) -> None:
    from coremesh.testing.aot.topology import CompileTarget
    from coremesh.testing.sim.errors import KernelCapacityError

    window = 10 * MiB  # one fits v5p's 16 MiB scoped VMEM, two do not

    def body(o_ref: Any) -> None:
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

    fn = pl.pallas_call(
        body,
        grid=(4, 1),
        out_shape=jax.ShapeDtypeStruct((4 * window,), jnp.int8),
        out_specs=pl.BlockSpec(
            (window,), (lambda i, j: (i + j,)) if moves else (lambda i, j: (j,))
        ),
    )
    with CompileTarget.for_chip("v5p", devices=1).activate():
        try:
            jax.jit(fn).trace().lower().compile()
            compiles = True
        except jax.errors.JaxRuntimeError:
            compiles = False
    assert compiles is not moves
    with simulate("v5p", 1):
        if compiles:
            jax.block_until_ready(jax.jit(fn)())
            return
        with pytest.raises(KernelCapacityError) as info:
            jax.jit(fn)()
    text = str(info.value)
    assert "needs 20.00 MiB of VMEM, which would exceed memory" in text
    assert (
        "output window allocation for operator output 0 (20.00 MiB). The window shape is "
        f"i8[{window}], while the full shape is i8[{4 * window}]. This allocation has 2 "
        "buffering levels." in text
    )


def int_matmul(dtype: Any) -> Any:
    def kernel(a_ref: Any, b_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.int32)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.int32))


def lowering_error(fn: Any, dtype: Any, shapes: list[tuple[int, ...]] | None = None) -> str | None:
    """jax's Mosaic lowering of ``fn`` for one v5p device: its NotImplementedError, or None."""
    from coremesh.testing.aot.topology import CompileTarget

    args = tuple(jax.ShapeDtypeStruct(s, dtype) for s in (shapes or [(32, 256), (256, 128)]))
    with CompileTarget.for_chip("v5p", devices=1).activate():
        try:
            jax.jit(fn).trace(*args).lower().compile()
        except NotImplementedError as err:
            return str(err)
    return None


@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.uint32, jnp.int8])
def test_an_unsigned_integer_matmul_is_refused_as_mosaic_refuses_it(dtype: Any) -> None:
    from coremesh.core.errors import UnsupportedOnChipError

    fn = int_matmul(dtype)
    refused = lowering_error(fn, dtype)
    a = (np.arange(32 * 256) % 7).astype(dtype).reshape(32, 256)
    b = (np.arange(256 * 128) % 5).astype(dtype).reshape(256, 128)
    with simulate("v5p", 1):
        if refused is None:
            np.testing.assert_array_equal(
                np.asarray(jax.jit(fn)(a, b)), a.astype(np.int32) @ b.astype(np.int32)
            )
            return
        with pytest.raises(UnsupportedOnChipError) as info:
            jax.jit(fn)(a, b)
    assert isinstance(info.value, NotImplementedError)  # what code written for the chip catches
    head = f"Unsigned integer dtype {np.dtype(dtype)} is not supported for dot_general (matmul)"
    assert head in refused and head in str(info.value)
    assert "x.astype(jnp.int32)" in str(info.value)


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("dynamic_slice", lambda v: jax.lax.dynamic_slice_in_dim(v, 64, 8, 1)),
        ("rev", lambda v: jnp.flip(v, 1)),
        ("sort", lambda v: jnp.sort(v, axis=1)),
    ],
)
def test_an_operation_mosaic_cannot_lower_is_refused_with_its_words(name: str, op: Any) -> None:
    """JAX's test_lane_dynamic_slice expects the chip to refuse a dynamic slice of a value; the
    interpreter computed it. jax's lowering for v5p says the same as the simulator."""
    from coremesh.core.errors import UnsupportedOnChipError

    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jnp.zeros_like(o_ref)
        o_ref[:, :8] = op(x_ref[...])[:, :8]

    fn = pl.pallas_call(kernel, out_shape=X)
    words = f"Unimplemented primitive in Pallas TPU lowering for tc: {name}"
    refused = lowering_error(fn, jnp.float32, shapes=[(8, 128)])
    assert refused is not None and words in refused
    with simulate("v5p", 1), pytest.raises(UnsupportedOnChipError, match=words) as info:
        jax.jit(fn)(np.arange(8 * 128, dtype=np.float32).reshape(8, 128))
    assert isinstance(info.value, NotImplementedError)
    with simulate("v5p", 1):  # what Mosaic lowers still runs: a static slice, a roll
        got = jax.jit(
            pl.pallas_call(
                lambda x, o: o.__setitem__(..., pltpu.roll(x[...], 3, 1) + x[:, 0:1]), out_shape=X
            )
        )(np.arange(8 * 128, dtype=np.float32).reshape(8, 128))
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    np.testing.assert_array_equal(np.asarray(got), np.roll(x, 3, 1) + x[:, 0:1])


def test_explicit_mxu_operations_are_refused_by_name() -> None:
    """JAX's ExplicitMXUTest fifo kernels failed inside a host callback ('Cannot lower jaxpr
    with effects: ... MXUEffect'): the interpreter has no model of the MXU's registers."""
    from coremesh.testing.sim import NotSimulatedError

    def kernel(x_ref: Any, o_ref: Any) -> None:
        pltpu.matmul_push_rhs(x_ref[...], staging_register=0, mxu_index=0)
        o_ref[...] = x_ref[...]

    x = np.ones((128, 128), np.float32)
    out_shape = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    with (
        simulate("v5p", 1),
        pytest.raises(NotSimulatedError, match="explicit MXU operation 'matmul_push_rhs'"),
    ):
        jax.jit(pl.pallas_call(kernel, out_shape=out_shape))(x)


@pytest.mark.parametrize("value", ["invalid", 1])
def test_an_invalid_side_effect_type_is_refused_as_the_lowering_refuses_it(value: Any) -> None:
    """JAX's test_invalid_side_effect_type expects the TPU lowering's ValueError; the interpreter
    never reads has_side_effects and ran the kernel."""
    from coremesh.testing.aot.topology import CompileTarget
    from coremesh.testing.sim.errors import CompilerParamsError

    def copy(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...]

    def kernel(side_effects: Any) -> Any:
        params = pltpu.CompilerParams(has_side_effects=side_effects)
        return pl.pallas_call(copy, out_shape=X, compiler_params=params)

    with (
        CompileTarget.for_chip("v5p", devices=1).activate(),
        pytest.raises(ValueError, match=f"Invalid side effect type: {value}"),
    ):
        jax.jit(kernel(value)).trace(X).lower()
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    with simulate("v5p", 1), pytest.raises(CompilerParamsError, match="Invalid side effect") as e:
        jax.jit(kernel(value))(x)
    assert "pltpu.SideEffectType.PURE" in str(e.value)  # the fix names the kinds
    with simulate("v5p", 1):  # what the lowering takes still runs
        for ok in (True, pltpu.SideEffectType.DATAFLOW_SIDE_EFFECTING):
            np.testing.assert_array_equal(np.asarray(jax.jit(kernel(ok))(x)), x)


def pipeline_plus_size(x: Any, *, dynamic: bool) -> Any:
    """A kernel whose emit_pipeline (the primitive) adds the pipeline's grid size, from
    pl.num_programs, to each block; its grid size a value (``dynamic``) or an int."""

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        def body(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...] + pl.num_programs(0)

        blocks = x.shape[1] // 128
        spec = pl.BlockSpec((16, 128), lambda i: (0, i))
        grid = (jnp.array(blocks),) if dynamic else (blocks,)
        pltpu.emit_pipeline(body, grid=grid, in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
    )(x)


def test_num_programs_of_a_pipeline_with_a_run_time_grid_is_refused() -> None:
    """Mosaic answers pl.num_programs in an emit_pipeline body with the pipeline's grid size; the
    interpreter of jax 0.11 and 0.12 with the kernel's (0 past them): JAX's
    test_num_programs_vmap0 wrote 0 where the chip writes 4. A static grid is resolved as the
    pipeline is traced and runs; on jax 0.10.2 patch pipeline_primitive expands the primitive
    with the pipeline's sizes, and both run."""
    from jax._src import config

    from coremesh.testing.sim import NotSimulatedError, compat

    x = np.arange(16 * 512, dtype=np.int32).reshape(16, 512)
    answers = compat.pipeline_answers_num_programs()  # jax 0.12.1: runs as the chip does
    refused = jax_versions.at_least("0.11.0") and not answers
    with simulate("v5p", 1), config.use_emit_pipeline_primitive(True):
        np.testing.assert_array_equal(np.asarray(pipeline_plus_size(x, dynamic=False)), x + 4)
        if refused:
            with pytest.raises(NotSimulatedError, match=r"pl.num_programs\(\) in the body"):
                pipeline_plus_size(x, dynamic=True)
        else:
            np.testing.assert_array_equal(np.asarray(pipeline_plus_size(x, dynamic=True)), x + 4)
    if jax_versions.at_least("0.11.0"):  # what the refusal keeps from the user: 0 added
        with (
            simulate("v5p", 1, disable_patches=["kernel_refusals"]),
            config.use_emit_pipeline_primitive(True),
        ):
            got = np.asarray(pipeline_plus_size(x, dynamic=True))
            np.testing.assert_array_equal(got, x + 4 if answers else x)
    else:  # the gate is the patch, not the version: without it, 0.10.2 refuses too
        with (
            simulate("v5p", 1, disable_patches=["pipeline_primitive"]),
            config.use_emit_pipeline_primitive(True),
            pytest.raises(NotSimulatedError, match=r"pl.num_programs\(\) in the body"),
        ):
            pipeline_plus_size(x, dynamic=True)


def block_sum(x: Any, *, reduce_last: bool, revisit: Any = None) -> Any:
    """The (8, 128) blocks of x's 3 block rows summed into one block row, by a (3, 3) grid that
    accumulates into the output block: the reduction axis last (each output block's steps
    consecutive) or first (each block left and returned to)."""
    block = (8, 128)

    def body(x_ref: Any, o_ref: Any) -> None:
        step = pl.program_id(1 if reduce_last else 0)

        @pl.when(step == 0)
        def _() -> None:
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    mode = {} if revisit is None else {"pipeline_mode": pl.Buffered(1, revisit=revisit)}
    if reduce_last:
        in_spec = pl.BlockSpec(block, lambda j, i: (i, j))
        out_spec = pl.BlockSpec(block, lambda j, i: (0, j), **mode)
    else:
        in_spec = pl.BlockSpec(block, lambda i, j: (i, j))
        out_spec = pl.BlockSpec(block, lambda i, j: (0, j), **mode)
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((8, 384), jnp.float32),
        in_specs=[in_spec],
        out_specs=out_spec,
        grid=(3, 3),
    )(x)


def test_an_output_block_returned_to_is_a_fault_and_accumulator_mode_is_refused() -> None:
    """Leaving an output block and returning to it loses the first visits' writes on the chip
    (RevisitMode.IMMEDIATE, the default): the interpreter raised "Revisited block" as a raw
    CpuCallback error, now a SimulationFault with the rule. With revisit=RevisitMode.ANY the
    chip reads the block back, which the interpreter does not: refused by name (JAX's
    test_block_reduction_with_non_immediate_revisit)."""
    from coremesh.testing.sim import NotSimulatedError

    x = np.arange(24 * 384, dtype=np.float32).reshape(24, 384)
    expected = x.reshape(3, 8, 384).sum(axis=0)
    with simulate("v5p", 1):
        np.testing.assert_array_equal(np.asarray(block_sum(x, reduce_last=True)), expected)
        with pytest.raises(SimulationFault, match="return to an output block") as err:
            block_sum(x, reduce_last=False)
        assert "consecutive" in str(err.value)
        with pytest.raises(NotSimulatedError, match="accumulator mode"):
            block_sum(x, reduce_last=False, revisit=pl.RevisitMode.ANY)
