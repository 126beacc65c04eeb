"""What Mosaic refuses in a SparseCore vector subcore's operations, the simulator refuses; the
interpreter would compute any of them on the CPU.

Measured with libtpu 0.0.52 for v5p and TPU7x, jax 0.10.2, 0.11.2 and 0.12.0.1
(tests/sim/test_sparsecore_ops.py compiles each case beside the simulator's verdict):

* while lowering, whatever ``needs_layout_passes`` says (and, for loads and stores,
  :mod:`.sc_accesses`' rules, one of which holds only without the layout passes):
  - an operation with no SparseCore rule ("Unimplemented primitive in Pallas TPU lowering for
    sc_vector_subcore: reduce_prod"): ``jnp.prod``, ``jnp.argmax``, ``lax.cummax``,
    ``jnp.tile``, ``pltpu.store`` with a mask (``masked_swap``; the SparseCore's masked store
    is ``plsc.store_compressed``), ...;
  - a reduction along an axis other than 0 ("reductions require axes to be (0,) on
    SparseCore");
  - a ``jnp.cumsum`` of more than one axis, along another, or reversed ("must be rank 1");
  - a scalar of SMEM that is not 32 bits wide ("'memref.load' op only supports i32 and f32
    values"), which holds for a scalar subcore kernel too (:func:`check_scalar_subcore_kernel`);
* after lowering, whatever the layout passes: a concatenation of vectors (``jnp.concatenate``,
  ``jnp.roll``: "Concatenation along tiled dimensions" with them, "failed to legalize
  operation 'xir.concatenate'" without); without them, a slice of a vector value to fewer
  lanes ("failed to legalize operation 'vector.extract_strided_slice'");
* in Mosaic's layout passes, on by default (``needs_layout_passes=True``):
  - scans and all-reduces (``xir.scan``, ``xir.all_reduce``: "Operation not supported in the
    Mosaic-SC infer-vector-layout pass"): ``jnp.cumsum``, ``jnp.sum`` / ``max`` / ``min`` /
    ``all`` / ``any``, ``plsc.cumsum`` / ``cummax`` / ``cummin``,
    ``plsc.all_reduce_ffs`` / ``all_reduce_population_count``;
  - masked loads and stores (``plsc.load_expanded``, ``store_compressed``,
    ``addupdate_compressed``: "Mask is not supported") before jax 0.12, whose lowering
    compiles them;

and, from jax 0.11, ``plsc.pack`` / ``unpack`` with the layout passes on, which their lowering
refuses itself. Lowering refusals come first, in the kernel's order, as Mosaic lowers the whole
kernel before its passes run. JAX's own SparseCore tests pass ``needs_layout_passes=False``, as
a kernel with these operations must.
"""

from __future__ import annotations

import functools
from typing import Any

from coremesh.core import jax_versions
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim.faults import user_location
from coremesh.testing.sim.jaxprs import all_eqns, kernel_primitives, sub_jaxprs
from coremesh.testing.sim.sc_accesses import access_refusal, smem_width_refusal

#: The first jax whose ``plsc.pack`` / ``unpack`` lowering refuses Mosaic's layout passes
#: (sc_primitives.py ``_pack_lowering_rule``: 0.11.2 and 0.12.0.1 do, 0.10.2 does not).
PACK_LAYOUT_PASSES_REFUSED_SINCE = "0.11.0"
#: The first jax whose masked SparseCore loads and stores pass the layout passes (libtpu
#: 0.0.52 refuses them from jax 0.10.2 and 0.11.2, "Mask is not supported"; 0.12.0.1 compiles).
MASKED_ACCESS_LAYOUT_FIXED_IN = "0.12.0"

#: The call behind each operation the layout passes refuse as a scan or an all-reduce.
_SCANS = {
    "cumsum": "jnp.cumsum",
    "reduce_sum": "jnp.sum",
    "reduce_max": "jnp.max",
    "reduce_min": "jnp.min",
    "reduce_and": "jnp.all",
    "reduce_or": "jnp.any",
    "masked_cumsum": "plsc.cumsum",
    "masked_cummax": "plsc.cummax",
    "masked_cummin": "plsc.cummin",
    "all_reduce_ffs": "plsc.all_reduce_ffs",
    "all_reduce_population_count": "plsc.all_reduce_population_count",
}
#: The SparseCore reductions Mosaic lowers itself (sc_primitives.py ``_reduce_op_lowering_rule``).
_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})

_LAYOUT_FIX = (
    "pass compiler_params=pltpu.CompilerParams(needs_layout_passes=False) to the kernel, as "
    "JAX's own SparseCore tests do"
)


def check_subcore_kernel(
    jaxpr: Any, mesh: Any, *, label: str, chip: str, compiler_params: Any
) -> None:
    """The checks of a kernel over ``mesh``: a vector or a scalar subcore mesh's (any other
    mesh's kernel is not judged here)."""
    kind = type(mesh).__name__
    if kind == "VectorSubcoreMesh":
        check_vector_subcore_kernel(jaxpr, label=label, chip=chip, compiler_params=compiler_params)
    elif kind == "ScalarSubcoreMesh":
        check_scalar_subcore_kernel(jaxpr, label=label, chip=chip)


def check_vector_subcore_kernel(jaxpr: Any, *, label: str, chip: str, compiler_params: Any) -> None:
    """Raise Mosaic's refusal of the first operation of ``jaxpr`` (a vector subcore kernel) its
    SparseCore lowering refuses, else of the first its passes after lowering refuse."""
    eqns = all_eqns(jaxpr)
    layout_passes = getattr(compiler_params, "needs_layout_passes", True) is not False
    for eqn in eqns:
        what = (
            access_refusal(eqn, layout_passes=layout_passes)
            or _unlowered(eqn)
            or _reduction(eqn)
            or cumsum_refusal(eqn)
            or (_pack(eqn) if layout_passes else None)
        )
        if what is not None:
            text, rule, fix = what
            raise UnsupportedOnChipError(
                f"{label}: {text}{_at(eqn)}", rule=rule, chip=chip, fix=fix
            )
    for eqn in eqns:
        err = (
            _layout_refusal(eqn, label=label, chip=chip)
            if layout_passes
            else _legalize_refusal(eqn, label=label, chip=chip)
        ) or _concatenate_refusal(eqn, layout_passes, label=label, chip=chip)
        if err is not None:
            raise err


def check_scalar_subcore_kernel(jaxpr: Any, *, label: str, chip: str) -> None:
    """Raise Mosaic's refusal of the first SMEM scalar of ``jaxpr`` (a scalar subcore kernel)
    that is not 32 bits wide; the scalar subcore's other rules are not simulated yet."""
    for eqn in all_eqns(jaxpr):
        what = smem_width_refusal(eqn)
        if what is not None:
            text, rule, fix = what
            raise UnsupportedOnChipError(
                f"{label}: {text}{_at(eqn)}", rule=rule, chip=chip, fix=fix
            )


def _at(eqn: Any) -> str:
    where = user_location(eqn.source_info)
    return f" (at {where})" if where else ""


@functools.cache
def _rules() -> Any:
    from jax._src.pallas.mosaic import core as tpu_core

    # Importing the SparseCore modules registers their rules.
    from jax._src.pallas.mosaic import lowering, sc_lowering, sc_primitives  # noqa: F401

    return lowering.lowering_rules[tpu_core.CoreType.SC_VECTOR_SUBCORE]


def _unlowered(eqn: Any) -> tuple[str, str, str] | None:
    """An operation of ``jax.lax``, Pallas, Pallas TPU or refs the vector subcore's lowering
    has no rule for (lowering.py ``jaxpr_subcomp``): ``jnp.prod``, ``pltpu.store`` with a
    mask, ...; loops, conditionals and the rest holding jaxprs are looked into."""
    if eqn.primitive in _rules() or eqn.primitive not in kernel_primitives() or sub_jaxprs(eqn):
        return None
    return (
        "Unimplemented primitive in Pallas TPU lowering for sc_vector_subcore: "
        f"{eqn.primitive.name}",
        "Mosaic compiles a SparseCore vector subcore kernel only from operations its lowering "
        "has a rule for; the interpreter would compute this one on the CPU",
        "express it with operations the SparseCore lowers (elementwise arithmetic, sum / max / "
        "min along axis 0, plsc.cumsum, plsc.sort_key_val, ...), or move it out of the kernel",
    )


def _reduction(eqn: Any) -> tuple[str, str, str] | None:
    if eqn.primitive.name not in _REDUCTIONS or tuple(eqn.params.get("axes", ())) == (0,):
        return None
    return (
        "reductions require axes to be (0,) on SparseCore, but got "
        f"{tuple(eqn.params['axes'])} ({_SCANS[eqn.primitive.name]} of "
        f"{eqn.invars[0].aval.str_short()})",
        "a vector subcore reduces one vector of lanes, along its first axis",
        "reduce a rank-1 vector (reshape, or reduce each row in a loop)",
    )


def cumsum_refusal(eqn: Any) -> tuple[str, str, str] | None:
    """(what, rule, fix) if Mosaic's SparseCore lowering of ``jnp.cumsum`` (sc_primitives.py
    ``_cumsum_lowering_rule``) refuses ``eqn``: it takes a rank-1 vector along axis 0, not
    reversed."""
    if eqn.primitive.name != "cumsum":
        return None
    aval = eqn.invars[0].aval
    if aval.ndim == 1 and not eqn.params.get("reverse") and eqn.params.get("axis", 0) == 0:
        return None
    return (
        f"SC cumsum: x={aval.str_short()} must be rank 1, along axis 0 and not reversed",
        "a SparseCore vector subcore scans one vector of lanes",
        "reshape to one axis and scan it, or scan each row in a loop",
    )


def _layout_refusal(eqn: Any, *, label: str, chip: str) -> UnsupportedOnChipError | None:
    name = eqn.primitive.name
    from jax._src.pallas.mosaic import sc_primitives as scp

    if name in _SCANS:
        kind = "an all-reduce (xir.all_reduce)" if "all_reduce" in name else "a scan (xir.scan)"
        return UnsupportedOnChipError(
            f"{label}: {_SCANS[name]}{_at(eqn)} lowers to {kind}: Operation not supported in the "
            "Mosaic-SC infer-vector-layout pass. Set needs_layout_passes=False",
            rule="with needs_layout_passes=True (the default) Mosaic's SparseCore layout "
            "passes have no layout for scans and all-reduces (libtpu 0.0.52, every chip with "
            "SparseCores)",
            chip=chip,
            fix=_LAYOUT_FIX,
        )
    masked = eqn.primitive in (scp.load_p, scp.swap_p) and eqn.params.get("has_mask")
    if masked and not jax_versions.at_least(MASKED_ACCESS_LAYOUT_FIXED_IN):
        call = "plsc.load_expanded" if eqn.primitive is scp.load_p else "a masked store"
        return UnsupportedOnChipError(
            f"{label}: {call}{_at(eqn)}: Not implemented: Mask is not supported (a masked "
            "vector load or store in Mosaic's SparseCore infer-vector-layout pass)",
            rule=f"before jax {MASKED_ACCESS_LAYOUT_FIXED_IN} Mosaic's SparseCore layout passes "
            "(needs_layout_passes=True, the default) refuse masked vector loads and stores "
            "(plsc.load_expanded, store_compressed, addupdate_compressed)",
            chip=chip,
            fix=_LAYOUT_FIX,
        )
    return None


def _pack(eqn: Any) -> tuple[str, str, str] | None:
    """From jax 0.11 the lowering of ``plsc.pack`` / ``unpack`` refuses the layout passes."""
    if eqn.primitive.name not in ("pack", "unpack"):
        return None
    if not jax_versions.at_least(PACK_LAYOUT_PASSES_REFUSED_SINCE):
        return None
    from jax._src.pallas.mosaic import sc_primitives as scp

    if eqn.primitive not in (scp.pack_p, scp.unpack_p):
        return None
    return (
        f"plsc.{eqn.primitive.name} is not supported with needs_layout_passes=True",
        "plsc.pack / plsc.unpack lower only without Mosaic's layout passes",
        "pass compiler_params=pltpu.CompilerParams(needs_layout_passes=False), or convert "
        "with jax.lax.convert_element_type / .astype instead",
    )


def _concatenate_refusal(
    eqn: Any, layout_passes: bool, *, label: str, chip: str
) -> UnsupportedOnChipError | None:
    """A concatenation of vectors (``jnp.concatenate``, ``jnp.roll``) along their one axis:
    the layout passes refuse it ("Concatenation along tiled dimensions"), and without them it
    does not legalize (libtpu 0.0.52, v5p, jax 0.10.2 and 0.12.0.1)."""
    if eqn.primitive.name != "concatenate" or eqn.outvars[0].aval.ndim != 1:
        return None
    words = (
        "Not implemented: Concatenation along tiled dimensions"
        if layout_passes
        else "failed to legalize operation 'xir.concatenate'"
    )
    return UnsupportedOnChipError(
        f"{label}: jnp.concatenate of vectors{_at(eqn)}: {words}",
        rule="a vector subcore computes on whole registers of lanes; Mosaic's SparseCore "
        "compiler does not join vectors along their lanes",
        chip=chip,
        fix="write each part to its place in a VMEM ref (ref[pl.ds(i, n)] = part) and load "
        "the whole register, or select lanes with jnp.where; for a rotation, a gather "
        "(plsc.load_gather) with rotated indices",
    )


def _legalize_refusal(eqn: Any, *, label: str, chip: str) -> UnsupportedOnChipError | None:
    """Without the layout passes a vector is one whole register: a slice of a vector value to
    fewer lanes does not legalize ("failed to legalize operation
    'vector.extract_strided_slice'", libtpu 0.0.52, v5p, jax 0.10.2 and 0.12.0.1)."""
    if eqn.primitive.name != "slice":
        return None
    aval = eqn.outvars[0].aval
    if aval.ndim != 1 or aval.shape == eqn.invars[0].aval.shape:
        return None
    return UnsupportedOnChipError(
        f"{label}: a slice of a vector to {aval.str_short()}{_at(eqn)}: failed to legalize "
        "operation 'vector.extract_strided_slice'",
        rule="with needs_layout_passes=False a vector subcore's values are whole registers",
        chip=chip,
        fix="keep the layout passes (needs_layout_passes=True, the default) for sub-register "
        "values, or mask lanes with jnp.where instead of slicing",
    )
