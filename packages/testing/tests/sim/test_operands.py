"""The simulator takes the operands Mosaic lowers and refuses, clearly, the ones it does not or the
interpreter cannot run (``coremesh.testing.sim.operands``); the compile checks at the end show
what libtpu's compiler does with the same kernels."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from coremesh.core import UnsupportedOnChipError, jax_versions
from coremesh.core.dtypes import BOOL_OPERANDS_SINCE
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.sim import simulate

SHAPE = (8, 128)


def masked(x: jax.Array, mask: jax.Array) -> jax.Array:
    """``where(mask, x, 0)`` with a bool operand in a VMEM block (no DMA of it)."""

    def kernel(x_ref: jax.Array, m_ref: jax.Array, o_ref: jax.Array) -> None:
        o_ref[...] = jnp.where(m_ref[...], x_ref[...], 0.0)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.float32))(x, mask)


def positive(x: jax.Array) -> jax.Array:
    """``x > 0`` as a bool result."""

    def kernel(x_ref: jax.Array, o_ref: jax.Array) -> None:
        o_ref[...] = x_ref[...] > 0

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.bool_))(x)


def bool_dma(mask: jax.Array) -> jax.Array:
    """The mask copied by an explicit DMA into VMEM, then as int32."""

    def kernel(m_hbm: jax.Array, o_ref: jax.Array, m_vmem: jax.Array, sem: jax.Array) -> None:
        pltpu.make_async_copy(m_hbm, m_vmem, sem).start()
        pltpu.make_async_copy(m_hbm, m_vmem, sem).wait()
        o_ref[...] = m_vmem[...].astype(jnp.int32)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.int32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM(SHAPE, jnp.bool_), pltpu.SemaphoreType.DMA],
    )(mask)


def inputs() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    return x, x > 0.5


@pytest.mark.sim
def test_bool_operands_and_results_in_vmem_blocks_run() -> None:
    x, mask = inputs()
    with simulate("v5p", 1) as sim:
        got = sim.run(jax.jit(masked), x, mask)
        got_bool = sim.run(jax.jit(positive), x)
    np.testing.assert_array_equal(np.asarray(got), np.where(mask, x, 0.0))
    np.testing.assert_array_equal(np.asarray(got_bool), x > 0)


@pytest.mark.sim
def test_a_bool_dma_is_refused_where_mosaic_refuses_it() -> None:
    _, mask = inputs()
    with simulate("v5p", 1) as sim:
        if jax_versions.at_least(BOOL_OPERANDS_SINCE):
            got = sim.run(jax.jit(bool_dma), mask)
            np.testing.assert_array_equal(np.asarray(got), mask.astype(np.int32))
        else:
            with pytest.raises(UnsupportedOnChipError, match="DMAs with bool dtypes"):
                jax.jit(bool_dma)(mask)


def key_operand(key: jax.Array, space: Any = pltpu.SMEM) -> jax.Array:
    """Random bits from a PRNG key operand (a block in ``space``)."""

    def kernel(key_ref: jax.Array, o_ref: jax.Array) -> None:
        o_ref[...] = jax.random.bits(key_ref[...], SHAPE)

    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=space)],
        out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.uint32),
    )(key)


@pytest.mark.sim
@pytest.mark.parametrize("space", [pltpu.SMEM, pltpu.VMEM], ids=["smem", "vmem"])
def test_key_operands_run_or_are_refused_not_crashed(space: Any) -> None:
    # The interpreter failed on them with "nan + key<fry>" (its buffers), and the VMEM budget
    # check with "Cannot interpret 'key<fry>' as a data type". Patch key_refs runs them
    # (tests/sim/test_key_refs.py); without it they are refused. Semaphore operands and results
    # run: tests/sim/test_kernel_semaphores.py.
    key = jax.random.key(0)
    with simulate("v5p", 1):
        got = jax.jit(partial(key_operand, space=space))(key)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.random.bits(key, SHAPE)))
    with (
        simulate("v5p", 1, disable_patches=["key_refs"]),
        pytest.raises(UnsupportedOnChipError, match="PRNG keys"),
    ):
        jax.jit(partial(key_operand, space=space))(key)


def compiles(fn: object, target: CompileTarget, *args: jax.ShapeDtypeStruct) -> None:
    """Compile ``fn`` with libtpu for ``target``'s chip, one copy per device (shard_map)."""
    sharded = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=target.sharding(P())) for a in args]
    spec = tuple(P() for _ in args)
    with target.activate():
        mapped = jax.shard_map(fn, mesh=target.mesh, in_specs=spec, out_specs=P(), check_vma=False)
        jax.jit(mapped).trace(*sharded).lower().compile()


F32 = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
BOOL = jax.ShapeDtypeStruct(SHAPE, jnp.bool_)


@pytest.mark.aot(chips=("v5p", "TPU7x"), devices=2)
def test_mosaic_compiles_bool_operands_and_results(aot_target: CompileTarget) -> None:
    compiles(masked, aot_target, F32, BOOL)
    compiles(positive, aot_target, F32)


@pytest.mark.aot(chips=("v5p", "TPU7x"), devices=2)
def test_mosaic_compiles_a_bool_dma_from_jax_0_11(aot_target: CompileTarget) -> None:
    if jax_versions.at_least(BOOL_OPERANDS_SINCE):
        compiles(bool_dma, aot_target, BOOL)
    else:
        with pytest.raises(NotImplementedError, match="DMAs with bool dtypes are not supported"):
            compiles(bool_dma, aot_target, BOOL)
