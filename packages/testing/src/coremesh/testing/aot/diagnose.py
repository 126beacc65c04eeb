"""The TPU compiler's rejections, turned into coremesh errors that say what to change.

``explain(exc, chip=...)`` matches the text of an exception raised while building, lowering or
compiling a program against a catalogue of messages libtpu 0.0.52 and Mosaic produce, and returns
a ``CompileError`` that keeps the compiler's full text (``compiler_message``), names the chip and
gives the likely fix. Catalogue entries are also instances of the matching coremesh error class
(``CapacityError``, ``LayoutError``, ``UnsupportedOnChipError``, ``MeshError``), so code that
handles coremesh's own pre-compile checks handles the compiler's version of the same problem.

=====================  ==========================================================  ==============
kind                   compiler text (example)                                     class
=====================  ==========================================================  ==============
scoped_vmem            ``E1001: CompileTimeScopedVmemOom ... limit 16.00M``        CapacityError
vmem_physical          ``Allocation (size=...) would exceed memory (size=...)``    CapacityError
vmem_program           ``Ran out of memory in memory space vmem. Used 68.00M of``  CapacityError
hbm                    ``E1000: CompileTimeHbmOom: Ran out of memory on HBM``      CapacityError
tile_alignment         ``Offsets along tiled dimensions must be aligned to tiles`` LayoutError
dma_granule            ``contiguous inner slice ... divisible by 512 bytes``       LayoutError
word_alignment         ``... multiple of the word size (4096 bits)``               LayoutError
matmul_dtype           ``E2001: CompileTimeMosaicUnsupportedRhsType``              UnsupportedOnChip
sparsecore_vmem        ``E3000: CompileTimeSparseCoreAllocationFailure``           CapacityError
sparsecore_cores       ``Core-parallel dimension 0 has iteration bound: 4 ...``    MeshError
sparsecore_layout      ``Failed to find load/store layout``                        LayoutError
indexed_dma_dtype      ``enqueue_indirect_transfer ... only 32-bit elements``      UnsupportedOnChip
indexed_dma_row        ``expected slice size (64) to be aligned with ... (128)``   LayoutError
no_sparsecore          ``'NoneType' object has no attribute 'num_cores'``          UnsupportedOnChip
x64                    ``'arith.cmpi' op requires all operands ... (i32, i64)``    CompileError
operand_dtype          ``Only arguments with ... or 32-bit element types ...``    UnsupportedOnChip
traced_attribute       ``The 'memory_space' attribute is not available on ...``    CompileError
unknown                anything else                                               CompileError
=====================  ==========================================================  ==============
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from coremesh.core import dma
from coremesh.core.chips import CHIPS, Chip, get_chip
from coremesh.core.dtypes import check_matmul_dtypes, check_operand_dtype
from coremesh.core.errors import (
    CapacityError,
    CompileError,
    LayoutError,
    MeshError,
    UnsupportedOnChipError,
)
from coremesh.testing.aot.sizes import parse_size


class DiagnosedError(CompileError):
    """A compiler rejection read against the catalogue: ``kind``, ``code`` (``E1001``...) and the
    program, on top of ``CompileError``'s text, chip and fix."""

    kind: str = "unknown"
    code: str | None = None
    program: str | None = None

    def __init__(
        self,
        what: str,
        *,
        compiler_message: str,
        kind: str,
        code: str | None = None,
        program: str | None = None,
        rule: str | None = None,
        chip: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.kind, self.code, self.program = kind, code, program
        super().__init__(what, compiler_message=compiler_message, rule=rule, chip=chip, fix=fix)

    @property
    def headline(self) -> str:
        """The compiler's first meaningful line, for tables."""
        return headline(self.compiler_message)


class CompilerError(DiagnosedError):
    """The compiler rejected a program for a reason outside the catalogue."""


class CompilerCapacityError(DiagnosedError, CapacityError):
    """The compiler ran out of VMEM, SMEM or SparseCore memory."""


class CompilerLayoutError(DiagnosedError, LayoutError):
    """The compiler refused a block, slice or DMA that breaks the chip's tiling."""


class CompilerUnsupportedError(DiagnosedError, UnsupportedOnChipError):
    """The program uses something the chip does not have (a dtype, SparseCores)."""


class CompilerMeshError(DiagnosedError, MeshError):
    """The program's core mesh does not match the cores the chip's devices drive."""


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def headline(text: str) -> str:
    """The most informative single line of a compiler message."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        m = re.search(r"(E\d{4}: \w+.*)", ln)
        if m:
            return m.group(1)[:300]
    for ln in lines:
        m = re.search(r"HLO name `[^`]*`: (.*)", ln)
        if m:
            return m.group(1)[:300]
    for ln in lines:
        if not ln.startswith(("at location", "The MLIR", "%", '"', "See https")):
            return ln[:300]
    return (lines[0] if lines else text)[:300]


@dataclasses.dataclass(frozen=True)
class _Context:
    chip: Chip
    text: str
    program: str
    kernel: str | None
    mode: str | None
    cores_per_device: int | None

    @property
    def where(self) -> str:
        k = f" (kernel HLO {self.kernel})" if self.kernel else ""
        return f"{self.program}{k}"


_Rule = Callable[[re.Match[str], _Context], DiagnosedError]


def _scoped_vmem(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    size = parse_size(m.group("size"))
    limit = parse_size(m.group("limit"))
    phys = c.vmem_bytes_per_core
    if size <= phys:
        need_mib = min(-(-int(size * 1.1) // 2**20), phys // 2**20)
        fix = (
            f"raise the kernel's scoped limit: pltpu.CompilerParams(vmem_limit_bytes="
            f"{need_mib} * 1024 * 1024) (up to the {_mib(phys)} of physical VMEM), or use "
            "smaller blocks"
        )
    else:
        fix = (
            f"{_mib(size)} is more than the {_mib(phys)} of physical VMEM too: use smaller "
            "blocks or scratch, or stream the data through VMEM with emit_pipeline"
        )
    return CompilerCapacityError(
        f"{ctx.where} needs {_mib(size)} of scoped VMEM; the limit is {_mib(limit)}",
        compiler_message=ctx.text,
        kind="scoped_vmem",
        code="E1001",
        program=ctx.program,
        rule=f"{c.name} scoped VMEM defaults to {_mib(c.scoped_vmem_default_bytes)}; a "
        f"TensorCore has {_mib(phys)}",
        chip=c.name,
        fix=fix,
    )


def _vmem_physical(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    size, memory = int(m.group("size")), int(m.group("memory"))
    phys = c.vmem_bytes_per_core
    if size <= phys:
        fix = (
            f"raise the kernel's scoped limit to at least {size} bytes with "
            f"pltpu.CompilerParams(vmem_limit_bytes=...) (up to {_mib(phys)}), or use smaller "
            "blocks"
        )
    else:
        fix = (
            "use smaller scratch or blocks, or stream the data through VMEM with emit_pipeline; "
            f"no limit can go past the {_mib(phys)} a {c.name} TensorCore has"
        )
    return CompilerCapacityError(
        f"{ctx.where} allocates {_mib(size)} of VMEM; only {_mib(memory)} can be allocated",
        compiler_message=ctx.text,
        kind="vmem_physical",
        program=ctx.program,
        rule=f"{c.name} TensorCore VMEM is {_mib(phys)}; scoped allocations default to "
        f"{_mib(c.scoped_vmem_default_bytes)}",
        chip=c.name,
        fix=fix,
    )


def _vmem_program(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    scoped = re.search(r"scoped\s+(?P<v>[\d.]+[KMG]?)", ctx.text)
    temp = re.search(r"HLO temp\s+(?P<v>[\d.]+[KMG]?)", ctx.text)
    split = (
        f": {scoped['v']} scoped for the kernels and {temp['v']} for XLA's own buffers"
        if scoped and temp
        else ""
    )
    return CompilerCapacityError(
        f"{ctx.where} needs {m['used']} of VMEM{split}; a {c.name} TensorCore has {m['cap']}",
        compiler_message=ctx.text,
        kind="vmem_program",
        program=ctx.program,
        rule="a program's kernels' scoped VMEM limit and the buffers XLA places in VMEM (operands "
        f"it prefetches there) share the {_mib(c.vmem_bytes_per_core)} of one TensorCore",
        chip=c.name,
        fix="lower the kernel's vmem_limit_bytes or leave it at the default "
        f"({_mib(c.scoped_vmem_default_bytes)}), so XLA fits its buffers beside it; with its "
        "static profile on, libtpu 0.0.52 overcommits some raised limits on TPU7x that the "
        "default, or a plain compile, takes",
    )


def _hbm(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    need, have = parse_size(m["need"]), parse_size(m["have"])
    device = c.device(ctx.cores_per_device)
    devices = -(-need // max(have, 1))
    return CompilerCapacityError(
        f"{ctx.where} needs {_gib(need)} of HBM per device for its buffers; a {c.name} device "
        f"has {_gib(have)} available (of its {_gib(device.hbm_bytes)})",
        compiler_message=ctx.text,
        kind="hbm",
        code="E1000",
        program=ctx.program,
        rule="a device's arguments, outputs and XLA's temporaries live in its own HBM at once; "
        f"a {c.name} device has {_gib(device.hbm_bytes)}, less what the runtime reserves",
        chip=c.name,
        fix=f"shard the largest operands over at least {devices} devices (a PartitionSpec "
        "naming 'device' on their rows), store them in a narrower dtype (bfloat16), donate "
        "inputs the outputs can reuse (jax.jit(..., donate_argnums=...)), or process the "
        "data in chunks",
    )


def _tile_alignment(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    dim, tile = m.group("dim"), m.group("tile")
    kind_of = "offset" if m.group("what") == "Offsets" else "size"
    return CompilerLayoutError(
        f"{ctx.where} slices an array with a block {kind_of} that is not a multiple of the "
        f"tile along dim {dim} (tile {tile})",
        compiler_message=ctx.text,
        kind="tile_alignment",
        program=ctx.program,
        rule=f"{c.name} lays arrays out in ({c.sublanes}, {c.lanes}) tiles for 32-bit types "
        "((16, 128) for 16-bit, (32, 128) for 8-bit); block offsets and sizes along the last "
        "two dims must be whole tiles unless a block spans the full dim",
        chip=c.name,
        fix=f"make the block's last two dims multiples of ({c.sublanes}, {c.lanes}) (32-bit) "
        "or the full array dims, and pad the array to whole blocks; if the offset is a "
        "multiple already, say so with pl.multiple_of",
    )


def _dma_granule(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    granule = int(m.group("bytes"))
    return CompilerLayoutError(
        f"{ctx.where} copies a block whose contiguous rows are not a multiple of {granule} bytes",
        compiler_message=ctx.text,
        kind="dma_granule",
        program=ctx.program,
        rule=f"{c.name} DMAs move contiguous runs of whole {granule}-byte granules "
        f"({granule // 4} 32-bit elements); v5p and v6e accept narrower blocks, v4 and v5e do not",
        chip=c.name,
        fix=f"make the block's last dim a multiple of {granule // 4} elements for 32-bit data "
        f"({granule // 2} for 16-bit) or the full array dim",
    )


def _word_alignment(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    bits = int(m.group("bits"))
    return CompilerLayoutError(
        f"{ctx.where} slices memory at an offset the compiler cannot prove is "
        f"{bits // 8}-byte aligned",
        compiler_message=ctx.text,
        kind="word_alignment",
        program=ctx.program,
        rule=f"{c.name} addresses these slices in {bits}-bit words ({bits // 32} 32-bit elements)",
        chip=c.name,
        fix=f"use blocks whose last dim is a multiple of {c.lanes} elements (32-bit); if a "
        "dynamic offset is a multiple already, say so with pl.multiple_of(offset, n)",
    )


_MLIR_DTYPES = {
    "i4": "int4",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E5M2": "float8_e5m2",
    "f8E4M3B11FNUZ": "float8_e4m3b11fnuz",
}


def _matmul_dtype(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    side = m.group("side")
    mlir = m.group("etype")
    dtype = _MLIR_DTYPES.get(mlir, mlir)
    rule = f"{c.name}'s MXU does not take {dtype} operands"
    takers: list[str] = []
    for other in CHIPS.values():
        try:
            check_matmul_dtypes(dtype, dtype, other)
        except Exception as e:
            if other.name == c.name and getattr(e, "rule", None):
                rule = str(getattr(e, "rule", rule))
            continue
        takers.append(other.name)
    where = ", ".join(takers) if takers else "no TPU generation"
    return CompilerUnsupportedError(
        f"{ctx.where} multiplies {dtype} matrices ({side} operand); {c.name} cannot",
        compiler_message=ctx.text,
        kind="matmul_dtype",
        code="E2001",
        program=ctx.program,
        rule=rule,
        chip=c.name,
        fix=f"cast both operands to bfloat16 (accumulate in float32) for {c.name}; jax's MXU "
        f"table lists native {dtype} x {dtype} matmuls on {where}",
    )


def _sparsecore_vmem(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    sc = c.sparsecore
    words, bound = int(m.group("words")), int(m.group("bound")) + 1
    subcores = sc.subcores if sc else 1
    per_subcore = words * 4 // subcores
    cap = sc.vmem_bytes_per_subcore if sc else bound * 4 // subcores
    return CompilerCapacityError(
        f"{ctx.where} allocates {_mib(per_subcore)} of VMEM per SparseCore vector subcore; "
        f"a {c.name} subcore has {_mib(cap)}",
        compiler_message=ctx.text,
        kind="sparsecore_vmem",
        code="E3000",
        program=ctx.program,
        rule=f"each {c.name} vector subcore has {_mib(cap)} of its own VMEM "
        f"({subcores} subcores share {_mib(bound * 4)} per SparseCore)",
        chip=c.name,
        fix="keep per-subcore scratch under that: stream the data through VMEM in chunks "
        "(emit_pipeline), or split it over more subcores",
    )


def _sparsecore_cores(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    bound, active = int(m.group("bound")), int(m.group("active"))
    split = ctx.mode == "split"
    rule = (
        f"a {c.name} device in split mode drives {active} of the chip's SparseCores, but "
        f"pltpu.get_tpu_info() still reports {bound}"
        if split
        else f"a {c.name} device has {active} active core(s) for this kernel"
    )
    fix = (
        "compile in megacore mode (mode='megacore'), or build the VectorSubcoreMesh with "
        f"num_cores={active}"
        if split
        else f"build the core mesh with num_cores={active}"
    )
    return CompilerMeshError(
        f"{ctx.where} runs a core-parallel loop over {bound} cores; the device has {active}",
        compiler_message=ctx.text,
        kind="sparsecore_cores",
        program=ctx.program,
        rule=rule,
        chip=c.name,
        fix=fix,
    )


def _sparsecore_layout(_m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    shape = c.sparsecore.register_shape(4) if c.sparsecore else None
    return CompilerLayoutError(
        f"{ctx.where} loads or stores a SparseCore vector that is not register-shaped",
        compiler_message=ctx.text,
        kind="sparsecore_layout",
        program=ctx.program,
        rule=f"{c.name} SparseCore vector registers hold {shape} 32-bit elements"
        if shape
        else "SparseCore loads and stores move whole vector registers",
        chip=c.name,
        fix=f"slice VMEM refs in {shape} pieces for 32-bit data "
        "(chip.sparsecore.register_shape(itemsize))"
        if shape
        else "slice VMEM refs in whole registers",
    )


def _indexed_dma(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    if m.groupdict().get("size") is None:
        return CompilerUnsupportedError(
            f"{ctx.where} moves 16-bit or 8-bit elements by an indexed DMA (table.at[idx_ref])",
            compiler_message=ctx.text,
            kind="indexed_dma_dtype",
            program=ctx.program,
            rule=dma.DTYPE_RULE,
            chip=ctx.chip.name,
            fix=dma.FIX,
        )
    return CompilerLayoutError(
        f"{ctx.where} moves rows of {m.group('size')} 32-bit elements by an indexed DMA "
        "(table.at[idx_ref])",
        compiler_message=ctx.text,
        kind="indexed_dma_row",
        program=ctx.program,
        rule=dma.ROW_RULE,
        chip=ctx.chip.name,
        fix=dma.FIX,
    )


def _no_sparsecore(_m: re.Match[str], ctx: _Context) -> DiagnosedError:
    c = ctx.chip
    return CompilerUnsupportedError(
        f"{ctx.where} looks for SparseCores and {c.name} has none "
        "(pltpu.get_tpu_info().sparse_core is None)",
        compiler_message=ctx.text,
        kind="no_sparsecore",
        program=ctx.program,
        rule="Pallas SparseCore kernels need v5p, v6e or TPU7x",
        chip=c.name,
        fix="mark the program uses_sparsecore=True so the chip is skipped with a clear error, "
        "or compile it for v5p, v6e or TPU7x only",
    )


def _x64(_m: re.Match[str], ctx: _Context) -> DiagnosedError:
    return CompilerError(
        f"{ctx.where} was traced with 64-bit integers (jax_enable_x64 is on)",
        compiler_message=ctx.text,
        kind="x64",
        program=ctx.program,
        rule="Pallas TPU kernels index with 32-bit integers; x64 mode makes Python ints 64-bit "
        "and Mosaic rejects the mix",
        chip=ctx.chip.name,
        fix="trace TPU kernels with jax_enable_x64 off (jax.config.update('jax_enable_x64', "
        "False)), or cast indices to int32 explicitly",
    )


def _traced_attribute(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    attr = m.group("attr")
    use = m.group("use") or f"jax.typeof(x).{attr}"
    return CompilerError(
        f"{ctx.where} reads .{attr} of a traced value, which jax {_jax_version()} refuses "
        "(ValueError, which getattr(x, name, default) does not catch)",
        compiler_message=ctx.text,
        kind="traced_attribute",
        program=ctx.program,
        rule=f"from jax 0.11 a tracer (a kernel's Ref among them) has no .{attr}: it belongs to "
        "the abstract value; jax 0.10 forwarded it",
        chip=ctx.chip.name,
        fix=f"read {use} instead (it works on jax 0.10 too)",
    )


def _jax_version() -> str:
    from coremesh.testing.aot.versions import jax_version

    return jax_version()


def _operand_dtype(m: re.Match[str], ctx: _Context) -> DiagnosedError:
    dtype = "bool" if m.group("bool") else "float16"
    try:
        check_operand_dtype(dtype, ctx.chip)
    except UnsupportedOnChipError as e:
        return CompilerUnsupportedError(
            f"{ctx.where}: {e.what}",
            compiler_message=ctx.text,
            kind="operand_dtype",
            program=ctx.program,
            rule=e.rule,
            chip=ctx.chip.name,
            fix=e.fix,
        )
    raise AssertionError(f"check_operand_dtype accepts {dtype}")  # pragma: no cover


_SIZE = r"(?P<{}>[\d.]+[KMG]?)"
_CATALOGUE: tuple[tuple[str, re.Pattern[str], _Rule], ...] = (
    (
        "scoped_vmem",
        re.compile(
            r"CompileTimeScopedVmemOom.*?Scoped allocation with size "
            + _SIZE.format("size")
            + r" and limit "
            + _SIZE.format("limit"),
            re.S,
        ),
        _scoped_vmem,
    ),
    (
        "vmem_physical",
        re.compile(
            r"Allocation \(size=(?P<size>\d+)\) would exceed memory \(size=(?P<memory>\d+)\)"
            r".*?space=vmem",
            re.S,
        ),
        _vmem_physical,
    ),
    (
        "vmem_program",
        re.compile(
            r"Ran out of memory in memory space vmem\. Used "
            + _SIZE.format("used")
            + r" of "
            + _SIZE.format("cap")
            + r" vmem"
        ),
        _vmem_program,
    ),
    (
        "hbm",
        re.compile(
            r"Ran out of memory on HBM.*?required for [\w ]+ \((?P<need>[\d.]+[KMGT]?)\) "
            r"exceeds available HBM \((?P<have>[\d.]+[KMGT]?)\)",
            re.S,
        ),
        _hbm,
    ),
    (
        "tile_alignment",
        re.compile(
            r"(?P<what>Offsets|Slice sizes) along tiled dimensions must be aligned to tiles.*?"
            r"(?:index|size) at dimension (?P<dim>\d+) is divisible by the tile dimension "
            r"(?P<tile>\d+)",
            re.S,
        ),
        _tile_alignment,
    ),
    (
        "dma_granule",
        re.compile(
            r"contiguous inner slice in the DMA transfer must be divisible by "
            r"(?P<bytes>\d+) bytes"
        ),
        _dma_granule,
    ),
    (
        "word_alignment",
        re.compile(r"multiple of the word size \((?P<bits>\d+) bits\)"),
        _word_alignment,
    ),
    (
        "matmul_dtype",
        re.compile(
            r"CompileTimeMosaicUnsupported\w*Type: Unsupported matmul (?P<side>LHS|RHS) type on "
            r"target: vector<[\dx]*x(?P<etype>\w+)>"
        ),
        _matmul_dtype,
    ),
    (
        "sparsecore_vmem",
        re.compile(
            r"CompileTimeSparseCoreAllocationFailure.*?upper bound \((?P<bound>\d+) words\) in "
            r"memory space \w+ when allocating (?P<words>\d+) words",
            re.S,
        ),
        _sparsecore_vmem,
    ),
    (
        "sparsecore_cores",
        re.compile(
            r"Core-parallel dimension \d+ has iteration bound: (?P<bound>\d+), which is greater "
            r"than the number of active cores: (?P<active>\d+)"
        ),
        _sparsecore_cores,
    ),
    (
        "sparsecore_layout",
        re.compile(r"Failed to find load/store layout"),
        _sparsecore_layout,
    ),
    (
        "indexed_dma_dtype",
        re.compile(r"enqueue_indirect_transfer' op Not implemented: only 32-bit elements"),
        _indexed_dma,
    ),
    (
        "indexed_dma_row",
        re.compile(
            r"enqueue_indirect_transfer' op Not implemented: expected slice size \((?P<size>\d+)\)"
            r" to be aligned with source"
        ),
        _indexed_dma,
    ),
    (
        "no_sparsecore",
        re.compile(r"'NoneType' object has no attribute '(?:num_cores|num_subcores|num_lanes)'"),
        _no_sparsecore,
    ),
    (
        "x64",
        re.compile(
            r"requires all operands to have the same type.*?\((?:i32, i64|i64, i32)\)", re.S
        ),
        _x64,
    ),
    (
        "operand_dtype",
        re.compile(
            r"Only arguments with [\w, ]+ or 32-bit element types are supported"
            r"|(?P<bool>DMAs with bool dtypes are not supported)"
        ),
        _operand_dtype,
    ),
    (
        "traced_attribute",
        re.compile(
            r"The '(?P<attr>\w+)' (?:attribute|method) is not available on [^\n]*?"
            r"(?:Use `(?P<use>[^`]+)` instead|$)",
            re.M,
        ),
        _traced_attribute,
    ),
)

#: The catalogue's kinds, in matching order.
KINDS: tuple[str, ...] = tuple(k for k, _, _ in _CATALOGUE)


def compiler_text(exc: BaseException) -> str:
    """The exception's own text, led by its type (``JaxRuntimeError: RESOURCE_EXHAUSTED: ...``)."""
    return f"{type(exc).__name__}: {exc}"


def explain(
    exc: BaseException | str,
    *,
    chip: str | Chip,
    topology: Any = None,
    program: str | None = None,
) -> CompileError:
    """A coremesh error for ``exc`` (an exception or the compiler's message) on ``chip``."""
    c = get_chip(chip)
    text = exc if isinstance(exc, str) else compiler_text(exc)
    kernel = re.search(r"HLO name `([^`]+)`", text)
    ctx = _Context(
        chip=c,
        text=text,
        program=program or "the program",
        kernel=kernel.group(1) if kernel else None,
        mode=getattr(topology, "mode", None),
        cores_per_device=getattr(topology, "cores_per_device", None),
    )
    for kind, pattern, rule in _CATALOGUE:
        m = pattern.search(text)
        if m is None:
            continue
        if kind == "no_sparsecore" and c.sparsecore is not None:
            continue
        if kind == "x64" and not _x64_enabled():
            continue
        return rule(m, ctx)
    return CompilerError(
        f"{ctx.where} did not compile for {c.name}: {headline(text)}",
        compiler_message=text,
        kind="unknown",
        program=ctx.program,
        chip=c.name,
        fix="read the compiler's message below; if it is a common mistake, coremesh should "
        "explain it: please report it",
    )


def _x64_enabled() -> bool:
    try:
        import jax

        return bool(jax.config.jax_enable_x64)
    except Exception:  # jax not importable: cannot be on
        return False
