"""Patch ``value_ops`` on every supported jax line: ``pltpu.pack_elementwise``,
``unpack_elementwise`` and ``stochastic_round`` against numpy, ``trace_value`` and ``touch``
leaving results alone; without the patch, the refusal naming the primitive XLA:CPU cannot lower,
or jax's own failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.testing.sim import NotSimulatedError, simulate

pytestmark = pytest.mark.sim

SHAPE = (8, 128)


def run(
    body: Callable[..., None],
    out: Any,
    *args: Any,
    chip: str = "v5e",
    stock: bool = False,
    also_disabled: tuple[str, ...] = (),
) -> np.ndarray:
    call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(SHAPE, out))
    disabled = ["value_ops", *also_disabled] if stock else list(also_disabled)
    with simulate(chip, 1, disable_patches=disabled) as sim:
        return np.asarray(sim.run(call, *args))


def low_bits(x: np.ndarray, width: int) -> np.ndarray:
    return x.astype(np.int64) & ((1 << width) - 1)


@pytest.mark.parametrize(
    ("wide", "narrow"), [(jnp.int32, jnp.int8), (jnp.int16, jnp.int8), (jnp.int8, jnp.int4)]
)
def test_pack_elementwise_puts_source_i_in_bits_i(wide: Any, narrow: Any) -> None:
    w, p = jnp.iinfo(wide).bits, jnp.iinfo(narrow).bits
    rng = np.random.default_rng(0)
    xs = rng.integers(-(1 << (w - 1)), 1 << (w - 1), (w // p, *SHAPE))

    def body(xs_ref: Any, o_ref: Any) -> None:
        o_ref[...] = pltpu.pack_elementwise([xs_ref[i] for i in range(w // p)], packed_dtype=narrow)

    got = run(body, np.dtype(f"uint{w}"), jnp.asarray(xs, wide))
    want = sum(low_bits(xs[i], p) << (i * p) for i in range(w // p))
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_unpack_elementwise_sign_extends_field_index(index: int) -> None:
    rng = np.random.default_rng(1)
    packed = rng.integers(-(2**31), 2**31, SHAPE).astype(np.int32)

    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = pltpu.unpack_elementwise(
            x_ref[...], index=index, packed_dtype=jnp.int8, unpacked_dtype=jnp.int32
        )

    want = packed.view(np.uint8).reshape(*SHAPE, 4)[..., index].view(np.int8).astype(np.int32)
    np.testing.assert_array_equal(run(body, jnp.int32, packed), want)


def test_bfloat16_pairs_round_trip() -> None:
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((2, *SHAPE)).astype(np.float32)

    def body(xs_ref: Any, o_ref: Any) -> None:
        word = pltpu.pack_elementwise([xs_ref[0], xs_ref[1]], packed_dtype=jnp.bfloat16)
        o_ref[...] = pltpu.unpack_elementwise(
            word, index=1, packed_dtype=jnp.bfloat16, unpacked_dtype=jnp.float32
        )

    want = xs[1].astype(ml_dtypes.bfloat16).astype(np.float32)  # round to nearest even
    np.testing.assert_array_equal(run(body, jnp.float32, xs), want)


def rounding(bits: np.ndarray, x: np.ndarray) -> np.ndarray:
    def body(x_ref: Any, b_ref: Any, o_ref: Any) -> None:
        o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...], target_dtype=jnp.bfloat16)

    return run(body, jnp.bfloat16, x, bits).astype(np.float32)


def neighbours(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bfloat16 values just below and just above each of ``x`` (numpy and ml_dtypes)."""
    near = x.astype(ml_dtypes.bfloat16)
    low = np.where(near.astype(np.float32) > x, np.nextafter(near, near - 1), near)
    high = np.where(near.astype(np.float32) < x, np.nextafter(near, near + 1), near)
    return low.astype(np.float32), high.astype(np.float32)


def test_stochastic_round_takes_a_neighbour_chosen_by_the_bits() -> None:
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    low, high = neighbours(x)
    np.testing.assert_array_equal(rounding(np.zeros(SHAPE, np.uint32), x), high)  # draw 0: up
    np.testing.assert_array_equal(rounding(np.full(SHAPE, 2**32 - 1, np.uint32), x), low)


def test_stochastic_round_is_unbiased() -> None:
    x = np.full(SHAPE, 1.0 + 2.0**-9, np.float32)  # a quarter of the way from 1 to the next bf16
    bits = np.random.default_rng(4).integers(0, 2**32, SHAPE, dtype=np.uint64).astype(np.uint32)
    got = rounding(bits, x)
    low, high = neighbours(x)
    assert set(np.unique(got)) <= {float(low[0, 0]), float(high[0, 0])}
    up = float(np.mean(got == high))
    assert abs(up - 0.25) < 0.05, up  # 1024 draws: 0.25 within about 3.7 standard errors


def test_value_ops_stock() -> None:
    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = pltpu.unpack_elementwise(
            x_ref[...], index=0, packed_dtype=jnp.int8, unpacked_dtype=jnp.int32
        )

    x = np.zeros(SHAPE, np.int32)
    # A 1-core chip's kernel is lowered with the caller's program: XLA's own error, at the call.
    with pytest.raises(NotImplementedError, match="'unpack_elementwise' not found for platform"):
        run(body, jnp.int32, x, stock=True)
    # So is a 2-core chip's kernel that leaves core 1 no grid step (patch idle_cores).
    with pytest.raises(NotImplementedError, match="'unpack_elementwise' not found for platform"):
        run(body, jnp.int32, x, chip="v5p", stock=True)
    # Cores that share the grid compile inside a host callback (a raw 'CpuCallback error'
    # stock): the simulator names the primitive instead.
    with pytest.raises(
        NotSimulatedError, match="'unpack_elementwise' in this kernel is not simulated"
    ):
        run(body, jnp.int32, x, chip="v5p", stock=True, also_disabled=("idle_cores",))


def traced(x_ref: Any, o_ref: Any) -> None:
    pltpu.trace_value("first_row_sum", jnp.sum(x_ref[0, :]))
    o_ref[...] = x_ref[...] * 2


@pytest.mark.parametrize("chip", ["v5e", "v5p"])
def test_trace_value_leaves_the_result_alone(chip: str) -> None:
    x = np.arange(8 * 128, dtype=np.float32).reshape(SHAPE)
    np.testing.assert_array_equal(run(traced, jnp.float32, x, chip=chip), x * 2)


def test_trace_value_stock() -> None:
    """jax 0.12's interpreter drops trace_value itself; before, XLA:CPU has no rule for it."""
    from coremesh.core import jax_versions
    from coremesh.testing.sim.value_ops import TRACE_VALUE_INTERPRETED_SINCE

    x = np.ones(SHAPE, np.float32)
    if jax_versions.at_least(TRACE_VALUE_INTERPRETED_SINCE):
        np.testing.assert_array_equal(run(traced, jnp.float32, x, stock=True), x * 2)
    else:
        with pytest.raises(NotImplementedError, match="'trace_value' not found for platform"):
            run(traced, jnp.float32, x, stock=True)


def touched(x_ref: Any, o_ref: Any) -> None:
    pltpu.touch(x_ref)
    o_ref[...] = x_ref[...] + 1
    pltpu.touch(o_ref)


@pytest.mark.parametrize("chip", ["v5e", "v5p"])
def test_touch_leaves_the_result_alone(chip: str) -> None:
    x = np.arange(8 * 128, dtype=np.float32).reshape(SHAPE)
    np.testing.assert_array_equal(run(touched, jnp.float32, x, chip=chip), x + 1)


def test_touch_in_a_vmapped_kernel_over_a_mesh() -> None:
    """As JAX's MPMD test_vmap: a touch in a batched kernel (vmap makes it a grid, so a loop
    whose body holds the touch)."""
    from coremesh.core import jax_compat

    def body(x_hbm: Any, o_hbm: Any) -> None:
        pltpu.sync_copy(x_hbm, o_hbm)
        pltpu.touch(o_hbm)  # jax 0.12.1 refuses a touch (a write) of an input passed as an array

    x = np.arange(8 * 128, dtype=np.float32).reshape(1, *SHAPE)  # jax 0.10 and 0.11 batch 1 only
    with simulate("v5p", 1):
        kernel = pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(SHAPE, jnp.float32),
            mesh=jax_compat.tensorcore_mesh("core", num_cores=1),
        )
        got = np.asarray(jax.jit(jax.vmap(kernel))(x))
    np.testing.assert_array_equal(got, x)


def test_touch_stock() -> None:
    """No interpreter has a rule for touch: the fallback's effect names no input of the
    program, and tracing it fails in jax (a different error from jax 0.11 on)."""
    x = np.zeros(SHAPE, np.float32)
    with pytest.raises(
        (ValueError, AttributeError),
        match=r"does not have a corresponding jaxpr input|no attribute 'arg_names'",
    ):
        run(touched, jnp.float32, x, stock=True)
