"""What the chip refuses, the simulator refuses: checks around every interpreted kernel.

Pallas' interpreter runs kernels a TPU would never run, and answers with wrong data instead of
an error: VMEM or SMEM beyond the chip's, a barrier semaphore without a collective id, a kernel
that ends with a semaphore above zero or a DMA nobody waited for (its output is NaN). Before a
kernel is traced into the interpreter, :func:`check_kernel` measures its scratch and pipeline
buffers with the compile check's own count (``coremesh.testing.aot.validate``: tile-padded,
the deepest ``run_scoped`` nest) and looks for the barrier semaphore; when a kernel ends on a
device, :func:`check_kernel_end` reads the interpreter's semaphores. :func:`check_devices` bounds
``simulate(devices=...)`` by the largest slice of the chip and by what the host can run.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp

from coremesh.core.capacity import check_fits
from coremesh.core.chips import Chip
from coremesh.core.errors import (
    CapacityError,
    CollectiveIdError,
    MeshError,
    UnsupportedOnChipError,
)
from coremesh.testing.sim import compat, tc_accesses
from coremesh.testing.sim.chip import SimulatedChip
from coremesh.testing.sim.deadlock import semaphore_description
from coremesh.testing.sim.errors import (
    CompilerParamsError,
    KernelCapacityError,
    MosaicRefusalError,
    UnfinishedKernelError,
    not_simulated,
)
from coremesh.testing.sim.faults import register_kernel, user_location
from coremesh.testing.sim.jaxprs import all_eqns, lax_primitives, memory_space, sub_jaxprs

#: Host CPU devices the simulator runs at most. Each is one XLA CPU device with its own threads,
#: and a simulated core blocked on a semaphore holds one: measured on a 2-CPU, 23 GiB machine,
#: 1024 host devices start in 1.3 s; 4096 take 8.5 s to start and then fail to run a program with
#: an XLA error, and 10**6 never start (the process grows to GBs).
MAX_HOST_DEVICES = 1024


def check_devices(devices: int, chip: Chip, cores_per_device: int) -> None:
    """Refuse more simulated devices than a slice of ``chip`` has, or than the host can run."""
    most = chip.max_slice_chips * chip.devices_per_chip(cores_per_device)
    if devices > most:
        raise MeshError(
            f"devices={devices}: the largest {chip.name} slice has {chip.max_slice_chips} chips, "
            f"{most} devices with {cores_per_device} TensorCore(s) each",
            rule=f"a simulated slice is at most the chip's largest topology ({most} devices)",
            chip=chip.name,
            fix=f"simulate at most {min(most, MAX_HOST_DEVICES)} devices; a kernel's behaviour "
            "rarely needs more than 4 to 16",
        )
    if devices > MAX_HOST_DEVICES:
        raise MeshError(
            f"devices={devices}: the simulator runs each device as a host CPU device, and "
            f"this host runs at most {MAX_HOST_DEVICES}",
            rule=f"simulate() accepts 1 to {MAX_HOST_DEVICES} devices (XLA's CPU runtime fails "
            "or hangs beyond that)",
            chip=chip.name,
            fix="simulate fewer devices (4 to 16 show a kernel's collective behaviour), or "
            "compile for the full slice with coremesh.testing.aot",
        )


# ------------------------------------------------------------------------ before tracing


def kernel_label(jaxpr: Any, name: str | None) -> str:
    """How errors name a kernel: its ``name=``, else its function's name."""
    name = name or getattr(getattr(jaxpr, "debug_info", None), "func_name", None)
    return f"kernel {name!r}" if name else "a kernel"


def check_kernel(
    jaxpr: Any,
    *,
    mesh: Any,
    compiler_params: Any,
    name: str | None,
    chip: SimulatedChip,
    grid_mapping: Any = None,
) -> None:
    """Refuse a kernel the chip would refuse; remember its name for fault reports."""
    from coremesh.testing.aot import validate

    debug = getattr(jaxpr, "debug_info", None)
    name = name or getattr(debug, "func_name", None)
    register_kernel(jaxpr, name, getattr(debug, "func_src_info", None))
    label = kernel_label(jaxpr, name)
    # An MPMD kernel's bodies are SparseCore ones (jax refuses a TensorCore mesh beside a
    # SparseCore one, and two TensorCore meshes, as it traces the kernel): its scratch is a
    # vector subcore's, and its vector bodies are judged in mpmd.lower.
    sparsecore = _is_mpmd(grid_mapping) or (mesh is not None and "Subcore" in type(mesh).__name__)
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    vmem, smem = validate.scoped_bytes(inner, chip.chip, own=inner.invars, tiled=not sparsecore)
    what = f"{label}: scratch and pipeline buffers"
    windows: list[tuple[int, str]] = []
    if not sparsecore:
        block_vmem, block_smem, windows = block_bytes(grid_mapping, chip.chip)
        vmem, smem = vmem + block_vmem, smem + block_smem
        if block_vmem or block_smem:
            what = f"{label}: its BlockSpec blocks, scratch and pipeline buffers"
    try:
        if sparsecore:
            check_fits(vmem, chip.chip, "sparsecore_vmem", what=what)
        else:
            limit = validate._clamped(validate._vmem_limit(compiler_params), chip.chip)
            check_fits(vmem, chip.chip, "vmem", vmem_limit_bytes=limit, what=what)
        check_fits(smem, chip.chip, "smem", what=what)
    except CapacityError as err:
        # Named as XLA names them when the compile runs out of VMEM, largest first.
        listed = "".join(f"; {text}" for _, text in sorted(windows, key=lambda w: -w[0])[:8])
        raise KernelCapacityError(
            err.what + listed, rule=err.rule, chip=err.chip, fix=err.fix
        ) from None
    check_side_effects(compiler_params, label, chip.name)
    tensorcore = not sparsecore
    check_regular_semaphore_dmas(inner, label, chip.name, tensorcore=tensorcore)
    check_explicit_mxu(inner, label, chip.name)
    check_dynamic_pipeline_sizes(inner, label, chip.name)
    check_output_revisit_any(grid_mapping, label, chip.name)
    check_view_chains(inner, label, chip.name)
    if tensorcore:
        if _tensorcore_kernel_type(compiler_params):
            check_lowered_primitives(inner, label, chip.name)
            tc_accesses.check_direct_accesses(inner, label, chip.name)
            check_tensorcore_dma_add(inner, label, chip.name)
            check_tensorcore_sparsecore_ops(inner, label, chip.name)
        check_integer_ops(inner, label, chip.name)
        check_multicore_vmem_operands(inner, mesh, grid_mapping, label, chip.name)
    else:
        from coremesh.testing.sim.sc_ops import check_subcore_kernel

        # An MPMD kernel (no mesh) has its bodies judged in mpmd.lower.
        check_subcore_kernel(
            inner, mesh, label=label, chip=chip.name, compiler_params=compiler_params
        )
    if getattr(compiler_params, "collective_id", None) is None:
        for eqn in _barrier_uses(inner):
            where = user_location(eqn.source_info)
            raise CollectiveIdError(
                f"{label} uses the barrier semaphore (pltpu.get_barrier_semaphore()"
                + (f" at {where}" if where else "")
                + ") but has no collective_id",
                rule="the barrier semaphore is shared by every kernel with the same "
                "collective_id, so a kernel that uses it needs one",
                chip=chip.name,
                fix="pass collective_id= (coremesh.tensorcore.kernel(collective_id='auto'), or "
                "compiler_params=pltpu.CompilerParams(collective_id=0) to pl.kernel / "
                "pl.pallas_call)",
            )


def check_side_effects(compiler_params: Any, label: str, chip: str) -> None:
    """Mosaic's lowering takes ``has_side_effects`` as a bool or a ``pltpu.SideEffectType``
    (``pallas_call_registration._resolve_side_effect_type``) and raises ``ValueError`` for
    anything else; the interpreter never reads it."""
    from jax._src.pallas.mosaic import core as tpu_core

    value = getattr(compiler_params, "has_side_effects", False)
    if isinstance(value, bool | tpu_core.SideEffectType):
        return
    kinds = ", ".join(f"pltpu.SideEffectType.{k.name}" for k in tpu_core.SideEffectType)
    raise CompilerParamsError(
        f"Invalid side effect type: {value} (has_side_effects of {label})",
        rule="has_side_effects is a bool or a pltpu.SideEffectType; the TPU lowering rejects "
        "anything else",
        chip=chip,
        fix=f"pass has_side_effects=True / False, or one of {kinds}",
    )


#: Chips whose Mosaic refuses a DMA that signals a REGULAR semaphore (libtpu 0.0.52, jax 0.12.0.1:
#: "Regular semaphores in EnqueueDMA are not supported on this target" for v4 and v5e; v5p, v6e
#: and TPU7x compile it).
_NO_REGULAR_SEMAPHORE_DMA = frozenset({"v4", "v5e"})


def check_regular_semaphore_dmas(
    jaxpr: Any, label: str, chip: str, *, tensorcore: bool = True
) -> None:
    """Refuse a DMA that signals a REGULAR semaphore where Mosaic refuses it: on a chip whose
    DMAs signal DMA semaphores only, and, in a TensorCore kernel (whose tiling
    :mod:`.dma_unrolling` counts in), when the transfer is one Mosaic unrolls into several DMAs,
    which would each signal it."""
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    from coremesh.testing.sim import dma_unrolling
    from coremesh.testing.sim.regular_dma import regular_sides

    for eqn in all_eqns(jaxpr):
        if eqn.primitive is not mosaic_primitives.dma_start_p or not any(regular_sides(eqn)):
            continue
        where = user_location(eqn.source_info)
        starts = f"{label} starts a DMA that signals a REGULAR semaphore" + (
            f" at {where}" if where else ""
        )
        if chip in _NO_REGULAR_SEMAPHORE_DMA:
            raise MosaicRefusalError(
                starts + ": Regular semaphores in EnqueueDMA are not supported on this target.",
                rule=f"a DMA on {chip} signals DMA semaphores only (TPU v5p, v6e and TPU7x "
                "take regular ones too)",
                chip=chip,
                fix="allocate the DMA's semaphore as pltpu.SemaphoreType.DMA and wait with the "
                "copy's .wait()",
            )
        if tensorcore and dma_unrolling.needs_unrolling(eqn):
            raise MosaicRefusalError(
                starts + ": Not implemented: Non-DMA semaphores in transfers that require "
                "unrolling.",
                rule=f"Mosaic unrolls a transfer whose window has {dma_unrolling.UNROLLED_FROM} "
                "or more strided levels in tiled memory into several DMAs, and only a DMA "
                "semaphore counts what several DMAs signal",
                chip=chip,
                fix="signal a pltpu.SemaphoreType.DMA semaphore and wait with the copy's "
                ".wait(), or copy a window with fewer strided dimensions (take whole minor "
                "dimensions, or split the copy in a loop)",
            )


def _is_mpmd(grid_mapping: Any) -> bool:
    """Is this the simulator's one kernel of an MPMD kernel's bodies (``mpmd.lower``)? Its
    bodies' meshes, SparseCore ones among them, are not the kernel's."""
    from coremesh.testing.sim.mpmd import BODY_AXIS

    return BODY_AXIS in (getattr(grid_mapping, "grid_names", None) or ())


def check_tensorcore_dma_add(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse a DMA with ``add=True`` in a TensorCore kernel: Mosaic's TensorCore lowering
    refuses every one (lowering.py ``_dma_start_lowering_rule``, jax 0.10.2 to 0.12.0.1); only
    the SparseCore's gathers and scatters add."""
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    for eqn in all_eqns(jaxpr):
        if eqn.primitive is mosaic_primitives.dma_start_p and eqn.params.get("add"):
            where = user_location(eqn.source_info)
            raise UnsupportedOnChipError(
                f"{label} starts a DMA with add=True"
                + (f" at {where}" if where else "")
                + ": DMA with add=True is not supported.",
                rule="a TensorCore DMA copies; only a SparseCore's indexed DMAs (gather into "
                "VMEM, scatter from VMEM) add to their destination",
                chip=chip,
                fix="copy into VMEM and add there (o_ref[...] += buf[...]), or run the "
                "accumulation on the SparseCore (plsc.VectorSubcoreMesh)",
            )


#: What a TensorCore kernel writes instead, where it has its own form of the operation.
_TENSORCORE_FORMS = {
    "parallel_loop": "a TensorCore loop is jax.lax.fori_loop (or pl.loop)",
    "bitcast": "the TensorCore's bitcast is pltpu.bitcast(x, dtype)",
    "barrier": "a TensorCore has no subcores to wait for: drop the barrier (cores synchronise "
    "with semaphores)",
}


@functools.cache
def _sparsecore_only_primitives() -> frozenset[Any]:
    """The installed jax's SparseCore primitives that Mosaic's TensorCore lowering has no rule
    for: each primitive of ``sc_primitives`` (all of them on jax 0.10.2 to 0.12.0.1)."""
    from jax._src import core as jax_core
    from jax._src.pallas.mosaic import core as tpu_core
    from jax._src.pallas.mosaic import lowering, sc_primitives

    rules = lowering.lowering_rules[tpu_core.CoreType.TC]
    return frozenset(
        v
        for v in vars(sc_primitives).values()
        if isinstance(v, jax_core.Primitive) and v not in rules
    )


def _sparsecore_call(eqn: Any) -> str:
    """The ``plsc`` call that bound ``eqn``'s SparseCore primitive."""
    name, params = eqn.primitive.name, eqn.params
    if name == "swap":
        if not params.get("add"):
            return "plsc.store_compressed"
        return "plsc.addupdate_compressed" if params.get("has_mask") else "plsc.addupdate"
    if name == "scatter":
        return "plsc.addupdate_scatter" if params.get("add") else "plsc.store_scatter"
    from coremesh.testing.sim.sparsecore import API_NAMES

    return API_NAMES.get(name, f"plsc.{name}")


def check_tensorcore_sparsecore_ops(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse a SparseCore operation (``plsc.load_gather``, ``plsc.cumsum``,
    ``plsc.parallel_loop``, ...) in a TensorCore kernel, with Mosaic's words: its TensorCore
    lowering has no rule for any of them (lowering.py ``jaxpr_subcomp``; libtpu 0.0.52 refuses
    each on v5p, v6e and TPU7x, jax 0.10.2 to 0.12.0.1, and on v4 and v5e those that trace
    without a SparseCore), while the simulator's SparseCore rules (:mod:`.sparsecore`) run them
    in any kernel. From jax 0.12 ``plsc.bitcast``
    is ``pltpu.bitcast``, no SparseCore primitive, and compiles. An MPMD kernel's bodies are not
    looked into: some of them are SparseCore ones."""
    from coremesh.core.chips import chip_names, get_chip

    refused = _sparsecore_only_primitives()
    for eqn in all_eqns(jaxpr):
        if eqn.primitive not in refused:
            continue
        call, name = _sparsecore_call(eqn), eqn.primitive.name
        where = user_location(eqn.source_info)
        with_cores = ", ".join(n for n in chip_names() if get_chip(n).sparsecore is not None)
        instead = _TENSORCORE_FORMS.get(name)
        raise UnsupportedOnChipError(  # a NotImplementedError, as Mosaic's own
            f"{label} calls {call}"
            + (f" at {where}" if where else "")
            + ", a SparseCore operation, in a TensorCore kernel: Unimplemented primitive in "
            f"Pallas TPU lowering for tc: {name}.",
            rule="plsc operations run only on a SparseCore's subcores; Mosaic lowers them in a "
            "kernel over plsc.VectorSubcoreMesh or plsc.ScalarSubcoreMesh and refuses them, on "
            "every chip, in a TensorCore kernel (a pl.pallas_call, or pl.kernel / pl.core_map "
            "over a TensorCore mesh)",
            chip=chip,
            fix=(f"{instead}; or " if instead else "")
            + "run this part in a SparseCore kernel (pl.kernel(..., mesh=plsc.VectorSubcoreMesh("
            f"core_axis_name=..., subcore_axis_name=...)), on {with_cores}), or compute it "
            "outside the kernel",
        )


def check_explicit_mxu(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse the explicit MXU operations (``pltpu.matmul_push_rhs``, ``matmul_acc_lhs``,
    ``matmul_pop`` and their FIFO forms): they carry the MXU's state (staging registers,
    accumulator addresses, FIFOs) between operations as an effect the interpreter has no rule
    for, and a kernel using them failed inside a host callback ('Cannot lower jaxpr with
    effects: ... MXUEffect')."""
    for eqn in all_eqns(jaxpr):
        if not any(type(e).__name__ == "MXUEffect" for e in getattr(eqn, "effects", ())):
            continue
        where = user_location(eqn.source_info)
        raise not_simulated(
            f"{label}: the explicit MXU operation {eqn.primitive.name!r}"
            + (f" (at {where})" if where else "")
            + " is not simulated: the interpreter does not model the MXU's staging registers, "
            "accumulators and FIFOs",
            chip=chip,
            instead="simulate the kernel with jnp.dot / lax.dot_general in place of the explicit "
            "MXU operations",
        )


def check_dynamic_pipeline_sizes(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse ``pl.num_programs`` in the body or index maps of an ``emit_pipeline`` (the
    primitive, ``jax_use_emit_pipeline_primitive``) whose grid has a size known only at run
    time. Mosaic answers it with the pipeline's grid size (lowering.py
    ``_num_programs_lowering_rule`` under ``emit_pipeline_mode``); the interpreter gives the
    body the kernel's grid sizes, 0 past them (interpret_pallas_call.py, ``pipeline_body_p``),
    so JAX's ``test_num_programs_vmap`` wrote 0 where the chip writes 4, and an index map's
    ``num_programs`` failed with an ``IndexError``. A static grid is resolved as the pipeline is
    traced, and runs. Where patch ``pipeline_primitive`` is in force (jax 0.10.2, whose
    interpreter has no rule for the primitive), it expands the primitive as Mosaic lowers it,
    with the pipeline's sizes, so such a kernel runs; from jax 0.12.1 the interpreter answers
    with the pipeline's sizes itself."""
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas import primitives

    from coremesh.testing.sim import patches

    if patches.in_force("pipeline_primitive") or compat.pipeline_answers_num_programs():
        return
    for eqn in all_eqns(jaxpr):
        grid_mapping = (
            eqn.params.get("grid_mapping") if eqn.primitive.name == "emit_pipeline" else None
        )
        if grid_mapping is None or not any(
            pallas_core.is_dynamic_dim(d) for d in grid_mapping.grid
        ):
            continue
        maps = [bm.index_map_jaxpr for bm in grid_mapping.block_mappings]
        asks = any(
            e.primitive is primitives.num_programs_p
            for sub in (eqn.params.get("body_jaxpr"), *maps)
            if sub is not None
            for e in all_eqns(sub)
        )
        if not asks:
            continue
        where = user_location(eqn.source_info)
        raise not_simulated(
            f"{label}: pl.num_programs() in the body or an index map of an emit_pipeline whose "
            "grid has a size known only at run time"
            + (f" (the pipeline at {where})" if where else "")
            + " is not simulated: Pallas' interpreter answers it with the kernel's grid "
            "sizes (0 for the pipeline's own axes), where the chip answers with the pipeline's",
            chip=chip,
            instead="pass the grid size to the body and index maps as a value (close over the "
            "array you built the grid from) or use a static grid",
        )


def check_output_revisit_any(grid_mapping: Any, label: str, chip: str) -> None:
    """Refuse an output BlockSpec with ``pipeline_mode=pl.Buffered(..., revisit=
    pl.RevisitMode.ANY)`` (accumulator mode): Mosaic writes such a block back when the grid
    moves on and reads it again when the grid returns to it, so a kernel may accumulate into an
    output block over iterations that are not consecutive. The interpreter keeps one output
    buffer per block visit and raised "Revisited block" inside a host callback (JAX's
    test_block_reduction_with_non_immediate_revisit)."""
    from jax._src.pallas import core as pallas_core

    if grid_mapping is None:
        return
    outputs = grid_mapping.block_mappings[grid_mapping.num_inputs :]
    for k, bm in enumerate(outputs):
        mode = getattr(bm, "pipeline_mode", None)
        if getattr(mode, "revisit", None) is not pallas_core.RevisitMode.ANY:
            continue
        raise not_simulated(
            f"{label}: output {k}'s BlockSpec has pipeline_mode={mode} (accumulator mode: "
            "a block written back when the grid moves on and read again when it returns) "
            "and is not simulated: the interpreter does not read an output block back",
            chip=chip,
            instead="order the grid so each output block's iterations are consecutive (the "
            "reduction axis last) and drop revisit=",
        )


def check_view_chains(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse, before the kernel runs, a load, store or DMA through a reshape, transpose or
    second bitcast of a ``ref.bitcast`` view (``sim.view_refs`` runs an access through one
    bitcast followed by indices, and views before it). JAX's test_multiple_ref_transforms
    failed inside the kernel, as a SimulationFault wrapping the same refusal."""
    from coremesh.testing.sim import view_refs

    for eqn in all_eqns(jaxpr):
        if not any(view_refs.unsimulated_chain(c) for c in view_refs.view_chains(eqn)):
            continue
        where = user_location(eqn.source_info)
        raise not_simulated(
            f"{label}: an access ({eqn.primitive.name}"
            + (f" at {where}" if where else "")
            + f") through {view_refs.AFTER_BITCAST} is not simulated",
            chip=chip,
            instead="index the bitcast view directly (ref.bitcast(dtype)[...]), or bitcast the "
            "loaded value (pltpu.bitcast) and reshape it as a value",
        )


def _tensorcore_kernel_type(compiler_params: Any) -> bool:
    kernel_type = getattr(compiler_params, "kernel_type", None)
    return kernel_type is None or getattr(kernel_type, "name", None) == "TC"


def check_lowered_primitives(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse a ``jax.lax`` operation Mosaic's TensorCore lowering has no rule for, with its
    words (lowering.py ``jaxpr_subcomp``: "Unimplemented primitive in Pallas TPU lowering for
    tc: ..."). The interpreter computes any of them in XLA:CPU; the chip's compiler refuses
    ``dynamic_slice`` / ``dynamic_update_slice`` of a value, ``rev`` (``jnp.flip``), ``sort``,
    ``cumsum`` and the rest without a rule in the installed jax (checked with libtpu for v5p,
    jax 0.12.0.1: dynamic_slice, dynamic_update_slice, rev, sort). Loops, conditionals and other
    operations holding jaxprs are looked into, not judged."""
    from jax._src.pallas.mosaic import core as tpu_core
    from jax._src.pallas.mosaic import lowering

    rules = lowering.lowering_rules[tpu_core.CoreType.TC]
    known = lax_primitives()
    for eqn in all_eqns(jaxpr):
        if eqn.primitive in rules or eqn.primitive not in known or sub_jaxprs(eqn):
            continue
        where = user_location(eqn.source_info)
        raise UnsupportedOnChipError(  # a NotImplementedError, as Mosaic's own
            f"{label}: Unimplemented primitive in Pallas TPU lowering for tc: "
            f"{eqn.primitive.name}" + (f" (at {where})" if where else ""),
            rule="Mosaic compiles a TensorCore kernel only from operations its lowering has a "
            "rule for; the interpreter would compute this one on the CPU",
            chip=chip,
            fix="express it with operations Mosaic lowers (static slices and ref indexing "
            "with pl.ds instead of a dynamic slice of a value, pltpu.roll, reductions), or "
            "move it out of the kernel",
        )


#: Integer operations Mosaic lowers to the scalar unit's ``arith`` ops (or ``cmpi``), which take
#: only i1 and i32 scalars. Conversions and copies are not among them: those compile.
_SCALAR_INT_OPS = frozenset(
    {
        "add", "sub", "mul", "div", "rem", "neg", "abs", "sign", "max", "min",
        "and", "or", "xor", "not", "shift_left", "shift_right_logical",
        "shift_right_arithmetic", "eq", "ne", "lt", "le", "gt", "ge", "select_n",
        "integer_pow", "clamp",
    }
)  # fmt: skip
#: Scalar ops with an ``arith`` op of their own in Mosaic's message (neg lowers to subi).
_ARITH_NAMES = {"add": "addi", "sub": "subi", "mul": "muli", "neg": "subi"}
#: Vector integer arithmetic Mosaic takes on i16 and i32 lanes only (max, min, bitwise ops,
#: shifts, compares and selects compile on 4- and 8-bit lanes).
_VECTOR_INT16_OPS = frozenset({"add", "sub", "mul", "neg"})


def check_integer_ops(jaxpr: Any, label: str, chip: str) -> None:
    """Refuse the narrow-integer arithmetic Mosaic refuses in a TensorCore kernel.

    Measured with libtpu on v5e, v5p, v6e and TPU7x (jax 0.10.2 and 0.12.0.1): any arithmetic or
    comparison on a scalar narrower than 32 bits ("Only i1 and i32 scalars are supported", "Only
    i32 arith.addi is supported"), and add, subtract, multiply and negate on vectors of 4- or
    8-bit integers ("Only vector<i16> and vector<i32> are supported"). The interpreter computes
    all of them in numpy.
    """
    for eqn in all_eqns(jaxpr):
        name = eqn.primitive.name
        if name == "dot_general":
            _check_unsigned_dot(eqn, label, chip)
        if name not in _SCALAR_INT_OPS:
            continue
        outs = [getattr(v, "aval", None) for v in eqn.outvars]
        if all(getattr(a, "shape", None) == () for a in outs):
            dtype = next(
                (d for d in map(_narrow_int, (*eqn.invars, *eqn.outvars)) if d is not None), None
            )
            if dtype is None:
                continue
            bits = jnp.iinfo(dtype).bits
            if name in _ARITH_NAMES:
                words = (
                    f"Only i32 arith.{_ARITH_NAMES[name]} is supported, but got 'i{bits}'. "
                    "Please cast your input to i32."
                )
            else:
                words = "Only i1 and i32 scalars are supported."
            unit = f"'{name}' on a {dtype} scalar"
        elif name in _VECTOR_INT16_OPS:
            dtype = next((_narrow_int(a, below=16, vector=True) for a in outs), None)
            if dtype is None:
                continue
            bits = jnp.iinfo(dtype).bits
            words = (
                f"Only vector<i16> and vector<i32> are supported, but got 'i{bits}'. "
                "Please cast your input."
            )
            unit = f"'{name}' on a {dtype} vector"
        else:
            continue
        where = user_location(eqn.source_info)
        raise MosaicRefusalError(
            f"{label}: Not implemented: {words} ({unit}" + (f" at {where})" if where else ")"),
            rule="a TensorCore computes integer arithmetic on 32-bit scalars (and bools) and on "
            "16- or 32-bit vector lanes; Mosaic refuses narrower ones",
            chip=chip,
            fix="cast to int32 first (x.astype(jnp.int32)), compute, and cast back to "
            f"{dtype} to store",
        )


def _check_unsigned_dot(eqn: Any, label: str, chip: str) -> None:
    """Mosaic's dot_general lowering refuses unsigned integer operands (lowering.py
    ``_dot_general_lowering_rule``, jax 0.10.2 to 0.12.0.1): the MXU reads every integer as
    signed. The interpreter multiplies them as unsigned."""
    for v in eqn.invars:
        dtype = getattr(getattr(v, "aval", None), "dtype", None)
        if dtype is not None and jnp.issubdtype(dtype, jnp.unsignedinteger):
            where = user_location(eqn.source_info)
            raise UnsupportedOnChipError(
                f"{label}: Unsigned integer dtype {dtype} is not supported for dot_general "
                "(matmul) on the Pallas Mosaic TPU backend" + (f" (at {where})" if where else ""),
                rule="the MXU reads every integer operand of a matmul as signed",
                chip=chip,
                fix="cast the operands to a signed type before the dot (x.astype(jnp.int32))",
            )


def block_bytes(grid_mapping: Any, chip: Chip) -> tuple[int, int, list[tuple[int, str]]]:
    """(VMEM, SMEM) bytes of a ``pallas_call``'s BlockSpec blocks, as Mosaic allocates them, and
    each VMEM window's (bytes, description) in XLA's words.

    A VMEM block takes its tile-padded size twice (double-buffered) when its window moves, i.e.
    when its index map reads a grid index whose dimension has more than one step, and once when
    it stays put; ``pipeline_mode=pl.Buffered(n)`` sets the count. Measured with libtpu on v5p:
    (128, 128) f32 in and out with grid () compile at a 128 KiB VMEM limit and fail at 96 KiB, and
    so do (64, 128) blocks with grid (2,); JAX's ``test_automatic_single_buffering`` checks the
    window rule.
    """
    import math

    from coremesh.core.capacity import padded_nbytes

    if grid_mapping is None:
        return 0, 0, []
    grid = tuple(getattr(grid_mapping, "grid", ()))
    inputs = int(getattr(grid_mapping, "num_inputs", 0))
    prefetch = int(getattr(grid_mapping, "num_index_operands", 0))
    vmem = smem = 0
    windows: list[tuple[int, str]] = []
    for n, bm in enumerate(getattr(grid_mapping, "block_mappings", ())):
        aval = compat.block_aval(bm)
        space = memory_space(aval)
        shape = tuple(d if isinstance(d, int) else 1 for d in aval.shape)
        if space == "smem":
            smem += math.prod(shape) * aval.dtype.itemsize
        elif space in ("none", "default", "vmem"):  # the default is VMEM
            count = getattr(bm.pipeline_mode, "buffer_count", None)
            if count is None:
                count = 2 if _window_moves(bm.index_map_jaxpr, grid) else 1
            size = count * padded_nbytes(shape, aval.dtype, chip)
            vmem += size
            kind = "input" if n < inputs else "output"
            role = f"input {prefetch + n}" if n < inputs else f"output {n - inputs}"
            full = bm.array_aval
            levels = "is single buffered" if count == 1 else f"has {count} buffering levels"
            windows.append(
                (
                    size,
                    f"{kind} window allocation for operator {role} "
                    f"({_mib_text(size)}). The window shape is {_short(aval)}, while the full "
                    f"shape is {_short(full)}. This allocation {levels}.",
                )
            )
    return vmem, smem, windows


def _short(aval: Any) -> str:
    """``f32[1024,8192]``, as XLA writes a shape."""
    import numpy as np
    from jax._src import dtypes

    from coremesh.core.dtypes import is_extended

    name = (
        str(aval.dtype)
        if is_extended(aval.dtype)
        else dtypes.short_dtype_name(np.dtype(aval.dtype))
    )
    return f"{name}[{','.join(str(d) for d in aval.shape)}]"


def _mib_text(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _window_moves(index_map: Any, grid: tuple[Any, ...]) -> bool:
    """Does the block index read a grid index whose dimension has more than one step?"""
    jaxpr = getattr(index_map, "jaxpr", index_map)
    needed = {v for v in jaxpr.outvars if not hasattr(v, "val")}
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if not hasattr(v, "val"))
    for dim, var in zip(grid, jaxpr.invars, strict=False):  # then the scalar prefetch refs
        if var in needed and not (isinstance(dim, int) and dim <= 1):
            return True
    return False


def _narrow_int(value: Any, *, below: int = 32, vector: bool = False) -> Any:
    """The dtype of an integer (a var or an aval) narrower than ``below`` bits, scalar (or,
    with ``vector``, not scalar); else None."""
    aval = getattr(value, "aval", value)
    dtype = getattr(aval, "dtype", None)
    shape = getattr(aval, "shape", None)
    if dtype is None or shape is None or (shape == ()) is vector:
        return None
    if not jnp.issubdtype(dtype, jnp.integer) or jnp.iinfo(dtype).bits >= below:
        return None
    return dtype


#: The collective id the simulator gives a kernel whose barrier semaphore jax assigns one to
#: (jax's auto-assigned ids start there, ``mlir.CollectiveIdMapping``).
AUTO_COLLECTIVE_ID = 7000


def with_auto_collective_id(jaxpr: Any, compiler_params: Any) -> Any:
    """``compiler_params`` with the collective id Mosaic assigns a kernel that uses the barrier
    semaphore without one; as they are otherwise (and :func:`check_kernel` refuses the kernel
    where Mosaic does). From jax 0.11 Mosaic assigns one when
    ``jax_pallas_auto_assign_collective_ids`` is ``'yes'`` or ``'override'``, or when the
    kernel names its barrier by a tag (``pltpu.get_barrier_semaphore(tag)``;
    ``tpu_custom_call._lower_to_custom_call``). The id only names the kernel's barrier
    semaphore in the simulator, so every such kernel gets the same; the interpreter reads it as
    an int (``get_barrier_semaphore``: ``int(None)`` fails)."""
    from jax._src import config
    from jax.experimental.pallas import tpu as pltpu

    if getattr(compiler_params, "collective_id", None) is not None:
        return compiler_params
    uses = list(_barrier_uses(getattr(jaxpr, "jaxpr", jaxpr)))
    mode = getattr(config, "jax_pallas_auto_assign_collective_ids", None)
    tagged = all(eqn.params.get("tag") is not None for eqn in uses)
    if not uses or not (tagged or (mode is not None and mode.value in ("yes", "override"))):
        return compiler_params
    return (compiler_params or pltpu.CompilerParams()).replace(collective_id=AUTO_COLLECTIVE_ID)


def _barrier_uses(jaxpr: Any) -> Iterator[Any]:
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    for eqn in all_eqns(jaxpr):
        if eqn.primitive is mosaic_primitives.get_barrier_semaphore_p:
            yield eqn


# ------------------------------------------------------------------------ at kernel end


def _pending_dma(task: Any) -> Any:
    """The DMA behind a semaphore's queued task if that task's part of it has not run, else None.

    A DMA queues ``execute_read`` on its send semaphore and ``execute_read_and_write`` on its
    receive semaphore, and whichever wait comes first runs its part. A sender whose send wait
    returned may end while the write to the receiver is still to run (on_wait: at the
    receiver's wait), as on the chip; and a finished DMA leaves the other task queued as a no-op.
    So the send side is pending only before the read, the receive side until the write.
    """
    dma = getattr(task, "__self__", None)
    state = getattr(getattr(dma, "state", None), "name", None)
    if state is None:
        return None
    send_side = getattr(task, "__name__", "") == "execute_read"
    done = state != "STARTED" if send_side else state == "COMPLETED"
    return None if done else dma


def check_kernel_end(sm: Any, device: int, chip: str) -> None:
    """Refuse a kernel that ends on ``device`` with a semaphore above zero or a DMA unwaited."""
    cores = sm.get_global_core_ids(device)
    with sm.lock:
        sems = [*sm.sem.values(), *sm.fixed_id_sem.values()]
    # Across devices, a barrier count left at one device's end means a peer's round it never
    # joined: the peers then wait, and the watchdog reports that deadlock. Raising here while
    # they wait hung the interpreter on jax 0.11.2, so that case is left to the watchdog.
    barriers = set(sm.fixed_id_sem.values()) if int(sm.num_devices) > 1 else set()
    found: list[str] = []
    for sem in sems:
        if sem in barriers:
            continue
        name = semaphore_description(sem)
        with sem.cv:
            for gcid in cores:
                count = int(sem.count_by_core[gcid])
                dmas = [d for d in (_pending_dma(t) for t in sem.tasks[gcid]) if d is not None]
                core = gcid - cores[0]
                if dmas:
                    lines = sorted(
                        {user_location(getattr(d, "source_info", None)) or "?" for d in dmas}
                    )
                    found.append(
                        f"core {core}: {len(dmas)} DMA(s) signalling {name} were never waited "
                        f"for (started at {', '.join(lines)})"
                    )
                elif count:
                    found.append(f"core {core}: {name} ends at count {count}")
    if not found:
        return
    raise UnfinishedKernelError(
        f"a kernel ended on device {device} with work outstanding: " + "; ".join(found),
        rule="a kernel must wait for every DMA it starts and bring every semaphore it signals "
        "(the barrier semaphore included) back to zero before it ends; the chip refuses to "
        "finish it, and the data of an unwaited DMA is undefined",
        chip=chip,
        fix="add the missing .wait() for each DMA (or pltpu.semaphore_wait for each signal), "
        "or signal fewer times",
    )


def check_multicore_vmem_operands(
    jaxpr: Any, mesh: Any, grid_mapping: Any, label: str, chip: str
) -> None:
    """A TensorCore-mesh kernel of more than one core cannot take or return arrays kept in
    VMEM: each core has its own. jax 0.10 refuses it as it discharges the ``core_map``; from
    0.11 Mosaic's lowering does (pallas_call_registration.py), which the interpreter skips."""
    _, cores = compat.tensorcore_cores(mesh) or ("", 1)
    if cores <= 1:
        return
    scratch = getattr(grid_mapping, "num_scratch_operands", 0) or 0
    operands = jaxpr.invars[: len(jaxpr.invars) - scratch]
    if any(memory_space(v.aval) == "vmem" for v in operands):
        raise UnsupportedOnChipError(
            f"{label} over {cores} TensorCores takes or returns an array kept in VMEM "
            "(jax.new_ref(..., memory_space=pltpu.VMEM), or an out_shape of pltpu.VMEM(...))",
            rule="Mosaic: 'TensorCoreMesh does not support VMEM inputs/outputs when there are "
            ">1 cores. Use HBM or ANY instead.' (each core has its own VMEM)",
            chip=chip,
            fix="keep the array in HBM (pltpu.HBM / pl.ANY) and copy it into VMEM scratch in "
            "the kernel, or run the kernel on one core (pltpu.TensorCoreMesh(..., num_cores=1))",
        )


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's kernel entry (checks before tracing) and its kernel-exit hook."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim.chip import current
    from coremesh.testing.sim.deadlock import WATCHDOG

    orig_call = ipc.interpret_pallas_call
    prev_validate = ipc._validate
    orig_validate = getattr(prev_validate, "__wrapped__", prev_validate)

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        params = with_auto_collective_id(kw["jaxpr"], kw.get("compiler_params"))
        check_kernel(
            kw["jaxpr"],
            mesh=kw.get("mesh"),
            compiler_params=params,
            name=kw.get("name"),
            chip=current(),
            grid_mapping=kw.get("grid_mapping"),
        )
        return orig_call(*args, **{**kw, "compiler_params": params})

    @ipc.fail_on_exception
    def validate(token: Any, device_id: Any) -> Any:
        out = orig_validate(token, device_id)
        try:
            check_kernel_end(ipc._get_shared_memory(), int(device_id), current().name)
        except UnfinishedKernelError as err:
            WATCHDOG.record(err)
            raise
        return out

    return [(ipc, "interpret_pallas_call", interpret_pallas_call), (ipc, "_validate", validate)]
