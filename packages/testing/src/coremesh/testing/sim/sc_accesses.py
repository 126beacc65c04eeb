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
the check may miss what Mosaic refuses for them, never refuse what it accepts. The kernel's
other operations are :mod:`.sc_ops`' to judge, which calls this module.
"""

from __future__ import annotations

from typing import Any

import jax
from jax._src.state import indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types

_RULE = (
    "Mosaic's SparseCore lowering of a vector subcore's loads and stores (sc_lowering.py) "
    "refuses this"
)
_FIX = (
    "copy HBM or VMEM_SHARED data to VMEM with pltpu.sync_copy / async_copy first; load a whole "
    "vector (v = ref[pl.ds(i, lanes)]) and take v[0] instead of a scalar; write a row, not a "
    "column; keep scalars in SMEM"
)


def access_refusal(eqn: Any, *, layout_passes: bool) -> tuple[str, str, str] | None:
    """(what, rule, fix) of Mosaic's refusal of ``eqn``, a load or store of a vector
    subcore kernel (``layout_passes``: the kernel's ``needs_layout_passes``); None for any
    other equation or one Mosaic lowers."""
    found = accessed(eqn)
    if found is None:
        return None
    get, aval, transforms, space = found
    what = _access_refusal(get, aval, transforms, _vector_space(space), layout_passes)
    return (what, _RULE, _FIX) if what is not None else _smem_width(get, aval, space)


def smem_width_refusal(eqn: Any) -> tuple[str, str, str] | None:
    """(what, rule, fix) if ``eqn`` loads or stores a scalar of SMEM that is not 32 bits wide,
    in any SparseCore kernel (scalar or vector subcores): Mosaic's SparseCore ``memref.load`` /
    ``memref.store`` take i32 and f32 only (libtpu 0.0.52, "'memref.load' op only supports i32
    and f32 values", v5p, jax 0.10.2 and 0.12.0.1); the interpreter stores any width."""
    found = accessed(eqn)
    return None if found is None else _smem_width(found[0], found[1], found[3])


def _smem_width(get: bool, aval: Any, space: str | None) -> tuple[str, str, str] | None:
    if aval.shape or space != "smem" or aval.dtype.itemsize == 4:
        return None
    op = "load" if get else "store"
    return (
        f"'memref.{op}' op only supports i32 and f32 values (a {aval.dtype} scalar of SMEM)",
        "a SparseCore subcore loads and stores SMEM a 32-bit word at a time",
        "keep SMEM scalars 32-bit (int32, uint32, float32): widen with .astype(jnp.int32) "
        "before the store and narrow after the load",
    )


def accessed(eqn: Any) -> tuple[bool, Any, list[Any], str | None] | None:
    """(whether it loads, the aval it reads or writes, the transforms, its memory space's
    lower-case name, None where the kernel left it unset) of a load or a store: a plain one
    (``ref[...]``) or the SparseCore's own (``plsc.load_expanded``, ``store_compressed``,
    ``addupdate``), which Mosaic lowers by the same rules; None for any other equation."""
    parts = _parts(eqn)
    if parts is None:
        return None
    get, ref, flat = parts
    transforms = list(jax.tree.unflatten(eqn.params["tree"], [v.aval for v in flat]))
    aval = state_types.transform_type(transforms, ref.aval)
    space = getattr(aval, "memory_space", None)
    space = getattr(space, "memory_space", space)  # a core memory space: the one it wraps
    return get, aval, transforms, None if space is None else str(space).lower().rsplit(".", 1)[-1]


def _vector_space(space: str | None) -> str:
    """Unset is HBM on a vector subcore, DEFAULT its VMEM (core.py
    memory_space_to_tpu_memory_space)."""
    return "hbm" if space is None else "vmem" if space == "default" else space


def _parts(eqn: Any) -> tuple[bool, Any, list[Any]] | None:
    """(whether it loads, the ref, its transforms' flat operands) of a load or a store: a
    plain one (``ref[...]``) or the SparseCore's own (``plsc.load_expanded``,
    ``store_compressed``, ``addupdate``), which Mosaic lowers by the same rules."""
    from jax._src.pallas.mosaic import sc_primitives as scp

    if eqn.primitive not in (
        state_primitives.get_p,
        state_primitives.swap_p,
        scp.load_p,
        scp.swap_p,
    ):
        return None
    ref, *rest = eqn.invars
    if eqn.primitive is state_primitives.get_p:
        return True, ref, rest
    if eqn.primitive is state_primitives.swap_p:
        return False, ref, rest[1:]
    load = eqn.primitive is scp.load_p
    flat = rest if load else rest[1:]
    return load, ref, flat[:-1] if eqn.params["has_mask"] else flat


def _access_refusal(
    get: bool, aval: Any, transforms: list[Any], name: str, layout_passes: bool
) -> str | None:
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
    if not scalar and not layout_passes:
        return _register_shape_refusal(op, aval)
    return None


def _register_shape_refusal(op: str, aval: Any) -> str | None:
    """Without the layout passes a vector load or store moves one whole register: Mosaic's
    ``_check_aval_is_supported`` (jax's own, called here) takes the shapes of
    ``sc_core.supported_shapes``, ``(lanes,)`` for 32-bit types."""
    from jax._src import core as jax_core
    from jax._src.pallas.mosaic import sc_lowering

    try:
        sc_lowering._check_aval_is_supported(op, jax_core.ShapedArray(aval.shape, aval.dtype))
    except NotImplementedError as err:
        return (
            f"{err} (with needs_layout_passes=False each vector load and store is one whole "
            "register: load the full vector and slice the value, or keep the layout passes)"
        )
    except ValueError:  # an element wider than 32 bits: refused elsewhere
        return None
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
