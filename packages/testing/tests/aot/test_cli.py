"""The ``coremesh`` command: info, check and profile, as a user runs them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coremesh.core.chips import CHIPS
from coremesh.testing.cli import _made_by, main
from coremesh.testing.guide import PROGRAMS as GUIDE


def test_info_lists_every_chip_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for c in CHIPS.values():
        line = next(ln for ln in out.splitlines() if ln.startswith(c.name + " "))
        assert c.device_kind in line
        assert f"{c.hbm_bytes_per_s / 1e12:.2f}" in line
        assert c.default_topology in line


def test_info_json_is_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == 0
    doc = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert set(doc) == set(CHIPS)
    v5p_sc = CHIPS["v5p"].sparsecore
    assert v5p_sc is not None and doc["v5p"]["sparsecore"]["subcores"] == v5p_sc.subcores
    assert doc["v5e"]["sparsecore"] is None
    assert doc["TPU7x"]["clock_hz"] == CHIPS["TPU7x"].clock_hz


def test_check_the_guide_programs(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "coremesh.testing.guide:PROGRAMS", "--chips", "v5e,v6e"])
    captured = capsys.readouterr()
    assert code == 0
    rows = {ln.split()[0]: ln.split()[1:] for ln in captured.out.splitlines()[2:7]}
    assert rows["add_one"][0] == "ok" and rows["add_one"][2] == "ok"
    assert rows["sc_add_one"][0] == "n/a" and rows["sc_add_one"][1] == "ok"
    progress = [ln for ln in captured.err.splitlines() if ln.startswith("[")]
    assert len(progress) == 10 and progress[-1].startswith("[10/10] compile")
    assert "10/10 as expected" in captured.err


def test_check_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "check",
            "coremesh.testing.guide:PROGRAMS[add_one]",
            "--chips",
            "TPU7x",
            "--json",
            "-",
            "-q",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0 and captured.err == ""
    (entry,) = json.loads(captured.out)["compile"]
    assert (entry["program"], entry["chip"], entry["status"]) == ("add_one", "TPU7x", "ok")


def test_check_fails_on_a_program_that_does_not_compile(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    out = tmp_path / "aot.json"
    code = main(
        [
            "check",
            "coremesh.testing.aot.samples:VMEM_48_MIB",
            "--chips",
            "v5e",
            "--no-validate",
            "--json",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "FAIL scoped_vmem (!)" in captured.out
    assert "vmem_limit_bytes" in captured.out  # the fix is in the report
    assert json.loads(out.read_text())["compile"][0]["error"]["code"] == "E1001"


def test_check_reports_a_bad_reference_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "coremesh.testing.guide:NOTHING"]) == 2
    assert "no attribute 'NOTHING'" in capsys.readouterr().err


def test_unknown_chip_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["check", "coremesh.testing.guide:PROGRAMS", "--chips", "v9z"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown chip 'v9z'; use v4, v5e, v5p, v6e, TPU7x or all" in err
    assert len(err.splitlines()) == 2, err


BAD_FILE = "import jax\nPROGRAM = (\n"


@pytest.mark.parametrize(
    ("ref", "first", "second"),
    [
        (
            "no_such_module_xyz:PROGRAM",
            "coremesh check: cannot import no_such_module_xyz",
            "fix: install the package",
        ),
        ("mine.py:NOPE", "coremesh check: mine.py has no attribute 'NOPE'", "mine.py defines X"),
        ("broken.py:PROGRAM", "coremesh check: broken.py:2: ", "fix: fix the syntax error"),
        (
            "needs.py:PROGRAM",
            "coremesh check: needs.py imports not_installed_xyz, which is not installed",
            "fix: pip install what needs.py imports",
        ),
    ],
)
def test_usage_errors_are_two_lines_in_the_users_own_names(
    ref: str,
    first: str,
    second: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "mine.py").write_text("X = 1\n")
    (tmp_path / "broken.py").write_text(BAD_FILE)
    (tmp_path / "needs.py").write_text("import not_installed_xyz\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", ref]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(first), lines
    assert second in lines[1], lines
    assert "_coremesh_aot_file" not in "".join(lines)


@pytest.mark.parametrize("command", ["check", "profile"])
def test_a_missing_file_is_one_line(
    command: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([command, "nowhere.py:PROGRAM"]) == 2
    err = capsys.readouterr().err
    looked = tmp_path / "nowhere.py"
    assert err == f"coremesh {command}: nowhere.py: no such file (looked for {looked})\n"


PSUM_FILE = """
import jax
import jax.numpy as jnp
from coremesh.testing.aot import Arg

ROWS = jax.P("device", None)


def total(x):
    return jax.lax.psum(x, "device")


ARGS = [Arg((64, 128), jnp.float32, ROWS)]
PSUM = (jax.jit(jax.shard_map(total, in_specs=ROWS, out_specs=jax.P())), ARGS)
"""


def test_check_a_jitted_psum_pair_on_two_chips(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # A pure-XLA psum over the device axis: unbound if the pair lost its shard_map, and built for
    # the first chip only if the shard_map kept that chip's mesh.
    path = tmp_path / "psum_pair.py"
    path.write_text(PSUM_FILE)
    assert main(["check", f"{path}:PSUM", "--chips", "v5p,v6e", "--json", "-", "-q"]) == 0
    entries = json.loads(capsys.readouterr().out)["compile"]
    assert [(d["program"], d["chip"], d["status"]) for d in entries] == [
        ("total", "v5p", "ok"),
        ("total", "v6e", "ok"),
    ]
    # Each device holds its 16 rows and gets the 16-row sum back.
    assert [d["memory"]["argument_bytes"] for d in entries] == [16 * 128 * 4] * 2
    assert [d["memory"]["output_bytes"] for d in entries] == [16 * 128 * 4] * 2


def test_profile_says_when_a_program_has_no_xla_reference(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "psum_profile.py"
    path.write_text(PSUM_FILE)
    assert main(["profile", f"{path}:PSUM", "--chips", "v5p", "-q", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "- total: no XLA reference, so no XLA figures" in out
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in out.splitlines()]
    (row,) = [r for r in rows if r[:2] == ["total", "v5p"]]
    assert row[2] not in ("", "FAIL") and row[4:6] == ["", ""]  # kernel cycles; no XLA ones
    # With --no-xla nothing is missing, so nothing is said.
    assert main(["profile", f"{path}:PSUM", "--chips", "v5p", "-q", "--no-xla"]) == 0
    assert "no XLA reference" not in capsys.readouterr().out


def test_profile_prints_cycles_roofline_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["profile", "coremesh.testing.aot.samples:ADD_ONE", "--chips", "v5p", "--json", "-"]
    )
    captured = capsys.readouterr()
    assert code == 0
    entries = {d["variant"]: d for d in json.loads(captured.out)["cycles"]}
    assert set(entries) == {"kernel", "xla"}
    for d in entries.values():
        assert d["status"] == "ok" and d["cycles"] > 0
        assert d["ratio"] == pytest.approx(d["seconds"] / d["roofline"]["bound_s"])
    assert "[2/2] profile" in captured.err


def test_aot_all_checks_the_shipped_programs_and_a_baseline(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    assert main(["aot-all", "--chips", "v5e", "-q", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {d["program"] for d in doc["compile"]} >= set(GUIDE)
    # A baseline in which sc_add_one compiled on v5e: now it does not, which is a regression.
    for d in doc["compile"]:
        d["status"] = "ok"
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(doc))
    assert main(["aot-all", "--chips", "v5e", "-q", "--baseline", str(baseline)]) == 1
    err = capsys.readouterr().err
    assert "regression: sc_add_one on v5e (single) compiled in the baseline, now" in err
    # A baseline from another jax line says which.
    assert _made_by(str(baseline)) == ""
    doc["versions"]["jax"] = "0.9.0"
    baseline.write_text(json.dumps(doc))
    assert _made_by(str(baseline)) == f" (jax 0.9.0, libtpu {doc['versions']['libtpu']})"
