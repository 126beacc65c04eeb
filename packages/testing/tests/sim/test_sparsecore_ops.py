"""The simulator refuses a vector subcore kernel's operations exactly where libtpu's compile
refuses them (sim/sc_ops.py): operations Mosaic's SparseCore lowering has no rule for,
reductions along another axis, and, with the layout passes on (the default), scans,
all-reduces and, before jax 0.12, masked loads and stores. Each case is compiled with libtpu
beside the simulator's run, with and without ``needs_layout_passes``; a kernel both accept
gives numpy's answer."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core.chips import get_chip
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.aot import versions
from coremesh.testing.sim import simulate

pytestmark = pytest.mark.sim


needs_libtpu = pytest.mark.skipif(
    versions.libtpu_version() is None, reason="libtpu is not installed"
)

Body = Callable[[Any, Any], None]


def _odd(x: Any) -> Any:
    return (x % 2) == 1


def _half_slice(x: Any, o: Any) -> None:
    """Half a vector value into half the output: only the layout passes take sub-registers."""
    o[...] = jnp.zeros(o.shape, o.dtype)
    o[pl.ds(0, 4)] = x[...][:4] * 2


def _store_compressed(x: Any, o: Any) -> None:
    o[...] = jnp.zeros(o.shape, o.dtype)
    plsc.store_compressed(o.at[...], x[...], mask=_odd(x[...]))


#: name -> (body(x_ref, o_ref) over one int32 vector, numpy's answer for x or None).
CASES: dict[str, tuple[Body, Callable[[np.ndarray], np.ndarray] | None]] = {
    "add": (lambda x, o: o.__setitem__(..., x[...] * 3 + 1), lambda x: x * 3 + 1),
    "jnp.cumsum": (lambda x, o: o.__setitem__(..., jnp.cumsum(x[...])), np.cumsum),
    "jnp.sum": (
        lambda x, o: o.__setitem__(..., jnp.full(o.shape, jnp.sum(x[...]))),
        lambda x: np.full_like(x, x.sum()),
    ),
    "jnp.max": (
        lambda x, o: o.__setitem__(..., jnp.full(o.shape, jnp.max(x[...]))),
        lambda x: np.full_like(x, x.max()),
    ),
    "jnp.any": (
        lambda x, o: o.__setitem__(..., jnp.full(o.shape, jnp.any(x[...] > 5), jnp.int32)),
        lambda x: np.full_like(x, (x > 5).any()),
    ),
    "plsc.cumsum": (
        lambda x, o: o.__setitem__(..., plsc.cumsum(x[...], mask=_odd(x[...]))),
        lambda x: np.cumsum(np.where(x % 2 == 1, x, 0)),
    ),
    "plsc.all_reduce_population_count": (
        lambda x, o: o.__setitem__(..., plsc.all_reduce_population_count(_odd(x[...]))),
        lambda x: np.full_like(x, (x % 2 == 1).sum()),
    ),
    "plsc.sort_key_val": (
        lambda x, o: o.__setitem__(..., plsc.sort_key_val(x[...], x[...])[0]),
        np.sort,
    ),
    "plsc.store_compressed": (_store_compressed, None),
    "value slice": (_half_slice, None),
    # Refused after lowering, whatever the layout passes.
    "jnp.concatenate": (
        lambda x, o: o.__setitem__(..., jnp.concatenate([x[...], x[...]])[: o.shape[0]]),
        None,
    ),
    "jnp.roll": (lambda x, o: o.__setitem__(..., jnp.roll(x[...], 1)), None),
    # Refused while lowering, whatever the layout passes.
    "jnp.prod": (lambda x, o: o.__setitem__(..., jnp.full(o.shape, jnp.prod(x[...]))), None),
    "lax.cummax": (lambda x, o: o.__setitem__(..., jax.lax.cummax(x[...])), None),
    "jnp.tile": (lambda x, o: o.__setitem__(..., jnp.tile(x[pl.ds(0, 4)], 2)), None),
    "jnp.sum along axis 1": (
        lambda x, o: o.__setitem__(
            ..., jnp.full(o.shape, jnp.sum(x[...].reshape(2, -1), axis=1)[0])
        ),
        None,
    ),
}


def kernel(body: Body, lanes: int, *, layout_passes: bool) -> Any:
    """One vector subcore copies x in, runs body, copies the result out."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)

    def run(x_hbm: Any, o_hbm: Any, x: Any, o: Any) -> None:
        pltpu.sync_copy(x_hbm, x)
        body(x, o)
        pltpu.sync_copy(o, o_hbm)

    return pl.kernel(
        run,
        mesh=mesh,
        out_type=jax.ShapeDtypeStruct((lanes,), jnp.int32),
        scratch_types=[pltpu.VMEM((lanes,), jnp.int32)] * 2,
        compiler_params=pltpu.CompilerParams(needs_layout_passes=layout_passes),
    )


def libtpu_error(chip: str, make: Callable[[int], Any], dtype: Any = jnp.int32) -> str:
    """libtpu's compile for ``chip`` of ``make(lanes)``, a kernel of one vector of ``dtype``:
    its error, one line, or "" when it compiles."""
    from coremesh.testing.aot.topology import CompileTarget

    target = CompileTarget.for_chip(chip, devices=get_chip(chip).devices_per_chip())
    with target.activate():
        lanes = plsc.get_sparse_core_info().num_lanes
        spec = jax.ShapeDtypeStruct((lanes,), dtype, sharding=target.sharding(jax.P()))
        mapped = jax.shard_map(
            make(lanes), mesh=target.mesh, in_specs=(jax.P(),), out_specs=jax.P(), check_vma=False
        )
        try:
            jax.jit(mapped).trace(spec).lower().compile()
        except Exception as err:  # the compiler's own error type
            return " ".join(str(err).split())
    return ""


def libtpu_refuses(chip: str, body: Body, *, layout_passes: bool) -> str | None:
    """libtpu's compile of :func:`kernel` for ``chip``: its error, one line, or None."""
    error = libtpu_error(chip, lambda lanes: kernel(body, lanes, layout_passes=layout_passes))
    return error or None


def simulated(
    chip: str, body: Body, *, layout_passes: bool
) -> tuple[np.ndarray, np.ndarray | None, UnsupportedOnChipError | None]:
    """(x, the simulator's result or None, its refusal or None)."""
    with simulate(chip, 1):
        lanes = plsc.get_sparse_core_info().num_lanes
        x = ((np.arange(lanes) * 7) % 11 - 3).astype(np.int32)
        try:
            got = jax.jit(kernel(body, lanes, layout_passes=layout_passes))(x)
        except UnsupportedOnChipError as err:
            return x, None, err
        return x, np.asarray(got), None


@needs_libtpu
@pytest.mark.parametrize("layout_passes", [True, False], ids=["layout-passes", "no-layout-passes"])
@pytest.mark.parametrize("case", list(CASES))
def test_refused_exactly_where_libtpu_refuses(case: str, layout_passes: bool) -> None:
    body, reference = CASES[case]
    verdict = libtpu_refuses("v5p", body, layout_passes=layout_passes)
    x, got, refusal = simulated("v5p", body, layout_passes=layout_passes)
    assert (refusal is not None) == (verdict is not None), (case, verdict, refusal)
    if refusal is None:
        if reference is not None:
            np.testing.assert_array_equal(got, reference(x).astype(np.int32))
        return
    assert verdict is not None
    if "infer-vector-layout" in verdict or "Mask is not supported" in verdict:
        # Refused by the layout passes: the simulator says which setting lets it compile.
        assert "needs_layout_passes=False" in str(refusal), refusal
    else:
        # Refused while lowering, or after it for a reason no setting changes: Mosaic's words.
        words = re.sub(r"^(\w+Error: )?(INTERNAL: )?", "", verdict)
        words = re.split(r"\. Please| at location|: %", words)[0].rstrip(".")
        assert words in str(refusal), (verdict, refusal)


@needs_libtpu
@pytest.mark.parametrize("case", ["jnp.cumsum", "plsc.all_reduce_population_count", "add"])
def test_the_layout_pass_refusal_holds_on_tpu7x(case: str) -> None:
    """The scans and all-reduces are refused on TPU7x as on v5p (16 lanes against 8)."""
    body, _ = CASES[case]
    verdict = libtpu_refuses("TPU7x", body, layout_passes=True)
    _, _, refusal = simulated("TPU7x", body, layout_passes=True)
    assert (refusal is not None) == (verdict is not None), (case, verdict, refusal)


def test_the_refusal_names_the_call_and_where_it_is() -> None:
    def body(x: Any, o: Any) -> None:
        o[...] = jnp.full(o.shape, jnp.max(x[...]))

    _, _, refusal = simulated("v5p", body, layout_passes=True)
    assert refusal is not None
    text = str(refusal)
    assert "jnp.max" in text and "xir.scan" in text and "test_sparsecore_ops.py" in text, text


def smem_kernel(dtype: Any, mesh_kind: str) -> Any:
    """A scalar of ``dtype`` stored to SMEM, loaded back and stored again, on the scalar or
    the vector subcores."""
    if mesh_kind == "scalar":
        mesh: Any = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)
    else:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )

    def run(x_hbm: Any, o_hbm: Any, s: Any) -> None:
        del x_hbm, o_hbm
        s[0] = jnp.asarray(3, dtype)
        s[1] = s[0]

    return pl.kernel(
        run,
        mesh=mesh,
        out_type=jax.ShapeDtypeStruct((plsc.get_sparse_core_info().num_lanes,), jnp.int32),
        scratch_types=[pltpu.SMEM((8,), dtype)],
    )


@needs_libtpu
@pytest.mark.parametrize("mesh_kind", ["scalar", "vector"])
@pytest.mark.parametrize("dtype", ["int32", "uint32", "float32", "int16", "int8", "bfloat16"])
def test_smem_scalars_are_refused_unless_32_bits_wide(dtype: str, mesh_kind: str) -> None:
    """libtpu's SparseCore memref.load / store take i32 and f32 words only; the simulator
    refuses the narrower scalars libtpu refuses and runs the others."""
    verdict = libtpu_error("v5p", lambda lanes: smem_kernel(jnp.dtype(dtype), mesh_kind))
    refused = "only supports i32 and f32 values" in verdict
    assert refused or not verdict, verdict
    with simulate("v5p", 1):
        x = np.zeros(plsc.get_sparse_core_info().num_lanes, np.int32)
        run = jax.jit(smem_kernel(jnp.dtype(dtype), mesh_kind))
        if refused:
            with pytest.raises(UnsupportedOnChipError, match="only supports i32 and f32 values"):
                run(x)
        else:
            jax.block_until_ready(run(x))
