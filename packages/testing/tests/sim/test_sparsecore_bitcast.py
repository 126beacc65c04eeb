"""Patch ``sparsecore_bitcast`` on every supported jax line: ``plsc.bitcast`` in a vector
subcore kernel gives ``numpy.ndarray.view``'s bits, same width (int32 and float32, NaN payloads
and subnormals kept) and across widths (the minormost dimension scaled, 1-D and 2-D, also inside
a ``plsc.parallel_loop``). Stock, before jax 0.12 the primitive has no interpreter rule and no
CPU lowering (with the patch off the simulator refuses it by name); jax 0.12 runs it itself."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.testing.sim import NotSimulatedError, simulate
from coremesh.testing.sim.patches import PATCHES

pytestmark = pytest.mark.sim

PATCH = next(p for p in PATCHES if p.name == "sparsecore_bitcast")
#: The subcores of one SparseCore of a v5p, each bitcasting its own row.
SUBCORES = 16
#: What the stock interpreter says before jax 0.12: the core's program does not compile.
STOCK_FAILURE = "MLIR translation rule for primitive 'bitcast' not found for platform cpu"


def bits(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    """Random bit patterns as ``dtype`` (NaNs with payloads and subnormals among the floats)."""
    raw = np.random.default_rng(seed).integers(0, 256, (*shape, np.dtype(dtype).itemsize))
    out: np.ndarray = raw.astype(np.uint8).view(dtype).reshape(shape)
    return out


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def bitcast_kernel(
    row: tuple[int, ...], src: Any, dst: Any, *, layout_passes: bool = True, loop: bool = False
) -> Any:
    """A kernel over one SparseCore's vector subcores: subcore s copies row s of x (each row
    ``row``-shaped) to VMEM, bitcasts it to ``dst`` (in a ``plsc.parallel_loop`` over the
    leading axis if ``loop``) and copies the result to row s of the output."""
    out_row = (*row[:-1], row[-1] * np.dtype(src).itemsize // np.dtype(dst).itemsize)
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)
    params = (
        {}
        if layout_passes
        else {"compiler_params": pltpu.CompilerParams(needs_layout_passes=False)}
    )

    @pl.kernel(
        out_type=jax.ShapeDtypeStruct((SUBCORES, *out_row), dst),
        mesh=mesh,
        scratch_types=[pltpu.VMEM(row, src), pltpu.VMEM(out_row, dst)],
        **params,
    )
    def kernel(x_hbm: Any, o_hbm: Any, x_v: Any, o_v: Any) -> None:
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[s], x_v)
        if loop:

            @plsc.parallel_loop(0, row[0])
            def _(i: Any) -> None:
                o_v[i] = plsc.bitcast(x_v[i], dst)

        else:
            o_v[...] = plsc.bitcast(x_v[...], dst)
        pltpu.sync_copy(o_v, o_hbm.at[s])

    return jax.jit(kernel)


def run(row: tuple[int, ...], src: Any, dst: Any, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the kernel's result, numpy's view of the same bits) for random rows."""
    x = bits((SUBCORES, *row), src)
    with simulate("v5p", 1) as sim:
        got = np.asarray(sim.run(bitcast_kernel(row, src, dst, **kw), x))
    return got, x.view(dst)


def round_trip_kernel(shape: tuple[int, ...]) -> Any:
    """Subcore s bitcasts row s of int32 x to float32 (the first result) and its absolute
    value back to int32 (the second)."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)

    @pl.kernel(
        out_type=(
            jax.ShapeDtypeStruct(shape, jnp.float32),
            jax.ShapeDtypeStruct(shape, jnp.int32),
        ),
        mesh=mesh,
        scratch_types=[pltpu.VMEM(shape[1:], jnp.int32), pltpu.VMEM(shape[1:], jnp.float32)],
        compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
    )
    def kernel(x_hbm: Any, f_hbm: Any, i_hbm: Any, x_v: Any, f_v: Any) -> None:
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[s], x_v)
        as_float = plsc.bitcast(x_v[...], jnp.float32)
        f_v[...] = as_float
        pltpu.sync_copy(f_v, f_hbm.at[s])
        x_v[...] = plsc.bitcast(jnp.abs(as_float), jnp.int32)
        pltpu.sync_copy(x_v, i_hbm.at[s])

    return jax.jit(kernel)


def test_int32_as_float32_and_back_keeps_every_bit() -> None:
    """Same width: the words are reinterpreted, not converted (a float op on the way back,
    abs, clears just the sign bit). Row 0: NaNs with payloads, -0.0, inf, 1.0, subnormals."""
    x = bits((SUBCORES, 8), np.int32)
    x[0] = [0x7FC00001, 0x7F800001, -0x7FFFFFFF, 1, -0x80000000, 0x7F800000, 0x3F800000, -1]
    with simulate("v5p", 1) as sim:
        floats, ints = (np.asarray(a) for a in sim.run(round_trip_kernel(x.shape), x))
    same_bits(floats, x.view(np.float32))
    same_bits(ints, x & 0x7FFFFFFF)


@pytest.mark.parametrize(
    ("row", "src", "dst"),
    [
        ((8,), jnp.int32, jnp.int8),  # JAX's test_bitcast: (num_lanes,) int32, register-shaped
        ((8,), jnp.int32, jnp.int16),
        ((32,), jnp.int8, jnp.int32),
        ((16,), jnp.int16, jnp.int32),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_width_changing_bitcasts_are_numpys_view(row: tuple[int, ...], src: Any, dst: Any) -> None:
    """Narrow elements pack into a wide one lowest index in the lowest bits, and a wide one
    splits the same way, as ``ndarray.view`` (with Mosaic's register shapes, no layout passes:
    libtpu for v5p compiles each of these)."""
    got, want = run(row, src, dst, layout_passes=False)
    same_bits(got, want)


@pytest.mark.parametrize(("src", "dst"), [(jnp.int32, jnp.int16), (jnp.bfloat16, jnp.float32)])
def test_a_2d_bitcast_scales_only_the_minormost_dimension(src: Any, dst: Any) -> None:
    """Unlike ``pltpu.bitcast``'s default (the second-minor dimension), rows stay rows."""
    got, want = run((2, 16), src, dst)
    same_bits(got, want)


def test_a_bitcast_inside_a_parallel_loop() -> None:
    """A loop body is a jaxpr level of its own, which the patch rewrites as the kernel's."""
    got, want = run((4, 8), jnp.int32, jnp.int16, loop=True)
    same_bits(got, want)


def test_a_width_the_minor_dimension_cannot_hold_is_refused_when_traced() -> None:
    """The shapes the rule gets are those jax's own check lets through, on every line."""
    with pytest.raises(ValueError, match=r"Cannot bitcast from int8|cannot be perfectly packed"):
        jax.jit(lambda x: plsc.bitcast(x, jnp.int32)).trace(np.zeros(6, np.int8))


def test_stock_refuses_plsc_bitcast_by_name_without_the_patch() -> None:
    x = bits((SUBCORES, 8), np.int32)
    with simulate("v5p", 1, disable_patches=["sparsecore_bitcast"]) as sim:
        f = bitcast_kernel((8,), jnp.int32, jnp.int16, layout_passes=False)
        if PATCH.needed():
            with pytest.raises(NotSimulatedError, match=r"plsc\.bitcast is not simulated"):
                sim.run(f, x)
        else:  # jax 0.12: pltpu.bitcast(dim=-1), which the interpreter runs
            same_bits(np.asarray(sim.run(f, x)), x.view(np.int16))


def test_stock_interpreter_has_no_rule_before_jax_0_12() -> None:
    # Without patch sparsecore_primitives' refusal either, the interpreter's fallback binds
    # the primitive on the loaded value and the core's program does not compile for the host.
    x = bits((SUBCORES, 8), np.int32)
    off = ["sparsecore_bitcast", "sparsecore_primitives"]
    with simulate("v5p", 1, disable_patches=off) as sim:
        f = bitcast_kernel((8,), jnp.int32, jnp.int16, layout_passes=False)
        if PATCH.needed():
            with pytest.raises(NotImplementedError, match=STOCK_FAILURE):
                sim.run(f, x)
        else:
            same_bits(np.asarray(sim.run(f, x)), x.view(np.int16))
