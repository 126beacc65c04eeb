"""Checks that run before a program reaches jax's tracer or libtpu, with coremesh's own errors.

Two stages:

* ``validate_program`` runs before tracing, on what a program declares: what it needs
  (``check_applicable``: SparseCores; this part runs even with validation off), its arguments
  (a float64 argument would make jax 0.10.2's ``emit_pipeline`` loop forever computing a tiling
  factor), how they split over the devices, and, when the program lists them in
  ``declared(num_devices)``, its block shapes and scratch buffers.
* ``validate_traced`` runs on the traced jaxpr, before lowering: it adds up the VMEM and SMEM every
  Pallas kernel allocates (scratch operands and ``run_scoped`` buffers, ``emit_pipeline``'s own
  included, padded to the chip's tiles) and refuses a kernel that asks for more than the scoped
  VMEM limit or a SparseCore subcore's VMEM. The compiler would say the same, later and
  in its own words.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from coremesh.core.capacity import check_fits, nbytes, padded_nbytes
from coremesh.core.chips import Chip
from coremesh.core.dtypes import check_array_dtype, dtype_name
from coremesh.core.errors import LayoutError, MeshError, UnsupportedOnChipError
from coremesh.core.partition import check_block_shape
from coremesh.testing.aot.program import program_name, uses_sparsecore
from coremesh.testing.aot.topology import DEVICE_AXIS, CompileTarget

Space = Literal["vmem", "smem", "sparsecore_vmem"]


@dataclasses.dataclass(frozen=True)
class BlockUse:
    """A block of ``block_shape`` walking an array of ``array_shape`` (per device)."""

    block_shape: tuple[int, ...]
    array_shape: tuple[int, ...]
    dtype: Any


@dataclasses.dataclass(frozen=True)
class Scratch:
    """A scratch buffer a kernel allocates."""

    shape: tuple[int, ...]
    dtype: Any
    space: Space = "vmem"


@dataclasses.dataclass(frozen=True)
class Declared:
    """What a program may declare about its kernels so it can be checked before tracing."""

    blocks: Sequence[BlockUse] = ()
    scratch: Sequence[Scratch] = ()
    vmem_limit_bytes: int | None = None


def argument_structs(program: Any, num_devices: int) -> list[tuple[Any, Any]]:
    """``(ShapeDtypeStruct, PartitionSpec)`` per argument of ``program``."""
    structs = list(program.arg_specs(num_devices))
    specs = list(program.in_specs())
    if len(specs) != len(structs):
        raise MeshError(
            f"{program_name(program)} has {len(structs)} argument(s) but "
            f"{len(specs)} partition spec(s)",
            rule="in_specs() gives one PartitionSpec per argument",
            fix="return one spec per argument (jax.P() for replicated ones)",
        )
    return list(zip(structs, specs, strict=True))


def check_applicable(program: Any, target: CompileTarget) -> None:
    """Refuse a program that needs something the chip does not have (SparseCores)."""
    chip = target.chip
    name = program_name(program)
    if uses_sparsecore(program) and chip.sparsecore is None:
        raise UnsupportedOnChipError(
            f"{name} runs on SparseCores and {chip.name} has none",
            rule="Pallas SparseCore kernels need v5p, v6e or TPU7x",
            chip=chip.name,
            fix="compile SparseCore programs for v5p, v6e or TPU7x only, or give the chip a "
            "TensorCore version of the kernel",
        )


def validate_program(program: Any, target: CompileTarget) -> None:
    """Refuse what cannot compile for ``target`` before anything is traced."""
    check_applicable(program, target)
    name = program_name(program)
    for i, (struct, spec) in enumerate(argument_structs(program, target.num_devices)):
        _check_argument(
            name, i, shape=tuple(struct.shape), dtype=struct.dtype, spec=spec, target=target
        )
    declared = _declared(program, target.num_devices)
    if declared is not None:
        check_declared(declared, target.chip)


def _declared(program: Any, num_devices: int) -> Declared | None:
    fn = getattr(program, "declared", None)
    if fn is None:
        return None
    result = fn(num_devices)
    return result if isinstance(result, Declared) else None


def _check_argument(
    name: str, index: int, *, shape: tuple[int, ...], dtype: Any, spec: Any, target: CompileTarget
) -> None:
    chip = target.chip
    try:
        check_array_dtype(dtype, chip)
    except UnsupportedOnChipError as e:
        raise UnsupportedOnChipError(
            f"{name}: argument {index} is {dtype_name(dtype)}; {e.what}",
            rule=e.rule,
            chip=chip.name,
            fix=e.fix,
        ) from None
    entries = tuple(spec) if spec is not None else ()
    if len(entries) > len(shape):
        raise MeshError(
            f"{name}: argument {index} has shape {shape} but spec {spec} names {len(entries)} dims",
            rule="a PartitionSpec has at most one entry per array dim",
            chip=chip.name,
            fix="drop the extra entries",
        )
    for dim, entry in enumerate(entries):
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        for axis in axes:
            if axis != DEVICE_AXIS:
                raise MeshError(
                    f"{name}: argument {index} is split over axis {axis!r}",
                    rule=f"compile-only device meshes have the one axis {DEVICE_AXIS!r}",
                    chip=chip.name,
                    fix=f"split arguments over {DEVICE_AXIS!r} (jax.P({DEVICE_AXIS!r}, None))",
                )
        parts = target.num_devices ** len(axes)
        if axes and shape[dim] % parts:
            raise LayoutError(
                f"{name}: argument {index} dim {dim} of size {shape[dim]} does not split over "
                f"{parts} devices",
                rule="a dim split over the device axis is a whole multiple of the device count",
                chip=chip.name,
                fix=f"pad dim {dim} to {math.ceil(shape[dim] / parts) * parts}, or compile "
                "for a device count that divides it",
            )


def check_declared(declared: Declared, chip: Chip) -> None:
    """Check declared blocks against the chip's tiles and declared scratch against its memory."""
    for b in declared.blocks:
        check_array_dtype(b.dtype, chip)
        check_block_shape(b.block_shape, b.array_shape, b.dtype, chip)
    totals: dict[Space, int] = {}
    for s in declared.scratch:
        check_array_dtype(s.dtype, chip)
        size = (
            padded_nbytes(s.shape, s.dtype, chip)
            if s.space != "sparsecore_vmem"
            else nbytes(s.shape, s.dtype)
        )
        totals[s.space] = totals.get(s.space, 0) + size
    for space, total in totals.items():
        check_fits(
            total,
            chip,
            space,
            vmem_limit_bytes=_clamped(declared.vmem_limit_bytes, chip),
            what="declared scratch",
        )


def _clamped(limit: int | None, chip: Chip) -> int | None:
    """libtpu 0.0.52 accepts a vmem_limit_bytes above the physical VMEM and uses the physical."""
    return None if limit is None else min(limit, chip.vmem_bytes_per_core)


# ------------------------------------------------------------------------- traced jaxprs


@dataclasses.dataclass(frozen=True)
class KernelMemory:
    """What one Pallas kernel allocates, from its jaxpr: every scratch operand plus the deepest
    nest of ``run_scoped`` buffers, padded to tiles (Mosaic may still drop a dead buffer)."""

    name: str
    sparsecore: bool
    vmem_bytes: int
    smem_bytes: int
    vmem_limit_bytes: int | None


def validate_traced(
    jaxpr: Any, target: CompileTarget, program: str = "the program"
) -> list[KernelMemory]:
    """Refuse kernels whose allocations cannot fit; returns what was measured per kernel."""
    chip = target.chip
    found = list(kernel_memory(jaxpr, chip))
    for i, k in enumerate(found):
        core = "SparseCore" if k.sparsecore else "TensorCore"
        nth = f" #{i + 1}" if len(found) > 1 else ""
        what = f"{program}: {core} kernel{nth} scratch and pipeline buffers"
        if k.sparsecore:
            check_fits(k.vmem_bytes, chip, "sparsecore_vmem", what=what)
        else:
            limit = _clamped(k.vmem_limit_bytes, chip)
            check_fits(k.vmem_bytes, chip, "vmem", vmem_limit_bytes=limit, what=what)
        check_fits(k.smem_bytes, chip, "smem", what=what)
    return found


_KERNEL_PRIMITIVES = ("mpmd_map", "core_map", "pallas_call")


def kernel_memory(jaxpr: Any, chip: Chip) -> Iterator[KernelMemory]:
    """Every Pallas kernel in ``jaxpr`` (nested anywhere) with its allocation lower bound."""
    for eqn in _eqns(jaxpr):
        prim = eqn.primitive.name
        if prim in _KERNEL_PRIMITIVES:
            yield from _kernel_entries(eqn, chip)
        else:
            for sub in _sub_jaxprs(eqn.params):
                yield from kernel_memory(sub, chip)


def _kernel_entries(eqn: Any, chip: Chip) -> Iterator[KernelMemory]:
    params = eqn.params
    limit = _vmem_limit(params.get("compiler_params"))
    name = str(params.get("name") or params.get("name_and_src_info") or eqn.primitive.name)
    bodies: list[tuple[Any, Any]]
    if "jaxprs" in params:  # pl.kernel / core_map over one or more meshes
        meshes = params.get("meshes") or (None,) * len(params["jaxprs"])
        bodies = list(zip(meshes, params["jaxprs"], strict=False))
    else:
        bodies = [(params.get("mesh"), params.get("jaxpr"))]
    for mesh, body in bodies:
        inner = getattr(body, "jaxpr", body)
        if inner is None or not hasattr(inner, "eqns"):
            continue
        sc = "Subcore" in type(mesh).__name__
        vmem, smem = scoped_bytes(inner, chip, own=inner.invars, tiled=not sc)
        yield KernelMemory(name.split(" ", maxsplit=1)[0], sc, vmem, smem, limit)


def scoped_bytes(jaxpr: Any, chip: Chip, own: Sequence[Any], *, tiled: bool) -> tuple[int, int]:
    """(vmem, smem) live at the deepest point: ``own`` refs plus the largest nested scope."""
    vmem = smem = 0
    for v in own:
        space, size = _ref_bytes(v.aval, chip, tiled)
        if space == "vmem":
            vmem += size
        elif space == "smem":
            smem += size
    inner_v = inner_s = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "run_scoped":
            body = eqn.params["jaxpr"]
            v, s = scoped_bytes(body, chip, own=body.invars, tiled=tiled)
        else:
            v = s = 0
            for sub in _sub_jaxprs(eqn.params):
                sv, ss = scoped_bytes(sub, chip, own=(), tiled=tiled)
                v, s = max(v, sv), max(s, ss)
        inner_v, inner_s = max(inner_v, v), max(inner_s, s)
    return vmem + inner_v, smem + inner_s


def _ref_bytes(aval: Any, chip: Chip, tiled: bool) -> tuple[str | None, int]:
    space = getattr(aval, "memory_space", None)
    inner = getattr(aval, "inner_aval", None)
    if space is None or inner is None or not hasattr(inner, "shape"):
        return None, 0
    name = str(getattr(space, "value", space)).lower()
    if name not in ("vmem", "smem"):
        return None, 0
    try:
        shape = tuple(inner.shape)
        size = padded_nbytes(shape, inner.dtype, chip) if tiled else nbytes(shape, inner.dtype)
        return name, size
    except Exception:  # semaphores and other non-array payloads take no data memory
        return None, 0


def _vmem_limit(compiler_params: Any) -> int | None:
    candidates = [compiler_params]
    if isinstance(compiler_params, dict):
        candidates = list(compiler_params.values())
    for cp in candidates:
        limit = getattr(cp, "vmem_limit_bytes", None)
        if isinstance(limit, int):
            return limit
    return None


def _eqns(jaxpr: Any) -> list[Any]:
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    return list(getattr(inner, "eqns", ()))


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    for value in params.values():
        items = value if isinstance(value, tuple | list) else (value,)
        for item in items:
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns"):
                yield inner
