"""Patch ``kernel_key_impls`` on every supported jax line: PRNG implementations written as Pallas
kernels (``pallas_threefry2x32``, ``pallas_philox4x32``) under ``jax.jit`` and ``shard_map``.
The reference is jax's own ``threefry2x32`` (the same bits, by design of the kernel)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.random import philox, threefry  # noqa: F401 (registers)
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from coremesh.testing.sim import simulate

pytestmark = pytest.mark.sim


def _bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.bits(key, shape=shape)


@pytest.mark.parametrize("shape", [(8, 128), (35, 113), ()])
def test_pallas_threefry_under_jit_is_jax_threefry(shape: tuple[int, ...]) -> None:
    with simulate("v5p", 1), jax.threefry_partitionable(True):
        got = jax.jit(_bits, static_argnums=1)(jax.random.key(7, impl="pallas_threefry2x32"), shape)
        want = jax.jit(_bits, static_argnums=1)(jax.random.key(7, impl="threefry2x32"), shape)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_split_fold_in_and_draw_in_one_jit() -> None:
    def draws(key: jax.Array) -> jax.Array:
        a, b = jax.random.split(key)
        b = jax.random.fold_in(b, 3)
        return jnp.stack([jax.random.bits(a, (16, 128)), jax.random.bits(b, (16, 128))])

    with simulate("v5p", 1), jax.threefry_partitionable(True):
        got = jax.jit(draws)(jax.random.key(1, impl="pallas_threefry2x32"))
        want = jax.jit(draws)(jax.random.key(1, impl="threefry2x32"))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.array_equal(np.asarray(got[0]), np.asarray(got[1]))


def test_pallas_threefry_per_device_under_shard_map() -> None:
    with simulate("v5p", 2) as sim, jax.threefry_partitionable(True):
        mesh = sim.device_mesh("x")
        spec = P("x")

        def per_device(impl: str) -> np.ndarray:
            keys = jax.random.split(jax.random.key(0, impl=impl), 2)
            keys = jax.device_put(keys, NamedSharding(mesh, spec))
            draw = jax.shard_map(
                lambda k: _bits(k[0], (35, 113)),
                mesh=mesh,
                in_specs=spec,
                out_specs=spec,
                check_vma=False,
            )
            return np.asarray(jax.jit(draw)(keys))

        got, want = per_device("pallas_threefry2x32"), per_device("threefry2x32")
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got[:35], got[35:])


def test_pallas_philox_under_jit_is_its_kernel() -> None:
    key = jax.random.key(0, impl="pallas_philox4x32")
    with simulate("v5p", 1):
        got = jax.jit(_bits, static_argnums=1)(key, (137, 275))
        direct = philox.philox_random_bits(jax.random.key_data(key), 32, (137, 275))
        uniform = jax.jit(lambda k: jax.random.uniform(k, (64, 128)))(key)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(direct))
    assert len(np.unique(np.asarray(got))) > 0.99 * got.size
    u = np.asarray(uniform)
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.02


def test_stock_has_no_token_for_the_kernel() -> None:
    """Without the patch, jax's lowering finds the interpreted kernel's ordered effect with no
    token (in stock interpret mode as well)."""
    with (
        simulate("v5p", 1, disable_patches=["kernel_key_impls"]),
        pytest.raises(KeyError, match="OrderedIOEffect"),
    ):
        jax.jit(_bits, static_argnums=1)(jax.random.key(0, impl="pallas_threefry2x32"), (8, 128))
