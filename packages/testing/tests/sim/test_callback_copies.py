"""A kernel operand the interpreter allocates a buffer for is copied once on the host, not twice.

Patch ``io_callback_host_copy`` copies every callback's operands (XLA may reuse their buffers
once the callback returns) but the interpreter's buffer allocation's, which copies its value
itself before anything else (``_allocate_buffer``: ``value = np.array(val)``).
"""

from __future__ import annotations

import functools
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
    operand copied before the allocation copies it again, 64 MiB, 4x."""
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
