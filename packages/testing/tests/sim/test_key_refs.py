"""Patch ``key_refs`` on every supported jax line: kernels whose operands, results and scratch are
PRNG keys run, against jax.random outside the kernel and numpy; stock interpret mode's failure;
what stays refused."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.pallas.mosaic import random as pallas_random
from jax._src.random import threefry2x32
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim import NotSimulatedError, simulate

pytestmark = pytest.mark.sim

SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
ANY = pl.BlockSpec(memory_space=pl.ANY)
BITS = jax.ShapeDtypeStruct((8, 128), jnp.uint32)


def fry(seed: int = 0) -> jax.Array:
    return jax.random.key(seed, impl="threefry2x32")


def pallas_key(seed: int = 0) -> jax.Array:
    return pltpu.to_pallas_key(jax.random.key(seed, impl="rbg"))


def draw_bits(key: jax.Array, spec: Any = VMEM) -> jax.Array:
    def body(key_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jax.random.bits(key_ref[...], shape=o_ref.shape)

    return pl.pallas_call(body, in_specs=[spec], out_shape=BITS)(key)


def test_stock_interpret_mode_cannot_run_a_key_operand() -> None:
    # Outside the simulator, as a user of stock interpret mode runs it (every supported line).
    with pltpu.force_tpu_interpret_mode(), pytest.raises(Exception, match="nan \\+ key<") as err:
        jax.block_until_ready(draw_bits(fry()))
    assert not isinstance(err.value, UnsupportedOnChipError)


def test_without_the_patch_the_simulator_refuses_it() -> None:
    with (
        simulate("v5e", 1, disable_patches=["key_refs"]),
        pytest.raises(UnsupportedOnChipError, match="PRNG keys"),
    ):
        draw_bits(fry())


@pytest.mark.parametrize(
    "sampler",
    [
        partial(jax.random.uniform, dtype=jnp.float32),
        partial(jax.random.normal, dtype=jnp.float32),
        partial(jax.random.bits, dtype=jnp.uint32),
    ],
    ids=["uniform", "normal", "bits"],
)
def test_a_threefry_key_samples_in_the_kernel_as_jax_does(sampler: Any) -> None:
    dtype = sampler.keywords["dtype"]

    def body(key_ref: Any, o_ref: Any) -> None:
        o_ref[...] = sampler(key_ref[...], shape=o_ref.shape)

    with simulate("v5e", 1), jax.threefry_partitionable(True):
        got = pl.pallas_call(
            body, in_specs=[VMEM], out_shape=jax.ShapeDtypeStruct((16, 128), dtype)
        )(fry(3))
        want = sampler(fry(3), shape=(16, 128))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_block_of_keys_per_grid_step() -> None:
    """Key blocks move with the grid: step i loads keys[i], both through the index map and
    through an indexer on the block."""
    keys = jax.random.split(fry(5), 4)

    def body(key_ref: Any, o_ref: Any) -> None:
        o_ref[0] = jax.random.bits(key_ref.at[0][...], shape=(8, 128))

    with simulate("v5e", 1):
        got = pl.pallas_call(
            body,
            grid=(4,),
            in_specs=[pl.BlockSpec((1,), lambda i: (i,))],
            out_specs=pl.BlockSpec((1, 8, 128), lambda i: (i, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((4, 8, 128), jnp.uint32),
        )(keys)
    want = np.stack([np.asarray(jax.random.bits(k, (8, 128))) for k in keys])
    np.testing.assert_array_equal(np.asarray(got), want)


def test_keys_as_results() -> None:
    """A key stored into a key result comes back as that key: folded in the kernel, as jax
    folds it outside."""
    keys = jax.random.split(fry(1), 2)

    def body(key_ref: Any, o_ref: Any) -> None:
        o_ref[0] = jax.random.fold_in(key_ref[1], 7)
        o_ref[1] = key_ref[0]

    with simulate("v5e", 1):
        got = jax.jit(
            pl.pallas_call(
                body,
                in_specs=[SMEM],
                out_specs=SMEM,
                out_shape=jax.ShapeDtypeStruct((2,), keys.dtype),
            )
        )(keys)
    assert got.dtype == keys.dtype
    want = np.stack(
        [jax.random.key_data(jax.random.fold_in(keys[1], 7)), jax.random.key_data(keys[0])]
    )
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)), want)


def test_keys_copied_by_dma_into_scratch() -> None:
    """A key in HBM, copied into VMEM scratch (a scratch operand and a run_scoped one) and back
    out into a key result in HBM."""

    def body(key_hbm: Any, bits_ref: Any, key_out: Any, scratch: Any) -> None:
        pltpu.sync_copy(key_hbm.at[1], scratch)
        bits_ref[...] = jax.random.bits(scratch[...], shape=bits_ref.shape)

        def scoped(copy: Any) -> None:
            pltpu.sync_copy(key_hbm, copy)
            pltpu.sync_copy(copy.at[0], key_out)

        pl.run_scoped(scoped, pltpu.VMEM((2,), key_hbm.dtype))

    keys = jax.random.split(fry(9), 2)
    with simulate("v5e", 1):
        bits, key = pl.pallas_call(
            body,
            in_specs=[ANY],
            out_specs=(VMEM, ANY),
            out_shape=(BITS, jax.ShapeDtypeStruct((), keys.dtype)),
            scratch_shapes=[pltpu.VMEM((), keys.dtype)],
        )(keys)
    np.testing.assert_array_equal(np.asarray(bits), np.asarray(jax.random.bits(keys[1], (8, 128))))
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(key)), np.asarray(jax.random.key_data(keys[0]))
    )


def test_key_refs_under_control_flow() -> None:
    """Key loads in a pl.when, a fori_loop of static trip count (a scan) and one sized at run
    time (a while loop)."""
    keys = jax.random.split(fry(2), 5)

    def body(key_ref: Any, o_ref: Any) -> None:
        @pl.when(pl.program_id(0) == 0)
        def _() -> None:
            o_ref[0] = jax.random.bits(key_ref[0], shape=(8, 128))

        def draw(i: Any, carry: Any) -> Any:
            o_ref[i] = jax.random.bits(key_ref[i], shape=(8, 128))
            return carry

        jax.lax.fori_loop(1, 3, draw, 0)
        jax.lax.fori_loop(3, 3 + 2 * (pl.program_id(0) + 1), draw, 0)

    with simulate("v5e", 1):
        got = pl.pallas_call(
            body,
            grid=(1,),
            in_specs=[SMEM],
            out_shape=jax.ShapeDtypeStruct((5, 8, 128), jnp.uint32),
        )(keys)
    want = np.stack([np.asarray(jax.random.bits(k, (8, 128))) for k in keys])
    np.testing.assert_array_equal(np.asarray(got), want)


def test_a_key_ref_through_a_reshape_is_refused() -> None:
    def body(key_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jax.random.bits(key_ref.reshape(2, 1)[1, 0], shape=o_ref.shape)

    with simulate("v5e", 1), pytest.raises(NotSimulatedError, match="ReshapeTransform"):
        pl.pallas_call(body, in_specs=[SMEM], out_shape=BITS)(jax.random.split(fry(), 2))


def key_in_a_core_map(key: jax.Array) -> jax.Array:
    """Each core copies the key from HBM into SMEM scratch and samples with it (JAX's
    test_key_in_core_map)."""
    mesh = jax_compat.tensorcore_mesh("core")
    cores = jax_compat.mesh_cores(mesh)

    def body(key_hbm: Any, o_hbm: Any, key_smem: Any, o_vmem: Any) -> None:
        pltpu.sync_copy(key_hbm, key_smem)
        o_vmem[...] = jax.random.uniform(key_smem[...], shape=o_vmem.shape)
        pltpu.sync_copy(o_vmem, o_hbm.at[jax.lax.axis_index("core")])

    return pl.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((cores, 8, 128), jnp.float32),
        mesh=mesh,
        scratch_types=[pltpu.SMEM((), key.dtype), pltpu.VMEM((8, 128), jnp.float32)],
    )(key)


def test_a_key_in_a_core_map() -> None:
    with simulate("v5p", 1) as sim:
        got = np.asarray(sim.run(jax.jit(key_in_a_core_map), fry(4)))
    assert got.shape[0] == 2
    want = np.asarray(jax.random.uniform(fry(4), (8, 128)))
    for core in got:
        np.testing.assert_array_equal(core, want)


# pallas_tpu keys: the TensorCore's PRNG ----------------------------------------------------


def test_a_pallas_key_holds_its_key_data() -> None:
    key = pallas_key(2)

    def body(key_ref: Any, o_ref: Any) -> None:
        o_ref[0, 0], o_ref[0, 1] = pallas_random.unwrap_pallas_seed(key_ref[...])

    with simulate("v5e", 1):
        got = pl.pallas_call(
            body,
            in_specs=[SMEM],
            out_specs=SMEM,
            out_shape=jax.ShapeDtypeStruct((1, 2), jnp.uint32),
        )(key)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.random.key_data(key)))


def seeded_bits(words: np.ndarray) -> jax.Array:
    """The hardware PRNG's bits after seeding it with ``words``, as Mosaic lowers a pallas_tpu
    key's random_bits (pallas/mosaic/random.py _random_bits)."""

    def body(o_ref: Any) -> None:
        pltpu.prng_seed(*(jnp.uint32(w) for w in words))
        o_ref[...] = jax.lax.bitcast_convert_type(pltpu.prng_random_bits(o_ref.shape), jnp.uint32)

    return pl.pallas_call(body, out_shape=BITS)()


def test_a_pallas_key_draws_the_hardware_prng_seeded_with_its_words() -> None:
    keys = [pallas_key(0), pallas_key(0), pallas_key(1)]
    with simulate("v5e", 1):
        a, again, other = (np.asarray(draw_bits(k, SMEM)) for k in keys)
        want = np.asarray(seeded_bits(np.asarray(jax.random.key_data(keys[0])).ravel()))
    np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(a, again)
    assert (a != other).mean() > 0.99
    assert len(np.unique(a)) > 0.99 * a.size


def test_fold_in_of_a_pallas_key_is_the_impls() -> None:
    """fold_in mixes the message into the key's words as pallas/mosaic/random.py does (a
    threefry round), and the folded key draws other bits."""
    key = pallas_key(6)

    def body(key_ref: Any, words_ref: Any, bits_ref: Any) -> None:
        key = key_ref[...]
        folded = jax.random.fold_in(key, jnp.uint32(2))
        words_ref[0, 0], words_ref[0, 1] = pallas_random.unwrap_pallas_seed(folded)
        bits_ref[0] = jax.random.bits(key, shape=(8, 128))
        bits_ref[1] = jax.random.bits(folded, shape=(8, 128))

    with simulate("v5e", 1):
        words, bits = pl.pallas_call(
            body,
            in_specs=[SMEM],
            out_specs=(SMEM, VMEM),
            out_shape=(
                jax.ShapeDtypeStruct((1, 2), jnp.uint32),
                jax.ShapeDtypeStruct((2, 8, 128), jnp.uint32),
            ),
        )(key)
    k0, k1 = np.asarray(jax.random.key_data(key)).ravel()
    want = threefry2x32.apply_round([jnp.uint32(k0), jnp.uint32(k1) + jnp.uint32(2)], 13)
    np.testing.assert_array_equal(np.asarray(words).ravel(), np.asarray(want))
    bits = np.asarray(bits)
    assert (bits[0] != bits[1]).mean() > 0.99


def test_prng_seed_of_a_pallas_key_seeds_with_its_words() -> None:
    key = pallas_key(8)

    def body(key_ref: Any, o_ref: Any) -> None:
        pltpu.prng_seed(key_ref[...])
        o_ref[...] = jax.lax.bitcast_convert_type(pltpu.prng_random_bits(o_ref.shape), jnp.uint32)

    with simulate("v5e", 1):
        got = np.asarray(pl.pallas_call(body, in_specs=[SMEM], out_shape=BITS)(key))
        want = np.asarray(seeded_bits(np.asarray(jax.random.key_data(key)).ravel()))
    np.testing.assert_array_equal(got, want)


# What stays refused ------------------------------------------------------------------------


def test_a_pallas_key_loaded_from_vmem_is_refused_as_mosaic_refuses_it() -> None:
    with simulate("v5e", 1), pytest.raises(UnsupportedOnChipError, match="loaded from SMEM"):
        draw_bits(pallas_key(), VMEM)


def test_several_pallas_keys_in_one_load_are_refused() -> None:
    def body(key_ref: Any, o_ref: Any) -> None:
        keys = key_ref[...]
        o_ref[...] = jax.random.bits(keys[0], shape=o_ref.shape)

    keys = jnp.stack([pallas_key(0), pallas_key(1)])
    with simulate("v5e", 1), pytest.raises(UnsupportedOnChipError, match="single key per load"):
        pl.pallas_call(body, in_specs=[SMEM], out_shape=BITS)(keys)
