"""Patch ``kernels_under_remat`` on every supported jax line: the gradient of a ``jax.checkpoint``
of a function that calls a kernel, against numpy's, with and without a remat policy, for a
``pallas_call``, a ``pl.kernel`` over a TensorCore mesh (JAX's ``test_remat_with_checkpoint``) and
a ``pl.core_map``, and inside a ``scan``, a ``cond`` and a ``shard_map``.
Stock interpret mode refuses the kernel's effects there; a user's own ``io_callback`` in a
checkpoint is refused inside the simulator as outside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.ad_checkpoint
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import simulate

pytestmark = pytest.mark.sim

#: jax's words, 0.10.2 ("partial-eval of") and 0.12 ("AD of").
REFUSED = r"Effects not supported in (partial-eval|AD) of `checkpoint`/`remat`"


def cubed(x: jax.Array) -> jax.Array:
    """x ** 3 in a pallas_call (its derivative 3 x ** 2 comes from jax, through custom_vjp)."""

    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] * x_ref[...] * x_ref[...]

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@jax.custom_vjp
def kernel_cubed(x: jax.Array) -> jax.Array:
    return cubed(x)


def _fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return cubed(x), x


def _bwd(x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (3.0 * x * x * g,)


kernel_cubed.defvjp(_fwd, _bwd)


def copied(x: jax.Array) -> jax.Array:
    """A pl.kernel over one TensorCore copying its operand (JAX's test_remat_with_checkpoint)."""
    mesh = jax_compat.tensorcore_mesh("tc", num_cores=1)
    return pl.kernel(pltpu.sync_copy, mesh=mesh, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@jax.custom_vjp
def kernel_copied(x: jax.Array) -> jax.Array:
    return copied(x)


kernel_copied.defvjp(lambda x: (copied(x), ()), lambda _, g: (g,))


def doubled_in_place(x: jax.Array) -> jax.Array:
    """A pl.core_map over one TensorCore that doubles an HBM ref in place through VMEM (jax
    0.10.2 to 0.12.0.1 have a core_map primitive of its own; 0.12.1 traces it as an mpmd_map)."""
    mesh = jax_compat.tensorcore_mesh("tc", num_cores=1)
    ref = jax.new_ref(x)

    @pl.core_map(mesh)
    def _() -> None:
        def scaled(vmem: Any) -> None:
            pltpu.sync_copy(ref, vmem)
            vmem[...] = vmem[...] * 2.0
            pltpu.sync_copy(vmem, ref)

        pl.run_scoped(scaled, pltpu.VMEM(x.shape, x.dtype))

    return jax.freeze(ref)


@jax.custom_vjp
def kernel_doubled(x: jax.Array) -> jax.Array:
    return doubled_in_place(x)


kernel_doubled.defvjp(lambda x: (doubled_in_place(x), ()), lambda _, g: (2.0 * g,))


def remat_loss(kernel: Callable[[jax.Array], jax.Array], *, policy: bool) -> Any:
    """sum(kernel(2 x)) with the block rematerialized (saving only 2 x when ``policy``)."""

    def block(x: jax.Array) -> jax.Array:
        return kernel(jax.ad_checkpoint.checkpoint_name(x * 2.0, name="y"))

    saved = jax.checkpoint_policies.save_only_these_names("y") if policy else None
    return lambda x: jax.remat(block, policy=saved)(x).sum()


X = np.linspace(-1.0, 1.0, 8 * 128, dtype=np.float32).reshape(8, 128)


@pytest.mark.parametrize("policy", [False, True], ids=["checkpoint", "policy"])
def test_the_gradient_through_a_checkpointed_kernel_is_numpys(policy: bool) -> None:
    with simulate("v5p", devices=1):
        grad_cubed = np.asarray(jax.grad(remat_loss(kernel_cubed, policy=policy))(X))
        grad_copied = np.asarray(jax.grad(remat_loss(kernel_copied, policy=policy))(X))
        # jit: jax 0.10.2's core_map has no rule to run op by op
        grad_doubled = np.asarray(jax.jit(jax.grad(remat_loss(kernel_doubled, policy=policy)))(X))
    np.testing.assert_allclose(grad_cubed, 3.0 * (2.0 * X) ** 2 * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(grad_copied, np.full_like(X, 2.0))
    np.testing.assert_array_equal(grad_doubled, np.full_like(X, 4.0))


@pytest.mark.parametrize("kernel", [kernel_cubed, kernel_copied, kernel_doubled])
def test_stock_refuses_a_kernel_under_checkpoint(kernel: Callable[[jax.Array], jax.Array]) -> None:
    with (
        simulate("v5p", devices=1, disable_patches=["kernels_under_remat"]),
        pytest.raises(NotImplementedError, match=REFUSED),
    ):
        jax.jit(jax.grad(remat_loss(kernel, policy=False)))(X)


def test_a_checkpointed_kernel_in_a_scan_under_jit() -> None:
    """Lowered inside a loop body and a jit: the kernel's token threads through both."""

    def step(carry: jax.Array, _: None) -> tuple[jax.Array, None]:
        return jax.checkpoint(kernel_cubed)(carry) * 0.5, None

    loss = jax.jit(jax.grad(lambda x: jax.lax.scan(step, x, None, length=2)[0].sum()))
    with simulate("v5p", devices=1):
        got = np.asarray(loss(X))
    # f(x) = ((x^3 / 2)^3) / 2 = x^9 / 16: f'(x) = 9 x^8 / 16
    np.testing.assert_allclose(got, 9.0 * X**8 / 16.0, rtol=1e-5, atol=1e-7)


def test_a_users_io_callback_under_checkpoint_is_still_refused() -> None:
    """The kernel's effects are allowed under remat, not jax's IO effects: as on a TPU."""

    def host_double(x: jax.Array) -> jax.Array:
        return io_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    @jax.custom_vjp
    def doubled(x: jax.Array) -> jax.Array:
        return host_double(x)

    doubled.defvjp(lambda x: (host_double(x), ()), lambda _, g: (2.0 * g,))
    with simulate("v5p", devices=1), pytest.raises(NotImplementedError, match=REFUSED):
        jax.grad(jax.checkpoint(lambda x: (kernel_cubed(x) + doubled(x)).sum()))(X)


def test_a_checkpointed_kernel_in_a_cond_and_a_shard_map() -> None:
    """A checkpoint around a cond that calls the kernel, and a checkpointed kernel per device of
    a shard_map over two simulated devices."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def branch(x: jax.Array) -> jax.Array:
        return jax.lax.cond(x.sum() > -1e9, kernel_cubed, lambda y: y, x).sum()

    with simulate("v5p", devices=2):
        got = np.asarray(jax.jit(jax.grad(jax.checkpoint(branch)))(X))
        mesh = jax.make_mesh((2,), ("d",))
        per_device = jax.shard_map(
            jax.checkpoint(kernel_cubed),
            mesh=mesh,
            in_specs=P("d"),
            out_specs=P("d"),
            check_vma=False,
        )
        both = np.concatenate([X, -X])
        xs = jax.device_put(both, NamedSharding(mesh, P("d")))
        got_sharded = np.asarray(jax.jit(jax.grad(lambda x: per_device(x).sum()))(xs))
    np.testing.assert_allclose(got, 3.0 * X**2, rtol=1e-6)
    np.testing.assert_allclose(got_sharded, 3.0 * both**2, rtol=1e-6)
