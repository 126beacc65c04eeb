"""What Mosaic refuses in a SparseCore vector subcore's plain loads and stores (``ref[...]``,
``ref[...] = x``), the simulator refuses; the interpreter would run them.

Mosaic's SparseCore lowering of ``get`` and ``swap`` (sc_lowering.py ``_load_lowering_rule`` /
``_store_lowering_rule``, jax 0.10.2 to 0.12.0.1) refuses, in this order:

* a ref in HBM or VMEM_SHARED ("Get does not support loading from HBM"): a vector subcore
  loads and stores its own memory; data elsewhere comes in by DMA;
* an integer index after a dimension of more than one element ("Integer indexing of refs that
  follows a non-trivial slice is not supported on SC"), e.g. a column ``ref[:, i]``;
* a slice with a stride other than 1;
* a scalar load or store outside SMEM ("To load a scalar from VMEM, load an array first"), and
  an array load or store in SMEM.

Dimensions a BlockSpec squeezed are not in the kernel's ref types, so they are not seen here:
the check may miss what Mosaic refuses for them, never refuse what it accepts. ``plsc.pack`` and
``plsc.unpack`` with ``needs_layout_passes=True`` (the default) are refused where the installed
jax's lowering refuses them (from jax 0.11).
"""

from __future__ import annotations

from typing import Any

import jax
from jax._src.state import indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types

from coremesh.core import jax_versions
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim.jaxprs import all_eqns


def check_vector_subcore_kernel(jaxpr: Any, *, label: str, chip: str, compiler_params: Any) -> None:
    """Raise Mosaic's refusal of the first load, store or pack in ``jaxpr`` (a vector subcore
    kernel) that its SparseCore lowering refuses."""
    layout_passes = getattr(compiler_params, "needs_layout_passes", True) is not False
    for eqn in all_eqns(jaxpr):
        if eqn.primitive in (state_primitives.get_p, state_primitives.swap_p):
            what = _access_refusal(eqn)
            if what is not None:
                raise UnsupportedOnChipError(
                    f"{label}: {what}",
                    rule="Mosaic's SparseCore lowering of a vector subcore's loads and stores "
                    "(sc_lowering.py) refuses this",
                    chip=chip,
                    fix=_FIX,
                )
        elif layout_passes and eqn.primitive.name in ("pack", "unpack") and _pack_refused():
            from jax._src.pallas.mosaic import sc_primitives as scp

            if eqn.primitive in (scp.pack_p, scp.unpack_p):
                raise UnsupportedOnChipError(
                    f"{label}: plsc.{eqn.primitive.name} is not supported with "
                    "needs_layout_passes=True",
                    rule="plsc.pack / plsc.unpack lower only without Mosaic's layout passes",
                    chip=chip,
                    fix="pass compiler_params=pltpu.CompilerParams(needs_layout_passes=False), "
                    "or convert with jax.lax.convert_element_type / .astype instead",
                )


_FIX = (
    "copy HBM or VMEM_SHARED data to VMEM with pltpu.sync_copy / async_copy first; load a whole "
    "vector (v = ref[pl.ds(i, lanes)]) and take v[0] instead of a scalar; write a row, not a "
    "column; keep scalars in SMEM"
)


#: The first jax whose ``plsc.pack`` / ``unpack`` lowering refuses Mosaic's layout passes
#: (sc_primitives.py ``_pack_lowering_rule``: 0.11.2 and 0.12.0.1 do, 0.10.2 does not).
PACK_LAYOUT_PASSES_REFUSED_SINCE = "0.11.0"


def _pack_refused() -> bool:
    return jax_versions.at_least(PACK_LAYOUT_PASSES_REFUSED_SINCE)


def _access_refusal(eqn: Any) -> str | None:
    get = eqn.primitive is state_primitives.get_p
    ref, *rest = eqn.invars
    flat = rest if get else rest[1:]
    transforms = list(jax.tree.unflatten(eqn.params["tree"], [v.aval for v in flat]))
    aval = state_types.transform_type(transforms, ref.aval)
    space = getattr(aval, "memory_space", None)
    space = getattr(space, "memory_space", space)  # a core memory space: the one it wraps
    # Unset is HBM on a vector subcore, DEFAULT its VMEM (core.py memory_space_to_tpu_memory_space)
    name = "hbm" if space is None else str(space).lower().rsplit(".", 1)[-1]
    name = "vmem" if name == "default" else name
    op = "Get" if get else "Swap"
    if name in ("hbm", "vmem_shared"):
        verb = "loading from" if get else "storing to"
        return f"{op} does not support {verb} {name.upper()} (a {aval.str_short()} ref)"
    if transforms and isinstance(transforms[-1], indexing.NDIndexer):
        sizes, strides, squeezed = _dims(transforms[-1])
        if sizes is not None:
            first = next((d for d, s in enumerate(sizes) if s != 1), len(sizes))
            if any(squeezed[first:]):
                return (
                    "Integer indexing of refs that follows a non-trivial slice is not supported "
                    f"on SC ({transforms[-1]})"
                )
            if any(s != 1 for s in strides):
                return f"{op} only supports slices with stride 1, got {list(strides)}"
    scalar = not aval.shape
    if scalar != (name == "smem"):
        if name == "smem":
            return (
                f"{op} only supports scalars in SMEM. Trying to use an array of shape {aval.shape}"
            )
        if get:
            return (
                "Get only supports loading scalars from SMEM. To load a scalar from VMEM, load "
                "an array first and then extract a particular element, e.g. "
                "``v = ref[pl.ds(idx, ...)]; v[0]``"
            )
        return f"Swap only supports scalars in SMEM. Trying to swap a scalar in {name.upper()}"
    return None


def _dims(indexer: Any) -> tuple[list[int] | None, list[int], list[bool]]:
    """(sizes, strides, squeezed) of an indexer's dims as Mosaic reads them; sizes None for an
    indexer with a vector of indices (a gather, not this lowering)."""
    sizes: list[int] = []
    strides: list[int] = []
    squeezed: list[bool] = []
    for index in indexer.indices:
        if isinstance(index, indexing.Slice):
            sizes.append(index.size)
            strides.append(index.stride)
            squeezed.append(False)
        elif getattr(index, "shape", ()) == ():
            sizes.append(1)
            strides.append(1)
            squeezed.append(True)
        else:
            return None, [], []
    return sizes, strides, squeezed
