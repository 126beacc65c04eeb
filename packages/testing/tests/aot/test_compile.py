"""The compile matrix: the guide's programs on every generation, results, program forms."""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from coremesh.core.chips import CHIPS
from coremesh.core.errors import MeshError, UnsupportedOnChipError
from coremesh.testing.aot import (
    DEFAULT_CHIPS,
    Arg,
    CompileResult,
    FunctionProgram,
    ProgramError,
    ProgramRef,
    as_programs,
    compile_matrix,
    compile_program,
    jitted_program,
    load,
    matrix_table,
    to_json,
)
from coremesh.testing.aot import samples as kp
from coremesh.testing.aot.program import reference_of
from coremesh.testing.guide import PROGRAMS as GUIDE

SPARSECORE_CHIPS = {c.name for c in CHIPS.values() if c.sparsecore is not None}


@pytest.fixture(scope="module")
def guide_matrix() -> list[CompileResult]:
    return compile_matrix(list(GUIDE.values()))


def test_default_chips_are_every_generation() -> None:
    assert set(DEFAULT_CHIPS) == set(CHIPS)


def test_guide_programs_compile_everywhere_they_should(guide_matrix: list[CompileResult]) -> None:
    assert len(guide_matrix) == len(GUIDE) * len(CHIPS)
    for r in guide_matrix:
        should = not GUIDE[r.program].uses_sparsecore or r.chip in SPARSECORE_CHIPS
        assert r.ok == should, (r.program, r.chip, r.error)
        assert r.as_expected
        if r.ok:
            assert r.compile_seconds > 0 and r.memory is not None


def test_sparsecore_program_fails_clearly_on_v4_and_v5e(guide_matrix: list[CompileResult]) -> None:
    failed = {(r.program, r.chip): r for r in guide_matrix if not r.ok}
    assert set(failed) == {("sc_add_one", "v4"), ("sc_add_one", "v5e")}
    for r in failed.values():
        assert r.status == "unsupported"
        assert isinstance(r.error, UnsupportedOnChipError)
        assert r.error.chip == r.chip and "SparseCores" in r.error.what


def test_memory_figures_are_per_device(guide_matrix: list[CompileResult]) -> None:
    # Independent reference: the global argument split over the 4 devices, 4 bytes per float32.
    (x,) = GUIDE["add_one"].arg_specs(4)
    shard = x.shape[0] // 4 * x.shape[1] * 4
    for r in guide_matrix:
        if r.program == "add_one":
            assert r.num_devices == 4
            assert r.memory is not None
            assert (r.memory.argument_bytes, r.memory.output_bytes) == (shard, shard)


def test_split_mode_compiles_tensorcore_programs_and_explains_sparsecore() -> None:
    results = compile_matrix(list(GUIDE.values()), ["v4", "v5p"], mode="split")
    for r in results:
        assert r.cores_per_device == 1 and r.mode == "split"
        if not GUIDE[r.program].uses_sparsecore:
            assert r.ok, (r.program, r.chip, r.error)
    sc = {r.chip: r for r in results if r.program == "sc_add_one"}
    assert sc["v4"].status == "unsupported"
    # The guide sizes its SparseCore mesh from get_tpu_info(), which reports 4 SparseCores for
    # a split v5p device that drives 2: the compiler refuses, coremesh says why.
    assert sc["v5p"].status == "failed" and not sc["v5p"].as_expected
    assert isinstance(sc["v5p"].error, MeshError)


def test_keep_executable_and_json() -> None:
    (r,) = compile_program(GUIDE["add_one"], ["v6e"], keep_executable=True)
    assert r.compiled is not None and "tpu_custom_call" in r.compiled.as_text()
    (bad,) = compile_program(kp.vmem_scratch(48), ["v6e"], prevalidate=False)
    doc = json.loads(to_json([r, bad]))
    assert doc["versions"]["libtpu"]
    first, second = doc["compile"]
    assert first["status"] == "ok" and first["memory"]["argument_bytes"] > 0
    assert second["error"]["kind"] == "scoped_vmem"
    assert "CompileTimeScopedVmemOom" in second["error"]["compiler_message"]
    assert second["error"]["fix"]


def test_matrix_table_marks_outcomes() -> None:
    results = compile_matrix([GUIDE["add_one"], GUIDE["sc_add_one"]], ["v5e", "v5p"])
    table = matrix_table(results, "markdown")
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:4]}
    assert "ok" in rows["add_one"]
    assert "n/a" in rows["sc_add_one"].split("|")[2]
    assert "sc_add_one on v5e" in table and "fix:" in table


def test_not_applicable_cells_are_one_line_per_reason() -> None:
    programs = [GUIDE["sc_add_one"], GUIDE["sc_add_one"]]
    results = compile_matrix(programs, ["v4", "v5e", "v5p"])
    notes = [ln for ln in matrix_table(results, "plain").splitlines() if ln.startswith("* ")]
    assert notes == [
        "* n/a (Pallas SparseCore kernels need v5p, v6e or TPU7x): sc_add_one on v4, v5e"
    ]


def test_progress_reports_start_and_end_of_every_compile() -> None:
    events: list[Any] = []
    compile_matrix([GUIDE["swap_kernel"]], ["v5e", "TPU7x"], progress=events.append)
    assert [(e.chip, e.result is not None) for e in events] == [
        ("v5e", False),
        ("v5e", True),
        ("TPU7x", False),
        ("TPU7x", True),
    ]
    assert events[-1].index == events[-1].total == 2


def double(x: Any) -> Any:
    return x * 2


MESH_FREE = jax.jit(
    jax.shard_map(double, in_specs=jax.P("device", None), out_specs=jax.P("device", None))
)


def test_a_jitted_function_that_takes_its_mesh_from_context() -> None:
    # MESH_FREE's shard_map keeps v5e's mesh once traced; this program cannot be found again at
    # module level (test modules are not importable), so TPU7x is refused with the way out.
    program = jitted_program(MESH_FREE, [Arg((64, 128), jnp.float32, jax.P("device", None))])
    first, second = compile_program(program, ["v5e", "TPU7x"])
    assert first.status == "ok"
    assert first.memory is not None and first.memory.argument_bytes == 16 * 128 * 4  # a quarter
    assert second.status == "invalid" and isinstance(second.error, ProgramError)
    assert "already compiled for another chip" in second.error.what
    assert second.error.fix is not None and "mesh= to jax.shard_map" in second.error.fix


def test_program_forms() -> None:
    pair = as_programs((MESH_FREE, [jax.ShapeDtypeStruct((8, 128), jnp.float32)]))
    assert [p.name for p in pair] == ["double"]
    assert pair[0].in_specs() == (jax.P(),)
    assert [p.name for p in as_programs(GUIDE)] == list(GUIDE)
    assert as_programs(lambda: GUIDE["add_one"]) == [GUIDE["add_one"]]
    with pytest.raises(ProgramError, match="not a program"):
        as_programs(42)


def test_references_resolve_and_are_found_again() -> None:
    assert load("coremesh.testing.guide:PROGRAMS[add_one]") == [GUIDE["add_one"]]
    assert load("coremesh.testing.guide:PROGRAMS") == list(GUIDE.values())
    assert str(reference_of(GUIDE["indexed_add_one"])) == (
        "coremesh.testing.guide:PROGRAMS[indexed_add_one]"
    )
    ref = reference_of(kp.ADD_ONE)
    assert ref is not None and (ref.attr, ref.key) == ("ADD_ONE", None)
    assert ref.module == "coremesh.testing.aot.samples"
    assert reference_of(kp.add_one()) is None  # not bound to any module-level name


def test_file_references_load_the_module_from_its_path(tmp_path: Any) -> None:
    path = tmp_path / "my_programs.py"
    path.write_text(
        "from coremesh.testing.aot import samples\n"
        "MINE = {'blocks': samples.add_one(block=(256, 512), name='blocks')}\n"
    )
    ref = ProgramRef.parse(f"{path}:MINE[blocks]")
    assert ref.file == str(path)
    (p,) = load(f"{path}:MINE[blocks]")
    assert isinstance(p, FunctionProgram) and p.name == "blocks"


def test_a_key_picks_a_program_from_a_function_returning_a_list(tmp_path: Any) -> None:
    # `coremesh.programs` entry points name such functions; the profiler's children look each
    # program up by key, so `coremesh profile pkg.programs:programs` needs this.
    path = tmp_path / "listed.py"
    path.write_text(
        "from coremesh.testing.aot import samples\n"
        "def programs():\n"
        "    return [samples.add_one(name='one'), samples.add_one(block=(256, 512), name='two')]\n"
    )
    (p,) = load(f"{path}:programs[two]")
    assert isinstance(p, FunctionProgram) and p.name == "two"
    with pytest.raises(ProgramError, match="no program named 'three'"):
        load(f"{path}:programs[three]")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("coremesh.testing.guide", "not a program reference"),
        ("coremesh.testing.guide:NOPE", "no attribute 'NOPE'"),
        ("coremesh.testing.guide:PROGRAMS[nope]", "no entry 'nope'"),
        ("coremesh.no_such_module:X", "cannot import"),
    ],
)
def test_bad_references_say_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(ProgramError, match=match):
        load(text)
