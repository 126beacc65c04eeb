"""A ``pl.kernel`` operand made in SMEM or VMEM keeps its memory space (jax 0.10).

jax 0.10's ``pl.kernel`` (``mpmd_map``) lowers a ref it closes over, made outside in SMEM or
VMEM (``pl.empty_ref_like(pltpu.SMEM(...))``), to a ``pallas_call`` operand whose block is in
ANY while the kernel body's ref is in SMEM: the interpreter allocates the operand in HBM and the
body's first access fails ("KeyError: ('smem', 100, 0, 0)"). The result it is aliased to has no
memory space either. Mosaic places both as the ref says; jax 0.11 lowers the blocks and results
in the ref's space. The patch gives each such block, and each such result, its ref's space (so
patch ``resident_aliases`` makes the operand and its result one buffer, as on jax 0.11).
"""

from __future__ import annotations

from typing import Any

from coremesh.testing.sim import compat
from coremesh.testing.sim.jaxprs import memory_space

#: Memory spaces a kernel operand's block keeps from its ref.
_KEPT = ("smem", "vmem")


def rewrite(kw: dict[str, Any]) -> dict[str, Any] | None:
    """``kw`` with each ANY block of a mesh kernel's SMEM or VMEM ref in its ref's space; None
    when no block changes."""
    if kw.get("mesh") is None:
        return None
    gm = kw["grid_mapping"]
    refs = kw["jaxpr"].invars[gm.num_index_operands :]
    blocks = list(gm.block_mappings)
    out_avals = list(kw["out_avals"])
    changed = False
    for i, (bm, ref) in enumerate(zip(blocks, refs, strict=False)):
        if memory_space(compat.block_aval(bm)) == "any" and memory_space(ref.aval) in _KEPT:
            blocks[i] = bm.replace(**{compat.block_aval_field(): ref.aval})
            o = i - gm.num_inputs
            if 0 <= o < len(out_avals):
                out_avals[o] = out_avals[o].update(memory_space=ref.aval.memory_space)
            changed = True
    if not changed:
        return None
    return {
        **kw,
        "grid_mapping": gm.replace(block_mappings=tuple(blocks)),
        "out_avals": tuple(out_avals),
    }


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's kernel entry."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig_call = ipc.interpret_pallas_call

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        return orig_call(*args, **(rewrite(kw) or kw))

    return [(ipc, "interpret_pallas_call", interpret_pallas_call)]
