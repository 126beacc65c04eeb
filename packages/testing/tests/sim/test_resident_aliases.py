"""Patch ``resident_aliases`` on every supported jax line: an array kept in VMEM or SMEM between
kernels, aliased from a later kernel's operand to its result, is one buffer (against numpy);
without the patch, the result is the interpreter's fill."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import NotSimulatedError, simulate

pytestmark = pytest.mark.sim

X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)


def resident_twice_plus_one(space: Any) -> Any:
    """Kernel 1 leaves 2x in an array kept in ``space``; kernel 2 adds 1 through its operand
    only, the result aliased to it."""
    spec = pl.BlockSpec(memory_space=space)

    def double(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] * 2

    def add_one(r_ref: Any, o_ref: Any) -> None:
        del o_ref  # the same buffer as r_ref on the chip
        r_ref[...] = r_ref[...] + 1

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        kept = pl.pallas_call(double, out_shape=space(x.shape, x.dtype), out_specs=spec)(x)
        return pl.pallas_call(
            add_one,
            in_specs=[spec],
            out_specs=spec,
            out_shape=space(x.shape, x.dtype),
            input_output_aliases={0: 0},
        )(kept)

    return f


@pytest.mark.parametrize("space", [pltpu.VMEM, pltpu.SMEM], ids=["vmem", "smem"])
def test_an_aliased_resident_array_is_one_buffer(space: Any) -> None:
    x = X[:1, :16] if space is pltpu.SMEM else X
    with simulate("v5e", 1) as sim:
        got = sim.run(resident_twice_plus_one(space), jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(got), x * 2 + 1)


def test_stock_gives_the_result_a_buffer_of_its_own() -> None:
    with simulate("v5e", 1, disable_patches=["resident_aliases"], check_uninitialized=False):
        got = np.asarray(resident_twice_plus_one(pltpu.VMEM)(jnp.asarray(X)))
    assert not np.array_equal(got, X * 2 + 1)
    assert np.isnan(got).all()  # the fill: nothing the kernels wrote reached it


def refs_kept_in(space: Any, *, double: bool) -> Any:
    """x and y made with ``jax.new_ref(..., memory_space=space)``; a TensorCore-mesh kernel
    over every core copies x (times 2 if ``double``) to y (JAX's
    test_basic_ref_memory_space_constraint)."""

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        x_ref = jax.new_ref(x, memory_space=space)
        y_ref = jax.new_ref(jnp.zeros_like(x), memory_space=space)

        @pl.core_map(jax_compat.tensorcore_mesh("core"))
        def _() -> None:
            y_ref[...] = x_ref[...] * 2 if double else x_ref[...]

        return y_ref[...]

    return f


def test_an_operand_kept_in_vmem_on_one_core() -> None:
    # The interpreter refused it ("Unsupported memory space: vmem"); it compiles for v5e.
    with simulate("v5e", 1):
        got = refs_kept_in(pltpu.VMEM, double=True)(jnp.asarray(X))
    np.testing.assert_array_equal(np.asarray(got), X * 2)


def test_an_array_kept_in_smem_on_two_cores_is_refused_not_the_fill() -> None:
    # Each core has its own SMEM; the result was the fill (NaN), in silence.
    x = jnp.asarray(X[:1, :16])
    with simulate("v5p", 1), pytest.raises(NotSimulatedError, match="kept in VMEM or SMEM"):
        refs_kept_in(pltpu.SMEM, double=False)(x)


def test_an_array_kept_in_vmem_on_two_cores_is_refused_as_mosaic_refuses_it() -> None:
    # Mosaic's words (jax 0.11 and 0.12: its lowering; jax 0.10: the core_map's discharge).
    with (
        simulate("v5p", 1),
        pytest.raises(NotImplementedError, match="does not support VMEM inputs/outputs when"),
    ):
        refs_kept_in(pltpu.VMEM, double=False)(jnp.asarray(X))
