"""SparseCore operations (``plsc.*``) in a TensorCore kernel: Mosaic's TensorCore lowering has
no rule for them, so the simulator refuses them before the kernel runs, with Mosaic's words.
Each kernel is also compiled for the chip with libtpu, and the two verdicts must agree: what
libtpu compiles (``plsc.bitcast`` from jax 0.12, which is ``pltpu.bitcast``) runs and matches
numpy. The same operations in a SparseCore kernel still run."""

from __future__ import annotations

import dataclasses
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

import coremesh.core as cc
from coremesh.core import jax_compat, jax_versions
from coremesh.core.chips import get_chip
from coremesh.testing.aot import versions
from coremesh.testing.sim import simulate

pytestmark = [
    pytest.mark.sim,
    pytest.mark.filterwarnings("ignore:plsc.bitcast is deprecated:DeprecationWarning"),
]

#: ``plsc.bitcast`` binds ``pltpu.bitcast`` (a TensorCore primitive too) from this jax on.
BITCAST_IS_PLTPU_SINCE = "0.12.0"
#: jax 0.10 drops a ``plsc.parallel_loop`` without a carry from a ``pl.pallas_call``'s kernel
#: as it traces it (the loop and its writes are gone), so libtpu compiles what is left.
LOOP_KEPT_SINCE = "0.11.0"
#: Mosaic's refusal, for the primitive's name as the installed jax spells it.
WORDS = "Unimplemented primitive in Pallas TPU lowering for tc: {}."

Body = Callable[[Any, Any, Any, Any], None]


def _mask(i_ref: Any) -> Any:
    return i_ref[...] > 0


def _parallel_loop(x: Any, i: Any, o: Any, smem: Any) -> None:
    total = plsc.parallel_loop(0, 4, carry=jnp.int32(0))(lambda j, c: c + j)
    o[...] = x[...] + total


def _loop_without_carry(x: Any, i: Any, o: Any, smem: Any) -> None:
    @plsc.parallel_loop(0, 1)
    def _(j: Any) -> None:
        o[...] = x[...] + j


def _barrier(x: Any, i: Any, o: Any, smem: Any) -> None:
    plsc.subcore_barrier()
    o[...] = x[...]


def _fetch_and_add(x: Any, i: Any, o: Any, smem: Any) -> None:
    smem[0] = jnp.int32(0)
    o[...] = x[...] + plsc.fetch_and_add(smem.at[0], 1, subcore_id=jnp.int32(0))


def _pack(x: Any, i: Any, o: Any, smem: Any) -> None:
    a = x[...].astype(jnp.float32)
    packed = plsc.pack(a, a, format=plsc.PackFormat.INTERLEAVED)
    low, _ = plsc.unpack(packed, format=plsc.PackFormat.INTERLEAVED)
    o[...] = low.astype(jnp.int32)


def _unpack(x: Any, i: Any, o: Any, smem: Any) -> None:
    packed = jnp.zeros((2 * x.shape[0],), jnp.bfloat16)
    low, _ = plsc.unpack(packed, format=plsc.PackFormat.INTERLEAVED)
    o[...] = low.astype(jnp.int32) + x[...]


def _bitcast(x: Any, i: Any, o: Any, smem: Any) -> None:
    o[...] = plsc.bitcast(-plsc.bitcast(x[...], jnp.float32), jnp.int32)


def _set(fn: Callable[[Any, Any], Any]) -> Body:
    def body(x: Any, i: Any, o: Any, smem: Any) -> None:
        o[...] = fn(x, i)

    return body


@dataclasses.dataclass(frozen=True)
class Case:
    """A TensorCore kernel body ``(x_ref, i_ref, o_ref, smem)`` that calls ``call``, which binds
    the SparseCore primitive ``sc_primitives.<primitive>``."""

    call: str
    primitive: str
    body: Body

    def primitive_name(self) -> str | None:
        """The primitive's name on the installed jax (None where it does not exist)."""
        from jax._src.pallas.mosaic import sc_primitives

        prim = getattr(sc_primitives, self.primitive, None)
        return None if prim is None else str(prim.name)


def _sc(name: str) -> Any:
    from jax._src.pallas.mosaic import sc_primitives

    return getattr(sc_primitives, name)


CASES = {
    "load_gather": Case(
        "plsc.load_gather", "gather_p", _set(lambda x, i: plsc.load_gather(x, [i[...]]))
    ),
    "store_scatter": Case(
        "plsc.store_scatter",
        "scatter_p",
        lambda x, i, o, s: plsc.store_scatter(o, [i[...]], x[...]),
    ),
    "addupdate_scatter": Case(
        "plsc.addupdate_scatter",
        "scatter_p",
        lambda x, i, o, s: plsc.addupdate_scatter(o, [i[...]], x[...]),
    ),
    "load_expanded": Case(
        "plsc.load_expanded",
        "load_p",
        _set(lambda x, i: plsc.load_expanded(x.at[:], mask=_mask(i))),
    ),
    "store_compressed": Case(
        "plsc.store_compressed",
        "swap_p",
        lambda x, i, o, s: plsc.store_compressed(o.at[:], x[...], mask=_mask(i)),
    ),
    "addupdate": Case(
        "plsc.addupdate", "swap_p", lambda x, i, o, s: plsc.addupdate(o.at[:], x[...])
    ),
    "addupdate_compressed": Case(
        "plsc.addupdate_compressed",
        "swap_p",
        lambda x, i, o, s: plsc.addupdate_compressed(o.at[:], x[...], mask=_mask(i)),
    ),
    "cumsum": Case("plsc.cumsum", "masked_cumsum_p", _set(lambda x, i: plsc.cumsum(x[...]))),
    "cumsum_masked": Case(
        "plsc.cumsum", "masked_cumsum_p", _set(lambda x, i: plsc.cumsum(x[...], mask=_mask(i)))
    ),
    "cummax": Case(
        "plsc.cummax", "masked_cummax_p", _set(lambda x, i: plsc.cummax(x[...], mask=_mask(i)))
    ),
    "cummin": Case(
        "plsc.cummin", "masked_cummin_p", _set(lambda x, i: _sc("cummin")(x[...], mask=_mask(i)))
    ),
    "sort_key_val": Case(
        "plsc.sort_key_val",
        "masked_sort_p",
        _set(lambda x, i: plsc.sort_key_val(x[...], i[...])[0]),
    ),
    "sort_key_val_masked": Case(
        "plsc.sort_key_val",
        "masked_sort_p",
        _set(lambda x, i: plsc.sort_key_val(x[...], i[...], mask=_mask(i))[1]),
    ),
    "scan_count": Case(
        "plsc.scan_count", "scan_count_p", _set(lambda x, i: plsc.scan_count(x[...])[0])
    ),
    "all_reduce_population_count": Case(
        "plsc.all_reduce_population_count",
        "all_reduce_population_count_p",
        _set(lambda x, i: plsc.all_reduce_population_count(_mask(i))),
    ),
    "all_reduce_ffs": Case(
        "plsc.all_reduce_ffs",
        "all_reduce_ffs_p",
        _set(lambda x, i: plsc.all_reduce_ffs(_mask(i))),
    ),
    "pack": Case("plsc.pack", "pack_p", _pack),
    "unpack": Case("plsc.unpack", "unpack_p", _unpack),
    "parallel_loop": Case("plsc.parallel_loop", "parallel_loop_p", _parallel_loop),
    "parallel_loop_without_carry": Case(
        "plsc.parallel_loop", "parallel_loop_p", _loop_without_carry
    ),
    "subcore_barrier": Case("plsc.subcore_barrier", "barrier_p", _barrier),
    "fetch_and_add": Case("plsc.fetch_and_add", "fetch_and_add_p", _fetch_and_add),
    "bitcast": Case("plsc.bitcast", "bitcast_p", _bitcast),
}
FORMS = ("pallas_call", "tensorcore_mesh")


def refused_here(case: str, form: str) -> bool:
    """What libtpu 0.0.52 does with the case in a TensorCore kernel on the installed jax: every
    SparseCore primitive is refused; ``plsc.bitcast`` is none from jax 0.12 on, and jax 0.10
    leaves no carry-less ``parallel_loop`` in a ``pallas_call`` to refuse."""
    if case == "bitcast":
        return not jax_versions.at_least(BITCAST_IS_PLTPU_SINCE)
    if case == "parallel_loop_without_carry" and form == "pallas_call":
        return jax_versions.at_least(LOOP_KEPT_SINCE)
    return True


def tensorcore_kernel(case: str, lanes: int, form: str) -> Callable[[Any, Any], Any]:
    """``case``'s body in a TensorCore kernel on int32[lanes] operands: a plain
    ``pl.pallas_call`` (VMEM blocks), or ``pl.kernel`` over a one-core TensorCore mesh that
    copies its HBM operands through VMEM scratch."""
    body = CASES[case].body
    out = jax.ShapeDtypeStruct((lanes,), jnp.int32)
    smem = pltpu.SMEM((1,), jnp.int32)
    if form == "pallas_call":
        return pl.pallas_call(body, out_shape=out, scratch_shapes=[smem])  # type: ignore[no-any-return]

    def kernel(x_hbm: Any, i_hbm: Any, o_hbm: Any) -> None:
        def scoped(x: Any, i: Any, o: Any, s: Any) -> None:
            pltpu.sync_copy(x_hbm, x)
            pltpu.sync_copy(i_hbm, i)
            body(x, i, o, s)
            pltpu.sync_copy(o, o_hbm)

        vmem = pltpu.VMEM((lanes,), jnp.int32)
        pl.run_scoped(scoped, vmem, vmem, vmem, smem)

    return pl.kernel(  # type: ignore[no-any-return]
        kernel, out_type=out, mesh=jax_compat.tensorcore_mesh("core", num_cores=1)
    )


def operands(lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """x: float32 values as int32 bits (0.0 and normal numbers, which a bitcast round trip and a
    negation keep exactly); i: the lanes reversed, a valid index for every lane."""
    x = (np.arange(lanes, dtype=np.float32) - lanes // 2).view(np.int32)
    return x, np.arange(lanes, dtype=np.int32)[::-1].copy()


def libtpu_verdict(case: str, chip: str, form: str) -> str | None:
    """libtpu's Mosaic compile of the kernel for ``chip``: its error, one line, or None."""
    from coremesh.testing.aot.topology import CompileTarget

    target = CompileTarget.for_chip(chip, devices=get_chip(chip).devices_per_chip())
    with target.activate():
        lanes = pltpu.get_tpu_info().sparse_core.num_lanes
        spec = jax.ShapeDtypeStruct((lanes,), jnp.int32, sharding=target.sharding(jax.P()))
        mapped = jax.shard_map(
            tensorcore_kernel(case, lanes, form),
            mesh=target.mesh,
            in_specs=(jax.P(), jax.P()),
            out_specs=jax.P(),
            check_vma=False,
        )
        try:
            jax.jit(mapped).trace(spec, spec).lower().compile()
        except NotImplementedError as err:  # Mosaic's own type for an unlowered primitive
            return " ".join(str(err).split())
    return None


def simulated(case: str, chip: str, form: str) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel on the simulator: (x, result)."""
    with simulate(chip, 1):
        lanes = pltpu.get_tpu_info().sparse_core.num_lanes
        x, i = operands(lanes)
        return x, np.asarray(jax.jit(tensorcore_kernel(case, lanes, form))(x, i))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("chip", ["v5p", "v6e", "TPU7x"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_simulator_refuses_what_libtpu_refuses(case: str, chip: str, form: str) -> None:
    """The reference is libtpu's verdict on the same kernel for the same chip (where libtpu is
    installed; else what it said when measured, ``refused_here``), and Mosaic's words must be
    the simulator's."""
    name = CASES[case].primitive_name()
    refused = refused_here(case, form)
    words = WORDS.format(name)
    if versions.libtpu_version() is not None:
        mosaic = libtpu_verdict(case, chip, form)
        assert (mosaic is not None) == refused, mosaic
        assert mosaic is None or words in mosaic, mosaic
    if not refused:
        x, got = simulated(case, chip, form)
        if case == "bitcast":
            np.testing.assert_array_equal(got, (-x.view(np.float32)).view(np.int32))
        return
    assert name is not None, f"{CASES[case].call} is refused but binds no SparseCore primitive"
    with pytest.raises(cc.UnsupportedOnChipError) as info:
        simulated(case, chip, form)
    err = info.value
    assert words in str(err), str(err)
    assert f"calls {CASES[case].call} at " in str(err), str(err)
    assert err.chip == chip, err.chip


@pytest.mark.parametrize(
    "case", ["load_gather", "addupdate", "cumsum", "subcore_barrier", "parallel_loop"]
)
def test_the_refusal_comes_at_trace_time_and_says_where_and_how(case: str) -> None:
    """Refused while the kernel is lowered, before any of it runs, pointing at the user's line
    and at a fix."""
    with simulate("TPU7x", 1):
        lanes = pltpu.get_tpu_info().sparse_core.num_lanes
        spec = jax.ShapeDtypeStruct((lanes,), jnp.int32)
        with pytest.raises(cc.UnsupportedOnChipError) as info:
            jax.jit(tensorcore_kernel(case, lanes, "pallas_call")).trace(spec, spec).lower()
    text = str(info.value)
    assert re.search(r"at \S*test_sparsecore_in_tensorcore\.py:\d+", text), text
    assert "[TPU7x]" in text and "in a TensorCore kernel" in text, text
    assert "plsc.VectorSubcoreMesh" in (info.value.fix or ""), info.value.fix


@pytest.mark.skipif(
    not jax_versions.at_least(BITCAST_IS_PLTPU_SINCE),
    reason="plsc.bitcast is a SparseCore primitive before jax 0.12",
)
def test_bitcast_is_not_refused_from_jax_0_12() -> None:
    """From jax 0.12 ``plsc.bitcast`` is ``pltpu.bitcast``, which Mosaic lowers on the
    TensorCore: it must run, with numpy's bits."""
    x, got = simulated("bitcast", "v5p", "pallas_call")
    np.testing.assert_array_equal(got, (-x.view(np.float32)).view(np.int32))


# ------------------------------------------------------------------ on the SparseCore itself


def _scattered(x: np.ndarray, i: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    out[i] = x
    return out


#: Cases run on every vector subcore, with numpy's answer for x and i.
SPARSECORE_REFERENCE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "load_gather": lambda x, i: x[i],
    "store_scatter": _scattered,
    "cumsum": lambda x, i: np.cumsum(x).astype(np.int32),
    "sort_key_val": lambda x, i: np.sort(x),
}


@pytest.mark.parametrize("case", list(SPARSECORE_REFERENCE))
def test_the_same_operations_still_run_in_a_sparsecore_kernel(case: str) -> None:
    """The refusal is for TensorCore kernels only: on every vector subcore the same bodies
    give numpy's answer."""
    body = CASES[case].body
    with simulate("v5p", 1) as sim:
        info = pltpu.get_tpu_info().sparse_core
        lanes, subcores = info.num_lanes, info.num_subcores
        workers = info.num_cores * subcores
        x = ((np.arange(workers * lanes) * 37) % 101 - 50).astype(np.int32)
        i = np.tile(np.arange(lanes, dtype=np.int32)[::-1], workers)

        def kernel(x_hbm: Any, i_hbm: Any, o_hbm: Any, *scratch: Any) -> None:
            xv, iv, ov, smem = scratch
            w = jax.lax.axis_index("core") * subcores + jax.lax.axis_index("subcore")
            window = pl.ds(w * lanes, lanes)
            pltpu.sync_copy(x_hbm.at[window], xv)
            pltpu.sync_copy(i_hbm.at[window], iv)
            body(xv, iv, ov, smem)
            pltpu.sync_copy(ov, o_hbm.at[window])

        f = pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct(x.shape, jnp.int32),
            mesh=plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore"),
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32)] * 3 + [pltpu.SMEM((1,), jnp.int32)],
            # The cumsum is a scan, which Mosaic's layout passes refuse (sim/sc_ops.py).
            compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
        )
        got = np.asarray(sim.run(jax.jit(f), x, i)).reshape(workers, lanes)
    rows = zip(x.reshape(workers, lanes), i.reshape(workers, lanes), got, strict=True)
    for x_row, i_row, got_row in rows:
        np.testing.assert_array_equal(got_row, SPARSECORE_REFERENCE[case](x_row, i_row))
