"""Matrix products on a simulated chip are the MXU's (patch ``chip_matmul``): ``float32``
operands at the default precision rounded to ``bfloat16``, the contraction summed in passes of
the MXU's width (each exact, rounded to ``float32``, accumulated in order), in kernels and
outside them, so a blocked kernel and its ``jnp`` reference agree as on the chip.
References are numpy in ``float64`` of operands rounded by ``ml_dtypes``' ``bfloat16``."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core.errors import CoremeshError
from coremesh.testing.sim import simulate

pytestmark = pytest.mark.sim

N = 256
BLOCK = 64


def operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Uniform [0, 1) operands, so sums near N / 4 show an error of a few float32 ulps."""
    rng = np.random.default_rng(seed)
    return (
        rng.random((N, N), dtype=np.float32),
        rng.random((N, N), dtype=np.float32),
    )


def bf16(x: np.ndarray) -> np.ndarray:
    return x.astype(jnp.bfloat16).astype(np.float64)


def exact(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The float32 nearest each exact sum (float64 sums of these products lose nothing here)."""
    return (x.astype(np.float64) @ y.astype(np.float64)).astype(np.float32)


def passes(x: np.ndarray, y: np.ndarray, width: int) -> np.ndarray:
    """The MXU's sum: K in passes of ``width``, each exactly summed and rounded to float32,
    added in order to a float32 accumulator."""
    acc = np.zeros((x.shape[0], y.shape[1]), np.float32)
    for k in range(0, x.shape[1], width):
        acc = acc + exact(x[:, k : k + width], y[k : k + width])
    return acc


def blocked_matmul(x: Any, y: Any, block: int = BLOCK) -> Any:
    """A K-blocked Pallas matmul: each (i, j) block sums N // block products into scratch."""
    steps = N // block

    def kernel(x_ref: Any, y_ref: Any, o_ref: Any, acc: Any) -> None:
        @pl.when(pl.program_id(2) == 0)
        def _() -> None:
            acc[...] = jnp.zeros_like(acc)

        acc[...] += x_ref[...] @ y_ref[...]

        @pl.when(pl.program_id(2) == steps - 1)
        def _() -> None:
            o_ref[...] = acc[...]

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((N, N), jnp.float32),
        grid=(steps, steps, steps),
        in_specs=[
            pl.BlockSpec((block, block), lambda i, j, k: (i, k)),
            pl.BlockSpec((block, block), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((block, block), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((block, block), jnp.float32)],
    )(x, y)


def test_stock_cpu_products_are_not_the_chips() -> None:
    # Outside the simulator (and with matmul="host") XLA:CPU keeps float32 operands.
    x, y = operands()
    host = np.asarray(jnp.dot(x, y))
    assert np.abs(host - exact(x, y)).max() < 1e-3
    assert np.abs(host - exact(bf16(x), bf16(y))).max() > 1e-2
    with simulate("v5p", 1, matmul="host"):
        np.testing.assert_array_equal(np.asarray(jnp.dot(x, y)), host)


def test_default_precision_rounds_float32_operands_to_bfloat16() -> None:
    x, y = operands()
    with simulate("v5p", 1):
        eager = np.asarray(jnp.dot(x, y))
        jitted = np.asarray(jax.jit(jnp.matmul)(x, y))
        summed = np.asarray(jnp.einsum("ik,kj->ij", x, y))
    want = passes(bf16(x), bf16(y), 128)  # v5p's MXU is 128 wide
    for got in (eager, jitted, summed):
        np.testing.assert_array_equal(got, want)


def test_highest_precision_keeps_float32_operands() -> None:
    x, y = operands()
    with simulate("v5p", 1):
        got = np.asarray(jnp.dot(x, y, precision=lax.Precision.HIGHEST))
        with jax.default_matmul_precision("highest"):
            configured = np.asarray(jax.jit(jnp.dot)(x, y))
    np.testing.assert_array_equal(got, passes(x, y, 128))
    np.testing.assert_array_equal(configured, passes(x, y, 128))


def test_bfloat16_operands_sum_into_float32_and_bfloat16() -> None:
    x, y = (a.astype(jnp.bfloat16) for a in operands())
    want = passes(x, y, 128)
    with simulate("v5p", 1):
        f32 = np.asarray(jnp.dot(x, y, preferred_element_type=jnp.float32))
        b16 = np.asarray(jnp.dot(x, y))
    np.testing.assert_array_equal(f32, want)
    assert b16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(b16, want.astype(jnp.bfloat16))


def test_integer_products_lower_as_upstream() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(-100, 100, (32, 32), dtype=np.int32)
    y = rng.integers(-100, 100, (32, 32), dtype=np.int32)
    with simulate("v5p", 1):
        np.testing.assert_array_equal(np.asarray(jnp.dot(x, y)), x @ y)


@pytest.mark.parametrize("fast_path", [False, True])
def test_a_kernel_blocked_at_the_mxu_width_equals_its_reference_bit_for_bit(
    fast_path: bool,
) -> None:
    # JAX's test_stateful_matmul: on v5 (a 128-wide MXU) a kernel adding 128-deep block
    # products to float32 scratch equals x @ y at atol=0; on the host they differ by many ulps.
    x, y = operands()
    want = passes(bf16(x), bf16(y), 128)
    with simulate("v5p", 1, fast_path=fast_path):
        got = np.asarray(jax.jit(functools.partial(blocked_matmul, block=128))(x, y))
        reference = np.asarray(jnp.dot(x, y))
    np.testing.assert_array_equal(reference, want)
    np.testing.assert_array_equal(got, want)
    with simulate("v5p", 1, matmul="host", fast_path=fast_path):
        host_kernel = np.asarray(jax.jit(functools.partial(blocked_matmul, block=128))(x, y))
        host_reference = np.asarray(jnp.dot(x, y))
    assert not np.array_equal(host_kernel, host_reference)
    np.testing.assert_allclose(host_kernel, exact(x, y), rtol=1e-5)


def test_the_passes_follow_the_chips_mxu_width() -> None:
    # v6e's MXU is 256 wide: 64-deep kernel blocks no longer line up with its passes, so the
    # kernel is only within a few ulps of x @ y (JAX's test allows 2e-5 from v6 on).
    x, y = operands()
    with simulate("v6e", 1):
        reference = np.asarray(jnp.dot(x, y))
        got = np.asarray(jax.jit(blocked_matmul)(x, y))
    np.testing.assert_array_equal(reference, passes(bf16(x), bf16(y), 256))
    assert not np.array_equal(reference, passes(bf16(x), bf16(y), 128))
    ulp = np.spacing(np.abs(reference)).max()
    assert 0 < np.abs(got - reference).max() <= 4 * ulp


def test_caches_follow_the_choice() -> None:
    # One jitted function, called outside, inside and outside again: each result is its own.
    x, y = operands()
    f = jax.jit(jnp.dot)
    outside = np.asarray(f(x, y))
    with simulate("v5p", 1):
        inside = np.asarray(f(x, y))
    again = np.asarray(f(x, y))
    np.testing.assert_array_equal(inside, passes(bf16(x), bf16(y), 128))
    np.testing.assert_array_equal(again, outside)
    assert not np.array_equal(inside, outside)


def test_nan_operands_stay_nan() -> None:
    x, y = operands()
    x[3, 5] = np.nan
    with simulate("v5p", 1):
        got = np.asarray(jnp.dot(x, y))
    assert np.isnan(got[3]).all()
    assert not np.isnan(np.delete(got, 3, axis=0)).any()


def test_an_unknown_choice_is_refused() -> None:
    with pytest.raises(CoremeshError, match="matmul='mxu'") as err:
        simulate("v5p", 1, matmul="mxu")  # type: ignore[arg-type]
    assert "pass matmul='chip' or 'host'" in str(err.value)


def test_matrix_vector_products_keep_float32_operands() -> None:
    # Mosaic computes them on the VPU in float32 (JAX's test_sum_of_two_matmuls: a kernel's
    # default-precision jnp.dot of an (8, 8) matrix and a vector against HIGHEST at 1e-5).
    x, y = operands()
    v = y[:, 0].copy()
    with simulate("v5p", 1):
        got = np.asarray(jnp.dot(x, v))
    np.testing.assert_array_equal(got, exact(x, v[:, None])[:, 0])


def test_row_wise_dot_products_keep_float32_operands() -> None:
    # XLA strength-reduces a dot whose operand has only batch and contracting dimensions to a
    # multiply and a reduction (splash attention's backward di = einsum("hsd,hsd->hs", o, do),
    # checked by JAX's test against jnp.sum(o * do)); so is a product that contracts nothing.
    x, y = operands()
    o, do = x.reshape(4, 64, N), y.reshape(4, 64, N)
    with simulate("v5p", 1):
        rows = np.asarray(jnp.einsum("hsd,hsd->hs", o, do))
        outer = np.asarray(jnp.einsum("i,j->ij", x[0], y[0]))
    want = np.einsum("hsd,hsd->hs", o.astype(np.float64), do.astype(np.float64))
    np.testing.assert_array_equal(rows, want.astype(np.float32))
    np.testing.assert_array_equal(outer, np.outer(x[0], y[0]))
    # A matrix product beside them (one pass: 128 deep) still multiplies bfloat16 operands.
    o, do = o[..., :128], do[..., :128]
    with simulate("v5p", 1):
        product = np.asarray(jnp.einsum("hsd,htd->hst", o, do))
    rounded = np.einsum("hsd,htd->hst", bf16(o), bf16(do)).astype(np.float32)
    np.testing.assert_array_equal(product, rounded)
