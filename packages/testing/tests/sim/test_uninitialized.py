"""Reads of memory nobody wrote raise (the shadow "written" map), and what counts as written."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.core.errors import CoremeshError
from coremesh.testing.sim import UninitializedReadError, simulate

pytestmark = pytest.mark.sim

X = jax.ShapeDtypeStruct((8, 128), jnp.float32)
XS = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)


def scratch_call(body: Any, scratch: Any) -> Any:
    return pl.pallas_call(body, out_shape=X, scratch_shapes=[scratch])


def read_scratch(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    o_ref[...] = x_ref[...] + s_ref[...]  # s_ref was never written


def half_written(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[0:4, :] = x_ref[0:4, :]
    o_ref[...] = s_ref[...] * 2.0


def read_written_half(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[0:4, :] = x_ref[0:4, :]
    o_ref[...] = x_ref[...]
    o_ref[0:4, :] = s_ref[0:4, :] * 2


def test_stock_reads_fresh_scratch_as_nan_in_silence() -> None:
    # What the patch is for, on every jax line: without it the read returns the fill value.
    with simulate(devices=1, disable_patches=["uninitialized_reads"]):
        out = np.asarray(scratch_call(read_scratch, pltpu.VMEM((8, 128), jnp.float32))(XS))
    assert np.isnan(out).all()


def test_a_load_of_unwritten_scratch_names_kernel_line_buffer_and_range() -> None:
    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        scratch_call(read_scratch, pltpu.VMEM((8, 128), jnp.float32))(XS)
    err = info.value
    assert (err.device, err.core, err.kernel) == (0, 0, "read_scratch")
    assert err.location is not None and "test_uninitialized.py" in err.location
    assert err.buffer is not None and err.buffer.startswith("VMEM float32[8,128]")
    assert "1024 of 1024 element(s) never written" in str(err)
    assert err.fix is not None and "check_uninitialized=False" in err.fix
    assert isinstance(err, CoremeshError)


def test_the_check_can_be_turned_off() -> None:
    with simulate(devices=1, check_uninitialized=False):
        out = np.asarray(scratch_call(read_scratch, pltpu.VMEM((8, 128), jnp.float32))(XS))
    assert np.isnan(out).all()
    with pytest.raises(CoremeshError, match="check_uninitialized"):
        simulate(devices=1, check_uninitialized="yes")  # type: ignore[arg-type]


def read_scoped_poison(of: Any, oi: Any, o8: Any, ob: Any) -> None:
    def body(sf: Any, si: Any, s8: Any, sb: Any) -> None:
        # Uses, not copies (a copy hands on the states): the int8 one is a copy (Mosaic has no
        # int8 vector arithmetic).
        of[...] = sf[...] * 1.0
        oi[...] = si[...] * 1
        o8[...] = s8[...]
        ob[...] = sb[...] & True

    pl.run_scoped(
        body, *(pltpu.VMEM((8, 128), d) for d in (jnp.float32, jnp.int32, jnp.int8, jnp.bool_))
    )


def test_scoped_scratch_under_poison_buffers_holds_mosaics_poison() -> None:
    """JAX's test_poison_buffers: with jax_pallas_poison_buffers on, Mosaic stores the poison
    into each buffer it allocates in the body (run_scoped, empty_ref), so reading it is no
    unwritten read: NaN, the smallest integer, True. Poisoning off, the read is caught."""
    dtypes = (jnp.float32, jnp.int32, jnp.int8, jnp.bool_)
    out_shape = tuple(jax.ShapeDtypeStruct((8, 128), d) for d in dtypes)
    with pl.enable_poison_buffers(True), simulate(devices=1):
        outs = pl.pallas_call(read_scoped_poison, out_shape=out_shape)()
        f32, i32, i8, b = (np.asarray(o) for o in outs)
    assert np.isnan(f32).all()
    assert (i32 == np.iinfo(np.int32).min).all() and (i8 == -128).all() and b.all()
    with simulate(devices=1), pytest.raises(UninitializedReadError):
        pl.pallas_call(read_scoped_poison, out_shape=out_shape)()


def test_a_partly_written_range_reports_the_first_unwritten_element() -> None:
    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        scratch_call(half_written, pltpu.VMEM((8, 128), jnp.float32))(XS)
    assert "512 of 1024 element(s) never written, the first at (4, 0)" in str(info.value)


def test_a_value_read_unwritten_and_thrown_away_is_not_an_error() -> None:
    # JAX's megablox gmm merges `select(mask, acc, out[...])` into a block it has not written
    # yet: the unwritten values are read and discarded, as MemorySanitizer allows.
    def merge(x_ref: Any, o_ref: Any) -> None:
        keep = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0) < 8  # every row
        o_ref[...] = jnp.where(keep, x_ref[...], o_ref[...])

    with simulate(devices=1):
        out = np.asarray(pl.pallas_call(merge, out_shape=X)(XS))
    np.testing.assert_array_equal(out, XS)


def test_the_taint_follows_the_data_to_the_result_and_names_its_origin() -> None:
    def launder(x_ref: Any, o_ref: Any, s_ref: Any, t_ref: Any) -> None:
        t_ref[...] = -(s_ref[0:1, :] * 2.0 + 1.0).repeat(8, axis=0)  # line of the first read
        o_ref[...] = x_ref[...]
        o_ref[4:5, :] = t_ref[4:5, :]

    scratch = [pltpu.VMEM((8, 128), jnp.float32)] * 2
    f = pl.pallas_call(launder, out_shape=X, scratch_shapes=scratch)
    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        f(XS)
    text = str(info.value)
    assert "computed from unwritten memory: 128 of 1024 element(s) of output HBM" in text
    assert "the first at (4, 0)" in text
    assert info.value.kernel == "launder"
    assert info.value.location is not None and "launder)" in info.value.location
    assert "range [0:1, 0:128]: 128 of 128 element(s) never written" in text


def test_output_elements_the_kernel_never_wrote_hold_the_fill_as_in_stock() -> None:
    # A caller may ignore part of an output (JAX's own tests write one row and check it): only
    # values computed from unwritten memory are an error, not elements left alone.
    def top_half(x_ref: Any, o_ref: Any) -> None:
        o_ref[0:4, :] = x_ref[0:4, :]

    with simulate(devices=1):
        out = np.asarray(pl.pallas_call(top_half, out_shape=X)(XS))
    np.testing.assert_array_equal(out[0:4], XS[0:4])
    assert np.isnan(out[4:]).all()


def test_a_kernel_with_its_own_interpret_params_reads_the_fill_as_in_stock() -> None:
    # Parameters of its own configure the interpreter (JAX's interpret tests read fresh
    # memory on purpose to check the fill): such a kernel is not checked.
    f = pl.pallas_call(
        read_scratch,
        out_shape=X,
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.int32)],
        interpret=pltpu.InterpretParams(uninitialized_memory="zero"),
    )
    with simulate(devices=1):
        out = np.asarray(f(XS))
    np.testing.assert_array_equal(out, XS)  # x + 0


def test_with_a_zero_fill_a_float_load_raises_at_the_load() -> None:
    # Zeros carry no taint, so the read is reported where it happens.
    with (
        simulate(devices=1, uninitialized_memory="zero"),
        pytest.raises(UninitializedReadError, match="a load of unwritten memory") as info,
    ):
        scratch_call(read_scratch, pltpu.VMEM((8, 128), jnp.float32))(XS)
    assert info.value.location is not None and "read_scratch" in info.value.location


def test_reading_only_what_was_written_runs() -> None:
    with simulate(devices=1):
        out = np.asarray(scratch_call(read_written_half, pltpu.VMEM((8, 128), jnp.float32))(XS))
    want = XS.copy()
    want[0:4] *= 2
    np.testing.assert_array_equal(out, want)


def test_a_scalar_load_of_unwritten_smem_raises() -> None:
    def body(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
        s_ref[0] = 3
        o_ref[...] = x_ref[...] + s_ref[1].astype(jnp.float32)  # element 1 never written

    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        scratch_call(body, pltpu.SMEM((4,), jnp.int32))(XS)
    assert info.value.buffer is not None and info.value.buffer.startswith("SMEM int32[4]")
    assert info.value.index == "[1]"


def accumulate(x_ref: Any, o_ref: Any) -> None:
    @pl.when(pl.program_id(1) == 0)
    def _() -> None:
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def accumulate_without_init(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] += x_ref[...]


def row_sums(body: Any) -> Any:
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        grid=(2, 4),
        in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, k))],
        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
    )


def test_pipeline_output_blocks_start_unwritten_for_each_new_block() -> None:
    x = np.random.default_rng(0).standard_normal((16, 512)).astype(np.float32)
    with simulate(devices=1):
        out = np.asarray(row_sums(accumulate)(x))
        # The first block is caught, and the second block (the buffer then holds the first
        # block's sums: stale bytes on the chip) would be too.
        with pytest.raises(UninitializedReadError, match="accumulate_without_init"):
            row_sums(accumulate_without_init)(x)
    want = x.reshape(16, 4, 128).sum(axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_a_second_block_read_before_its_init_is_caught() -> None:
    def init_first_block_only(x_ref: Any, o_ref: Any) -> None:
        @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
        def _() -> None:
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    x = np.ones((16, 512), np.float32)
    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        row_sums(init_first_block_only)(x)
    assert "1024 of 1024" in str(info.value)


def dma_kernel(body: Any, scratch: list[Any]) -> Any:
    return pl.kernel(
        body, out_type=X, mesh=jax_compat.tensorcore_mesh("core"), scratch_types=scratch
    )


def on_core_0(body: Any) -> Any:
    def kernel(*refs: Any) -> None:
        @pl.when(jax.lax.axis_index("core") == 0)
        def _() -> None:
            body(*refs)

    kernel.__name__ = body.__name__
    return kernel


@on_core_0
def load_before_the_wait(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    fill = pltpu.make_async_copy(x_hbm, buf, sems.at[0])
    fill.start()
    early = buf[...]  # the DMA may not have landed yet: wait for it first
    fill.wait()
    buf[...] = early * 2
    pltpu.sync_copy(buf, o_hbm)


@on_core_0
def forward_more_than_was_filled(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    fill = pltpu.make_async_copy(x_hbm.at[0:4], buf.at[0:4], sems.at[0])
    fill.start()
    fill.wait()
    out = pltpu.make_async_copy(buf, o_hbm, sems.at[0])  # rows 4:8 of buf were never filled
    out.start()
    out.wait()


@on_core_0
def forward_while_a_fill_is_in_flight(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    first = pltpu.make_async_copy(x_hbm.at[0:4], buf.at[0:4], sems.at[0])
    first.start()
    first.wait()
    fill = pltpu.make_async_copy(x_hbm.at[4:8], buf.at[4:8], sems.at[0])
    fill.start()
    out = pltpu.make_async_copy(buf, o_hbm, sems.at[0])  # rows 4:8 may not have landed
    out.start()
    out.wait()  # on_wait: the newest DMA on the semaphore runs first, before the fill
    fill.wait()


@on_core_0
def forward_after_the_wait(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    fill = pltpu.make_async_copy(x_hbm, buf, sems.at[0])
    fill.start()
    fill.wait()
    out = pltpu.make_async_copy(buf, o_hbm, sems.at[1])
    out.start()
    out.wait()


SCRATCH = [pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))]


def test_a_load_before_the_filling_dma_was_waited_for_raises() -> None:
    # In the default on_wait mode a DMA lands at its wait, as late as the chip may land it.
    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        jax.jit(dma_kernel(load_before_the_wait, SCRATCH))(XS)
    assert info.value.kernel == "load_before_the_wait"
    assert "a load of unwritten memory" in str(info.value)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32])
def test_a_dma_copies_unwritten_rows_as_they_are_as_the_chip_does(dtype: Any) -> None:
    # A copy is not a use (JAX's test_compute_slice_bounded_slice_vmem forwards a partly written
    # int32 buffer whole and checks only the rows it wrote): rows 4:8 arrive unwritten, hold the
    # fill as in stock, and the result is not an error.
    x = XS.astype(dtype)
    scratch = [pltpu.VMEM((8, 128), dtype), pltpu.SemaphoreType.DMA((2,))]
    with simulate(devices=1):
        kernel = pl.kernel(
            forward_more_than_was_filled,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=jax_compat.tensorcore_mesh("core"),
            scratch_types=scratch,
        )
        out = np.asarray(jax.jit(kernel)(x))
    np.testing.assert_array_equal(out[:4], x[:4])
    if dtype == jnp.float32:
        assert np.isnan(out[4:]).all()


def test_a_dma_of_rows_a_dma_in_flight_has_not_written_names_its_semaphores() -> None:
    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        jax.jit(dma_kernel(forward_while_a_fill_is_in_flight, SCRATCH))(XS)
    text = str(info.value)
    assert info.value.kernel == "forward_while_a_fill_is_in_flight"
    assert "a DMA whose source a DMA in flight has not written yet" in text
    assert "512 of 1024 element(s) not yet written by a DMA in flight, the first at (4, 0)" in text
    # its semaphore, with the wait that last completed on it and the DMA that signalled it
    assert "destination semaphore #0 of the kernel" in text
    assert "last completed wait: device 0, core 0 at " in text
    assert "last signalled by: the DMA from device 0 (core 0) to device 0 (core 0)" in text
    assert "source semaphore" not in text  # a local copy signals only its destination


def test_a_dma_after_the_filling_wait_copies_the_data() -> None:
    with simulate(devices=1):
        out = np.asarray(jax.jit(dma_kernel(forward_after_the_wait, SCRATCH))(XS))
    np.testing.assert_array_equal(out, XS)


def test_an_entry_point_made_before_simulate_runs_inside_it() -> None:
    # A module-level pl.pallas_call binds interpret=False when it is made; stock fails on the
    # CPU, the simulator runs it in interpret mode.
    def add_one(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] + 1

    made_outside = pl.pallas_call(add_one, out_shape=X)
    with (
        simulate(devices=1, disable_patches=["made_outside"]),
        pytest.raises(ValueError, match="Only interpret mode is supported"),
    ):
        made_outside(XS)
    with simulate(devices=1):
        np.testing.assert_array_equal(np.asarray(made_outside(XS)), XS + 1)
