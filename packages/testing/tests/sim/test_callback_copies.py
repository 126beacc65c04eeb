"""A kernel operand the interpreter allocates a buffer for is copied once on the host, not
twice or three times.

Patch ``io_callback_host_copy`` copies every callback's operands (XLA may reuse their buffers
once the callback returns) but the interpreter's buffer allocation's, which copies its value
itself before anything else (``_allocate_buffer``: ``value = np.array(val)``). Patch
``padding_copy`` keeps that copy as the buffer when the chip's tiles need no padding, where the
interpreter's ``_get_with_padding`` would copy it once more.
"""

from __future__ import annotations

import functools
import inspect
import tracemalloc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import coremesh.testing as ct
from coremesh.testing.sim.patches import allocates_a_copy


def _allocate(*args: Any, **kw: Any) -> None:
    del args, kw


def _wrapper(f: Any, *args: Any, **kw: Any) -> Any:
    return f(*args, **kw)


class _Flat:
    """What ``io_callback``'s implementation gets: the staged function as ``callback_func``."""

    def __init__(self, f: Any) -> None:
        self.callback_func = f


def test_the_allocation_is_known_however_it_was_staged() -> None:
    assert allocates_a_copy(_Flat(_allocate), _allocate)  # as is: jax 0.10
    keywords = functools.partial(_allocate, padded_shape=None, source_info=None)
    assert allocates_a_copy(_Flat(keywords), _allocate)  # its keywords bound: jax 0.11 on
    # inside the uninitialized-read check's wrapper
    assert allocates_a_copy(_Flat(functools.partial(_wrapper, keywords)), _allocate)
    assert allocates_a_copy(_Flat(functools.partial(_wrapper, _allocate)), _allocate)


def test_any_other_callback_is_copied() -> None:
    def _allocate_buffer(*args: Any) -> None:  # a user's function of the interpreter's name
        del args

    for callback in (
        _Flat(print),
        _Flat(_allocate_buffer),
        _Flat(functools.partial(_wrapper, print)),
        _Flat(functools.partial(_wrapper)),
        _Flat(None),
        object(),
    ):
        assert not allocates_a_copy(callback, _allocate)


def test_a_dma_kernel_holds_one_host_copy_of_its_operand() -> None:
    """The numpy bytes a warm call holds at its peak, by hand for a 16 MiB HBM operand ``x`` and
    an 8 MiB result: the interpreter's buffer of ``x`` (16 MiB) and four of the result's size
    (its buffer, from the uninitialized array the interpreter stages; the DMA's read of the
    source; the result read back; the source half's write), 48 MiB, 3x ``x``. With the
    operand copied before the allocation copies it again, 64 MiB, 4x. Patch ``padding_copy``
    lowers the measured peak to 42 MiB, 2.6x (48 MiB without it; 2026-12-07, jax 0.10.2 and
    0.12.0.1)."""
    x = jax.lax.broadcasted_iota(jnp.float32, (2, 4096, 512), 0)

    def kernel(index: Any, x_hbm: Any, y_hbm: Any, sem: Any) -> None:
        pltpu.async_copy(x_hbm.at[index[0]], y_hbm.at[:], sem).wait()

    with ct.simulate("v5p", 1, fast_path=False):
        run = pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.SemaphoreType.DMA],
            ),
            out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
        )
        index = jnp.array([1], jnp.int32)
        jax.block_until_ready(run(index, x))  # traced and compiled outside the count
        tracemalloc.start()
        try:
            y = jax.block_until_ready(run(index, x))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x)[1])
    assert peak < 3.5 * x.nbytes, f"{peak / x.nbytes:.2f}x the operand"


def _takes_the_padded_shape() -> bool:
    """Does upstream's padding step take the padded shape (jax 0.12) or work it out (0.10, 0.11)?
    Asked outside the simulator, whose patch takes any arguments."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return "padded_shape" in inspect.signature(ipc._get_with_padding).parameters


_TAKES_THE_PADDED_SHAPE = _takes_the_padded_shape()


def _padding_of(x: np.ndarray) -> np.ndarray:
    """What the allocation's padding step gives ``x`` on the installed jax."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    if _TAKES_THE_PADDED_SHAPE:
        padded = ipc._get_padded_shape(x.shape, x.dtype)
        return ipc._get_with_padding(x, padded, "nan")  # type: ignore[no-any-return]
    return ipc._get_with_padding(x, "nan")  # type: ignore[no-any-return]


def test_whole_tiles_are_not_copied_to_pad_them() -> None:
    whole = np.arange(16 * 256, dtype=np.float32).reshape(16, 256)  # (8, 128) tiles
    with ct.simulate("v5p", 1):
        assert _padding_of(whole) is whole
    with ct.simulate("v5p", 1, disable_patches=["padding_copy"]):
        stock = _padding_of(whole)  # upstream: a new array, equal to the value
    assert stock is not whole
    np.testing.assert_array_equal(stock, whole)


def test_a_shape_short_of_whole_tiles_is_still_padded() -> None:
    ragged = np.arange(5 * 130, dtype=np.float32).reshape(5, 130)
    with ct.simulate("v5p", 1):
        padded = _padding_of(ragged)
    assert padded.shape == (8, 256)  # float32 tiles are (8, 128)
    np.testing.assert_array_equal(padded[:5, :130], ragged)
    assert np.isnan(padded[5:, :]).all() and np.isnan(padded[:, 130:]).all()


def test_an_operand_in_whole_tiles_is_held_twice_at_its_allocation_not_three_times() -> None:
    """The numpy bytes a warm call holds at its peak, by hand for a 32 MiB HBM operand ``x`` of
    which the kernel copies one (8, 2048) row block out: ``x`` as the allocation callback gets
    it from XLA and the allocation's own copy, which is the buffer: 2x ``x``. The stock padding
    step adds its padded copy while both are alive: 3x."""
    x = jax.lax.broadcasted_iota(jnp.float32, (4096, 2048), 0)

    def kernel(x_hbm: Any, y_hbm: Any, sem: Any) -> None:
        pltpu.async_copy(x_hbm.at[pl.ds(8, 8)], y_hbm, sem).wait()

    peaks = {}
    for disabled in ((), ("padding_copy",)):
        with ct.simulate("v5p", 1, fast_path=False, disable_patches=disabled):
            run = pl.pallas_call(
                kernel,
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.SemaphoreType.DMA],
                out_shape=jax.ShapeDtypeStruct((8, 2048), x.dtype),
            )
            jax.block_until_ready(run(x))  # traced and compiled outside the count
            tracemalloc.start()
            try:
                y = jax.block_until_ready(run(x))
                _, peaks[disabled] = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x)[8:16])
    assert peaks[()] < 2.5 * x.nbytes, f"{peaks[()] / x.nbytes:.2f}x the operand"
    assert peaks[("padding_copy",)] > 2.5 * x.nbytes  # the stock padding's copy
