"""A floating division by a scalar is one rule in every program on a simulated chip (patch
``scalar_division``): ``x / c`` is ``x * (1 / c)``, whether the function runs eagerly, jitted or
under ``jax.vjp``. Stock XLA:CPU rewrites it so in some programs and not in the one ``jax.vjp``
compiles. References are numpy ``float32`` arithmetic."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from coremesh.core import jax_versions
from coremesh.testing.sim import simulate

pytestmark = pytest.mark.sim


def values() -> np.ndarray:
    """Values whose quotients by 3 are not all exact in float32 (the rewrite shows on them)."""
    return np.random.default_rng(0).random((256, 256), dtype=np.float32) * 64


def by_three(x: Any) -> Any:
    return x / 3.0


def three_ways(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``by_three`` run eagerly, jitted, and as the primal output of ``jax.vjp``."""
    device_x = jnp.asarray(x)
    eager = np.asarray(by_three(device_x))
    jitted = np.asarray(jax.jit(by_three)(device_x))
    primal = np.asarray(jax.vjp(by_three, device_x)[0])
    return eager, jitted, primal


#: The first jax whose op-by-op ``x / 3.0`` divides (IEEE) as the vjp's program does, where the
#: jitted one still multiplies by the reciprocal (measured on 0.12.1; 0.10.2 to 0.12.0.1
#: multiply op by op).
EAGER_DIVIDES_SINCE = "0.12.1"


def test_stock_xla_divides_in_the_vjp_and_multiplies_by_the_reciprocal_elsewhere() -> None:
    # The stock behaviour the patch covers, on every supported jax line: the vjp's program keeps
    # the division (IEEE, as numpy's), the jitted one multiplies by the reciprocal, and the
    # eager one does one or the other by jax release.
    x = values()
    divided, multiplied = x / np.float32(3), x * (np.float32(1) / np.float32(3))
    eager_divides = jax_versions.at_least(EAGER_DIVIDES_SINCE)
    for run in (lambda: three_ways(x), _without_patch(lambda: three_ways(x))):
        eager, jitted, primal = run()
        np.testing.assert_array_equal(primal, divided)
        np.testing.assert_array_equal(jitted, multiplied)
        np.testing.assert_array_equal(eager, divided if eager_divides else multiplied)
        assert (primal != jitted).sum() > 0


def _without_patch(run: Any) -> Any:
    def inner() -> Any:
        with simulate("v5p", 1, disable_patches=("scalar_division",)):
            return run()

    return inner


def test_every_program_multiplies_by_the_reciprocal_in_the_simulator() -> None:
    x = values()
    with simulate("v5p", 1):
        eager, jitted, primal = three_ways(x)
    expected = x * (np.float32(1) / np.float32(3))
    for got in (eager, jitted, primal):
        np.testing.assert_array_equal(got, expected)


def test_a_function_compiled_outside_is_compiled_again_inside() -> None:
    # A program that also returns its divisor keeps the division in stock XLA, as the vjp's does.
    x = jnp.asarray(values())
    with_divisor = jax.jit(lambda x, c: (x / c, c))
    outside = np.asarray(with_divisor(x, 3.0)[0])
    with simulate("v5p", 1):
        inside = np.asarray(with_divisor(x, 3.0)[0])
    np.testing.assert_array_equal(outside, np.asarray(x) / np.float32(3))
    np.testing.assert_array_equal(inside, np.asarray(x) * (np.float32(1) / np.float32(3)))


def test_array_divisors_and_integers_divide_as_upstream() -> None:
    x = values()
    y = values()[::-1] + 1
    ints = (np.arange(-50, 50, dtype=np.int32) * 7).reshape(10, 10)
    with simulate("v5p", 1):
        quotient = np.asarray(jax.vjp(lambda a: a / jnp.asarray(y), jnp.asarray(x))[0])
        truncated = np.asarray(lax.div(jnp.asarray(ints), jnp.int32(3)))
    np.testing.assert_array_equal(quotient, x / y)
    np.testing.assert_array_equal(truncated, np.trunc(ints / 3).astype(np.int32))


def test_splash_attentions_two_references_agree_after_the_chips_rounding() -> None:
    # JAX's test_splash_attention_custom_bwd compares attention_reference under jax.vjp with
    # attention_reference_custom at atol=rtol=1e-5 (float32, causal, soft cap 3.0). The
    # chip's bfloat16 operands of the softmax-times-values product make a last-bit difference
    # in tanh(logits / 3.0) a difference of 1.5e-5; with one rule for the division the two agree.
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
    )

    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    n, d = 1024, 64
    q, k, v = (jax.random.uniform(key, (n, d)) for key in (k1, k2, k3))
    mask = jnp.tril(jnp.ones((n, n), bool))
    ref = functools.partial(splash.attention_reference, mask, attn_logits_soft_cap=3.0)
    custom = functools.partial(splash.attention_reference_custom, mask, attn_logits_soft_cap=3.0)

    def both() -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(jax.vjp(ref, q, k, v, None)[0]), np.asarray(custom(q, k, v, None))

    with simulate("v5p", 1):
        primal, plain = both()
    np.testing.assert_array_equal(primal, plain)
    with simulate("v5p", 1, disable_patches=("scalar_division",)):
        stock_primal, stock_plain = both()
    if jax_versions.at_least(EAGER_DIVIDES_SINCE):  # both divide: they agree here
        np.testing.assert_array_equal(stock_primal, stock_plain)
    else:
        assert np.abs(stock_primal - stock_plain).max() > 1e-5
