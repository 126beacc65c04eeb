"""An array that lives in VMEM or SMEM, passed to a kernel and aliased to its result: one buffer.

A kernel result whose ``out_shape`` is ``pltpu.VMEM(...)`` / ``pltpu.SMEM(...)`` is an array that
stays in that memory between kernels (JAX's ``test_basic_async_copy_into_vmem``: a copy into
it started in one kernel, waited for in the next). Passed to a later kernel with
``input_output_aliases``, the operand and the result are the one buffer on the chip. Pallas'
interpreter gives the result a kernel buffer of its own, which a kernel that writes only
through the operand (or not at all) leaves unwritten: the result is the fill (NaN).

Simulated so: in a kernel of one grid step, the result's ref is the operand's, and the
operand's final content is copied to the result when the kernel ends. Over more grid steps or
cores (each core has its own VMEM and SMEM) it is refused (``NotSimulatedError``), not left to
the fill, unless patch ``core_local_smem`` gave the array one row per core. An operand kept in
VMEM and only read is copied into the kernel's VMEM like any input; the interpreter refused it
("Unsupported memory space: vmem").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _resident(aval: Any) -> bool:
    from jax._src.pallas.mosaic import core as mosaic_core

    space = getattr(aval, "memory_space", None)
    return space in (mosaic_core.MemorySpace.VMEM, mosaic_core.MemorySpace.SMEM)


def _pairs(kw: dict[str, Any]) -> list[tuple[int, int]]:
    """(operand invar, result invar) of each aliased result that lives in VMEM or SMEM."""
    gm = kw["grid_mapping"]
    first = gm.num_index_operands
    out = []
    for k, o in kw["input_output_aliases"]:
        if _resident(kw["out_avals"][o]) and k >= first:
            out.append((k, first + gm.num_inputs + o))
    return out


def _body(jaxpr: Any, pairs: Sequence[tuple[int, int]]) -> Callable[..., list[Any]]:
    from coremesh.testing.sim import inline

    def body(*refs: Any) -> list[Any]:
        kernel_refs = list(refs)
        for operand, result in pairs:
            kernel_refs[result] = refs[operand]
        inline.eval_kernel(jaxpr, kernel_refs)
        for operand, result in pairs:
            refs[result][...] = refs[operand][...]
        return []

    return body


def rewrite(kw: dict[str, Any]) -> dict[str, Any] | None:
    """``kw`` with the kernel rewritten as the module says, or None if nothing is to change."""
    from coremesh.testing.sim import inline

    pairs = _pairs(kw)
    gm = kw["grid_mapping"]
    jaxpr = kw["jaxpr"]
    if not pairs:
        return None
    steps = inline.kernel_steps(gm)
    if steps != 1:
        from coremesh.testing.sim.chip import current
        from coremesh.testing.sim.errors import NotSimulatedError
        from coremesh.testing.sim.refusals import check_multicore_vmem_operands, kernel_label

        # What the chip refuses first, in its words.
        label = kernel_label(jaxpr, kw.get("name"))
        check_multicore_vmem_operands(jaxpr, kw.get("mesh"), gm, label, current().name)

        raise NotSimulatedError(
            f"a kernel of {steps} grid steps (or cores) whose result is an "
            "array kept in VMEM or SMEM, aliased to an operand, is not simulated",
            rule="the operand and the result are one buffer on the chip; the simulator makes "
            "them one only in a kernel of one grid step on one core (each core has its own "
            "VMEM and SMEM)",
            chip=current().name,
            fix="keep the array in HBM (pltpu.HBM / pl.ANY) and copy it in the kernel, or run "
            "the kernel as one grid step on one core; an SMEM array made in the jitted function "
            "and used only by kernels over the same TensorCores runs, one per core (patch "
            "core_local_smem)",
        )
    if jaxpr.constvars:
        return None
    avals = [v.aval for v in jaxpr.invars]
    return {**kw, "jaxpr": inline.retrace_kernel(gm, _body(jaxpr, pairs), avals)}


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's kernel entry, and its memory-space strip for operands kept in VMEM."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim import operands

    orig_call = ipc.interpret_pallas_call

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        return orig_call(*args, **(rewrite(kw) or kw))

    return [
        (ipc, "interpret_pallas_call", interpret_pallas_call),
        # An operand kept in VMEM is copied into the kernel's VMEM from its block as any VMEM
        # input is.
        operands.stripped_memory_space("VMEM"),
    ]
