"""Each bad kernel of research/AOT_COMPILE.md, through libtpu's real compiler.

coremesh's own checks are off here (``prevalidate=False``) so the compiler is the one that
refuses; each test checks the coremesh error class, the catalogue kind, the chip, the fix, and
that the compiler's own words are kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from coremesh.core.errors import (
    CapacityError,
    LayoutError,
    MeshError,
    UnsupportedOnChipError,
)
from coremesh.testing.aot import Arg, FunctionProgram, compile_on, compile_program
from coremesh.testing.aot import samples as kp
from coremesh.testing.aot.diagnose import (
    KINDS,
    CompilerError,
    DiagnosedError,
    explain,
    headline,
)
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.aot.versions import has_change


def failure(program: Any, chip: str, **kw: Any) -> DiagnosedError:
    r = compile_on(program, CompileTarget.for_chip(chip, **kw), prevalidate=False)
    assert r.status == "failed", f"{program.name} compiled on {chip}"
    err = r.error
    assert isinstance(err, DiagnosedError)
    assert err.chip == chip
    assert err.compiler_message in str(err)  # the compiler's text travels with the error
    return err


@pytest.mark.parametrize(
    ("chip", "limit"),
    [("v5e", "16.00M"), ("v5p", "16.00M"), ("v6e", "32.00M"), ("TPU7x", "32.00M")],
)
def test_48_mib_scratch_over_the_scoped_limit(chip: str, limit: str) -> None:
    err = failure(kp.vmem_scratch(48), chip)
    assert isinstance(err, CapacityError)
    assert (err.kind, err.code) == ("scoped_vmem", "E1001")
    assert "CompileTimeScopedVmemOom" in err.compiler_message
    assert f"limit {limit}" in err.compiler_message
    assert "48.00 MiB" in err.what
    assert "pltpu.CompilerParams(vmem_limit_bytes=53 * 1024 * 1024)" in str(err.fix)


def test_48_mib_scratch_on_v4_exceeds_the_whole_vmem() -> None:
    err = failure(kp.vmem_scratch(48), "v4")
    assert isinstance(err, CapacityError) and err.kind == "vmem_physical"
    assert "would exceed memory (size=16777216)" in err.compiler_message
    assert "no limit can go past the 16.00 MiB" in str(err.fix)


def test_the_fix_for_the_scoped_limit_works() -> None:
    # Following the fix: the same kernel with the suggested limit compiles.
    r = compile_on(kp.vmem_scratch(48, vmem_limit_mib=53), CompileTarget.for_chip("v5e"))
    assert r.status == "ok"


def test_100_mib_scratch_over_the_physical_vmem() -> None:
    err = failure(kp.vmem_scratch(100, vmem_limit_mib=120), "v5p")
    assert isinstance(err, CapacityError) and err.kind == "vmem_physical"
    assert "Allocation (size=104857600) would exceed memory (size=67108864)" in err.compiler_message
    assert "64.00 MiB" in str(err.fix)


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "TPU7x"])
def test_block_4x100_breaks_the_tiles(chip: str) -> None:
    err = failure(kp.add_one(block=(4, 100), cols=1000), chip)
    assert isinstance(err, LayoutError) and err.kind == "tile_alignment"
    assert "aligned to tiles" in err.compiler_message
    assert "tile 8" in err.what
    assert "multiples of (8, 128)" in str(err.fix)


@pytest.mark.parametrize("chip", ["v4", "v5e"])
def test_block_8x64_breaks_the_512_byte_dma_granule(chip: str) -> None:
    err = failure(kp.add_one(block=(8, 64)), chip)
    assert isinstance(err, LayoutError) and err.kind == "dma_granule"
    assert "divisible by 512 bytes" in err.compiler_message
    assert "multiple of 128 elements" in str(err.fix)


def test_block_8x64_breaks_tpu7x_word_alignment() -> None:
    err = failure(kp.add_one(block=(8, 64)), "TPU7x")
    assert isinstance(err, LayoutError) and err.kind == "word_alignment"
    assert "4096 bits" in err.compiler_message
    assert "pl.multiple_of" in str(err.fix)


def test_block_8x64_compiles_on_v5p_and_v6e() -> None:
    # libtpu 0.0.52 takes the half-lane block on these two: no error to diagnose.
    results = compile_program(kp.add_one(block=(8, 64)), ["v5p", "v6e"], prevalidate=False)
    assert [r.status for r in results] == ["ok", "ok"]


def _add_one_on(rows_spec: Any) -> FunctionProgram:
    # 10 GiB in and 10 GiB out: 20 GiB on one device, more than a v5e device's 16 GiB of HBM.
    return FunctionProgram(
        name="add_one_20gib",
        builder=lambda _m: jax.jit(lambda x: x + 1),
        args=[Arg((5 << 19, 1024), jnp.float32, rows_spec)],
    )


def test_buffers_over_the_hbm_of_a_device() -> None:
    err = failure(_add_one_on(None), "v5e")
    assert isinstance(err, CapacityError)
    assert (err.kind, err.code) == ("hbm", "E1000")
    assert "CompileTimeHbmOom" in err.compiler_message
    assert "needs 20.00 GiB of HBM per device" in err.what
    assert "15.75 GiB available (of its 16.02 GiB)" in err.what
    assert "16.02 GiB" in str(err.rule)
    assert "over at least 2 devices" in str(err.fix) and "please report" not in str(err.fix)


def test_the_fix_for_hbm_works() -> None:
    # Following the fix: the same program sharded over 2 devices compiles.
    r = compile_on(_add_one_on(P("device", None)), CompileTarget.for_chip("v5e", devices=2))
    assert r.status == "ok", r.error


@pytest.mark.parametrize(
    ("dtype", "acc", "name"),
    [
        (jnp.int8, jnp.int32, "int8"),
        (jnp.float8_e4m3fn, jnp.float32, "float8_e4m3fn"),
        (jnp.int4, jnp.int32, "int4"),
    ],
)
def test_narrow_matmuls_on_v4(dtype: Any, acc: Any, name: str) -> None:
    err = failure(kp.matmul(dtype, acc), "v4")
    assert isinstance(err, UnsupportedOnChipError)
    assert (err.kind, err.code) == ("matmul_dtype", "E2001")
    assert "CompileTimeMosaicUnsupportedRhsType" in err.compiler_message
    assert name in err.what
    assert "bfloat16" in str(err.fix)
    assert "v4 MXU input pairs" in str(err.rule)


def test_narrow_matmuls_compile_on_v5e() -> None:
    programs = [kp.matmul(jnp.int8, jnp.int32), kp.matmul(jnp.float8_e4m3fn)]
    results = [r for p in programs for r in compile_program(p, ["v5e"], prevalidate=False)]
    assert [r.status for r in results] == ["ok", "ok"]


@pytest.mark.parametrize(
    ("rows", "chip", "kib"),
    [(2048, "v5p", 512), (2048, "v6e", 256), (2048, "TPU7x", 512), (768, "v6e", 256)],
)
def test_sparsecore_scratch_over_the_subcore_vmem(rows: int, chip: str, kib: int) -> None:
    err = failure(kp.sc_scratch(rows), chip)
    assert isinstance(err, CapacityError)
    assert (err.kind, err.code) == ("sparsecore_vmem", "E3000")
    assert "CompileTimeSparseCoreAllocationFailure" in err.compiler_message
    assert f"{rows * 128 * 4 // 1024} KiB" in err.what or "1.00 MiB" in err.what
    assert f"{kib} KiB" in err.what
    assert "emit_pipeline" in str(err.fix)


def test_sparsecore_kernel_in_v5p_split_mode() -> None:
    # In split mode a v5p device drives 2 SparseCores but get_tpu_info() reports 4.
    err = failure(kp.SC_ADD_ONE, "v5p", mode="split")
    assert isinstance(err, MeshError) and err.kind == "sparsecore_cores"
    assert "iteration bound: 4" in err.compiler_message
    assert "mode='megacore'" in str(err.fix) and "num_cores=2" in str(err.fix)


def test_sparsecore_program_not_marked_as_such_on_v5e() -> None:
    unmarked = dataclasses.replace(kp.SC_ADD_ONE, uses_sparsecore=False)
    err = failure(unmarked, "v5e")
    assert isinstance(err, UnsupportedOnChipError) and err.kind == "no_sparsecore"
    assert "uses_sparsecore=True" in str(err.fix)


def test_x64_mode_and_the_pipeline_indices() -> None:
    # Line-aware: jax 0.12 traces the pipeline's indices in 32 bits even with x64 on.
    if has_change("x64_pipeline"):
        with jax.enable_x64(True):
            r = compile_on(kp.ADD_ONE, CompileTarget.for_chip("v5p"), prevalidate=False)
        assert r.status == "ok", r.error
        return
    with jax.enable_x64(True):
        err = failure(kp.ADD_ONE, "v5p")
    assert err.kind == "x64"
    assert "i64" in err.compiler_message
    assert "jax_enable_x64" in str(err.fix)


def test_wrong_sparsecore_register_shape_is_not_rejected() -> None:
    # Documented gap: an (8, 128) register op on a (4, 16)-register SparseCore compiles; the
    # compiler has nothing to diagnose. If libtpu starts refusing it, the catalogue needs it.
    (r,) = compile_program(kp.sc_add_one(reg_shape=(8, 128)), ["v5p"], prevalidate=False)
    assert r.status == "ok"


def test_unknown_messages_keep_the_compiler_text() -> None:
    text = "INTERNAL: Mosaic failed to compile TPU kernel: a message nobody catalogued\nmore"
    err = explain(RuntimeError(text), chip="v6e", program="mine")
    assert isinstance(err, CompilerError) and err.kind == "unknown"
    assert err.compiler_message == f"RuntimeError: {text}"
    assert "a message nobody catalogued" in err.what
    assert err.chip == "v6e"


def test_catalogue_kinds_are_distinct_and_documented() -> None:
    import coremesh.testing.aot.diagnose as d

    assert len(set(KINDS)) == len(KINDS)
    for kind in KINDS:
        assert kind in (d.__doc__ or "")


def test_headline_picks_the_error_code_line() -> None:
    text = "JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out"
    assert headline(text) == "E1001: CompileTimeScopedVmemOom:"


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "TPU7x"])
def test_float16_operands_mosaic_refuses(chip: str) -> None:
    # What the simulator and the ops refuse up front (core.dtypes.check_operand_dtype), the
    # compiler refuses on every generation and jax line: a kernel that only copies its operand.
    err = failure(kp.copy(jnp.float16), chip)
    assert isinstance(err, UnsupportedOnChipError)
    assert err.kind == "operand_dtype"
    assert "float16 cannot be a TPU kernel" in err.what
    assert "bfloat16" in str(err.fix)


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "TPU7x"])
def test_bool_operands_by_jax_line(chip: str) -> None:
    # Line-aware (versions.COMPILER_CHANGES["bool_operand"]): jax 0.10 refuses bool DMAs in its
    # Mosaic lowering, 0.11 and later lower them.
    if has_change("bool_operand"):
        (r,) = compile_program(kp.copy(jnp.bool_), [chip], prevalidate=False)
        assert r.status == "ok", r.error
        return
    err = failure(kp.copy(jnp.bool_), chip)
    assert isinstance(err, UnsupportedOnChipError)
    assert err.kind == "operand_dtype"
    assert "DMAs with bool dtypes are not supported" in err.compiler_message
    assert "bool cannot be a TPU kernel" in err.what
    assert "int8" in str(err.fix)


@pytest.mark.parametrize("chip", ["v5e", "TPU7x"])
def test_ref_memory_space_by_jax_line(chip: str) -> None:
    # Line-aware (versions.COMPILER_CHANGES["traced_attribute"]): jax 0.10 answers
    # ref.memory_space while tracing, 0.11 and later raise and say what to read instead.
    if not has_change("traced_attribute"):
        (r,) = compile_program(kp.reads_memory_space(), [chip], prevalidate=False)
        assert r.status == "ok", r.error
        return
    err = failure(kp.reads_memory_space(), chip)
    assert err.kind == "traced_attribute"
    assert "'memory_space' attribute is not available" in err.compiler_message
    assert "reads .memory_space of a traced value" in err.what
    assert "jax.typeof(x).memory_space" in str(err.fix)


def test_traced_attribute_without_a_suggestion() -> None:
    text = (
        "ValueError: The 'sharding' attribute is not available on traced array with shape f32[8]."
    )
    err = explain(RuntimeError(text), chip="v5e")
    assert isinstance(err, CompilerError) and err.kind == "traced_attribute"
    assert "jax.typeof(x).sharding" in str(err.fix)


@pytest.mark.parametrize("chip", ["v5p", "v6e", "TPU7x"])
def test_indexed_dma_of_bfloat16_rows(chip: str) -> None:
    err = failure(kp.sc_indexed_gather(jnp.bfloat16, 256), chip)
    assert isinstance(err, UnsupportedOnChipError) and err.kind == "indexed_dma_dtype"
    assert "only 32-bit elements are supported" in err.compiler_message
    assert "32-bit elements only" in str(err.rule) and "32-bit words" in str(err.fix)


@pytest.mark.parametrize("chip", ["v5p", "v6e", "TPU7x"])
def test_indexed_dma_of_rows_narrower_than_a_tile(chip: str) -> None:
    err = failure(kp.sc_indexed_gather(jnp.float32, 64), chip)
    assert isinstance(err, LayoutError) and err.kind == "indexed_dma_row"
    assert "expected slice size (64)" in err.compiler_message
    assert "rows of 64 32-bit elements" in err.what
    assert "multiple of 128" in str(err.rule)


def test_indexed_dma_of_whole_tiles_compiles() -> None:
    results = compile_program(kp.sc_indexed_gather(jnp.float32, 128), ["v5p", "v6e", "TPU7x"])
    assert [r.status for r in results] == ["ok", "ok", "ok"]
