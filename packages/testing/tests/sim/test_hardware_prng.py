"""Patch ``hardware_prng`` on every supported jax line: ``pltpu.prng_seed`` /
``prng_random_bits`` and the stateful samplers draw seeded, per-core bits; stock interpret mode
draws zeros."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import simulate

pytestmark = pytest.mark.sim

TWO_DRAWS = jax.ShapeDtypeStruct((2, 8, 128), jnp.int32)


def two_draws(*seeds: int) -> Any:
    def body(o_ref: Any) -> None:
        pltpu.prng_seed(*seeds)
        o_ref[0] = pltpu.prng_random_bits((8, 128))
        o_ref[1] = pltpu.prng_random_bits((8, 128))

    return pl.pallas_call(body, out_shape=TWO_DRAWS)


def test_stock_interpret_mode_draws_zeros() -> None:
    with simulate("v5e", 1, disable_patches=["hardware_prng"]):
        got = np.asarray(two_draws(7)())
    assert not got.any()


def test_a_seed_fixes_the_bits_and_each_draw_is_new() -> None:
    with simulate("v5e", 1):
        a, again, other, mixed = (np.asarray(two_draws(*s)()) for s in [(7,), (7,), (8,), (7, 1)])
    np.testing.assert_array_equal(a, again)
    for b in (other, mixed):
        assert (a != b).mean() > 0.99
    assert (a[0] != a[1]).mean() > 0.99
    words = a.view(np.uint32).ravel()
    assert len(np.unique(words)) == words.size
    ones = (words[:, None] >> np.arange(32, dtype=np.uint32)) & 1  # every bit a fair coin
    assert np.all(np.abs(ones.mean(axis=0) - 0.5) < 0.05)


def test_each_core_has_its_own_generator() -> None:
    def body(o_hbm: Any, draws: Any) -> None:
        core = jax.lax.axis_index("core")
        pltpu.prng_seed(11)  # the same seed on both cores: the same bits
        draws[0] = pltpu.prng_random_bits((8, 128))
        pltpu.prng_seed(core)  # now one seed per core
        draws[1] = pltpu.prng_random_bits((8, 128))
        pltpu.sync_copy(draws, o_hbm.at[core])

    with simulate("v5p", 1) as sim:
        f = pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((2, 2, 8, 128), jnp.int32),
            mesh=jax_compat.tensorcore_mesh("core"),
            scratch_types=[pltpu.VMEM((2, 8, 128), jnp.int32)],
        )
        got = np.asarray(sim.run(jax.jit(f)))
    np.testing.assert_array_equal(got[0, 0], got[1, 0])
    assert (got[0, 1] != got[1, 1]).mean() > 0.99


def test_stateful_uniform_samples_the_unit_interval() -> None:
    def body(o_ref: Any) -> None:
        pltpu.prng_seed(3)
        o_ref[...] = pltpu.stateful_uniform(shape=o_ref.shape)

    with simulate("v5e", 1):
        u = np.asarray(
            pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32))()
        )
    assert u.min() >= 0.0 and u.max() < 1.0
    counts, _ = np.histogram(u, bins=8, range=(0.0, 1.0))
    assert np.all(np.abs(counts / u.size - 1 / 8) < 0.01)
