"""What Mosaic refuses in a TensorCore kernel's plain loads and stores (``ref[...]``,
``ref[...] = x``) of memory a core reaches only by DMA, the simulator refuses before it runs.

Mosaic's TensorCore lowering of ``get`` and ``swap`` (lowering.py ``_load_lowering_rule`` /
``_masked_swap_lowering_rule``, jax 0.10.2 to 0.12.1) takes VMEM and SMEM refs only: "Loads are
only allowed on VMEM and SMEM references. ANY memory space can only be accessed using
async_copy." A ref whose memory space is unset is ANY on a TensorCore
(``memory_space_to_tpu_memory_space``): an operand of ``pl.kernel`` without a memory space, an
array ``pl.core_map`` closes over (``jax.new_ref(x)``). The interpreter refuses HBM and ANY
with a ``ValueError`` of its own, whose words the refusal keeps beside Mosaic's, and failed on
an unset one with a bare ``KeyError: None`` (``TPU_MEMORY_SPACE_IDXS[None]``); Mosaic's refusal
checked with libtpu 0.0.52 for every chip, jax 0.12.0.1.
"""

from __future__ import annotations

from typing import Any

from jax._src.state import primitives as state_primitives

from coremesh.testing.sim.errors import LoweringRefusalError
from coremesh.testing.sim.faults import user_location
from coremesh.testing.sim.jaxprs import all_eqns, memory_space

#: The interpreter's own words for HBM and ANY (``_get_memory_space_and_raise_if_hbm``, jax
#: 0.10.2 to 0.12.1), after the primitive's name: JAX's interpret-mode tests match them.
_INTERPRETER_WORDS = (
    "Buffers with a memory space of HBM or ANY cannot be referenced directly. Instead, use "
    "`pltpu.sync_copy` or `pltpu.async_copy`."
)
#: Memory spaces a TensorCore reaches only by DMA, as :func:`jaxprs.memory_space` names them.
_DMA_ONLY = {"any": "ANY", "none": "ANY (unset)", "hbm": "HBM"}


def check_direct_accesses(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse a load or store of an HBM, ANY or unset ref in a TensorCore kernel, at its line."""
    # Mosaic's words for each access (its load rule, its store rule), and what it is.
    said = {
        state_primitives.get_p: ("Loads are", "load of"),
        state_primitives.swap_p: ("Loads and stores are", "store to"),
    }
    for eqn in all_eqns(jaxpr):
        if eqn.primitive not in said:
            continue
        aval = eqn.invars[0].aval
        space = _DMA_ONLY.get(memory_space(aval))
        if space is None:
            continue
        words, op = said[eqn.primitive]
        where = user_location(eqn.source_info)
        extra = (
            " ANY memory space can only be accessed using async_copy."
            if space.startswith("ANY")
            else ""
        )
        raise LoweringRefusalError(
            f"{label}: {eqn.primitive.name}_p: {_INTERPRETER_WORDS} Mosaic: {words} only "
            f"allowed on VMEM and SMEM references.{extra} (a {op} a "
            f"{getattr(aval, 'inner_aval', aval).str_short()} ref in {space}"
            + (f" at {where}" if where else "")
            + ")",
            rule="a TensorCore loads and stores its own VMEM and SMEM; HBM (and a ref whose "
            "memory space is ANY or unset, which Mosaic places there) is reached by DMA",
            chip=chip,
            fix="copy the data into VMEM first (pltpu.sync_copy(hbm_ref, vmem_ref), or "
            "pltpu.async_copy in a pl.run_scoped with pltpu.VMEM scratch), or give the operand "
            "a VMEM BlockSpec (pl.BlockSpec(memory_space=pltpu.VMEM))",
        )
