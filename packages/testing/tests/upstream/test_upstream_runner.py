"""The upstream runner on a tiny JAX-style tree: outcomes, first lines, gates, hangs, imports."""

from __future__ import annotations

import io
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from coremesh.testing import cli
from coremesh.testing.upstream import report
from coremesh.testing.upstream.events import Status, TestResult
from coremesh.testing.upstream.file_run import FileRun, Mode
from coremesh.testing.upstream.last_run import read_last_run
from coremesh.testing.upstream.live import Live, heartbeat
from coremesh.testing.upstream.parts import WHOLE, Part, deal, plan
from coremesh.testing.upstream.run import (
    XLA_CPU_LEVEL,
    child_environment,
    run_tree,
    select_files,
    start_order,
)
from coremesh.testing.upstream.tree import read_tree

SYNTHETIC = """
import time
import unittest

import jax
from jax._src import test_util as jtu
from jax._src.pallas import synthetic_test_util as stu


class SyntheticTest(unittest.TestCase):

  def test_pass(self):
    self.assertEqual(stu.MARK, "served from the tree")

  def test_fail(self):
    self.assertEqual(1 + 1, 3, "one and one")

  def test_error(self):
    raise ValueError("broken on purpose\\nsecond line")

  def test_bare_error(self):
    raise AttributeError

  def test_hang(self):
    time.sleep(600)

  def test_skip(self):
    self.skipTest("skipped on purpose")

  def test_tpu_gate(self):
    if not jtu.test_device_matches(["tpu"]):
      self.skipTest("Need TPU devices")
    self.assertEqual(jtu.get_tpu_version(), 5)
    self.assertTrue(jtu.is_device_tpu(5, "p"))
    self.assertFalse(jtu.is_device_tpu(5, "e"))
    self.assertEqual(jax.device_count(), 4)
"""


def _tree(root: Path) -> Path:
    tree = root / "jax-0.10.2"
    (tree / "tests" / "pallas").mkdir(parents=True)
    (tree / "jax" / "_src" / "pallas").mkdir(parents=True)
    (tree / "COMMIT").write_text("jax-v0.10.2\n")
    (tree / "jax" / "_src" / "pallas" / "synthetic_test_util.py").write_text(
        'MARK = "served from the tree"\n'
    )
    (tree / "tests" / "pallas" / "tpu_synthetic_test.py").write_text(textwrap.dedent(SYNTHETIC))
    (tree / "tests" / "pallas" / "tpu_broken_test.py").write_text("import no_such_module_here\n")
    return tree


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """``coremesh upstream`` on the tiny tree, simulator mode: (its JSON, its markdown table)."""
    base = tmp_path_factory.mktemp("upstream")
    out = base / "out"
    tree = _tree(base)
    # Both paths as a user types them, relative to where they stand (the tree must not be
    # resolved against the run's own working directory).
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        argv = ["upstream", "--jax-tests", tree.name, "--mode", "sim", "--timeout", "8"]
        assert cli.main([*argv, "--out", "out", "-q"]) == 0
    (doc,) = out.glob("upstream-jax-*.json")
    (table,) = out.glob("upstream-jax-*.md")
    parsed: dict[str, Any] = json.loads(doc.read_text())
    return parsed, table.read_text()


def _file(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [f for f in doc["files"] if f["file"] == name]
    found: dict[str, Any] = entry
    return found


def test_each_outcome_is_counted_with_its_first_line(
    synthetic: tuple[dict[str, Any], str],
) -> None:
    run = _file(synthetic[0], "tpu_synthetic_test.py")
    lines = textwrap.dedent(SYNTHETIC).splitlines()
    bare = f"tpu_synthetic_test.py:{lines.index('    raise AttributeError') + 1}"
    got = {t["nodeid"].rsplit("::", 1)[-1]: (t["status"], t["message"]) for t in run["tests"]}
    assert got == {
        "test_pass": ("pass", ""),
        "test_fail": ("fail", "AssertionError: 2 != 3 : one and one"),
        "test_error": ("error", "ValueError: broken on purpose"),
        "test_bare_error": ("error", f"AttributeError: (no message) raised at {bare}"),
        "test_hang": ("hang", "no result within 8 s (pytest-timeout)"),
        "test_skip": ("skip", "skipped on purpose"),
        "test_tpu_gate": ("pass", ""),
    }
    assert run["counts"] == {"pass": 2, "fail": 1, "error": 2, "hang": 1, "skip": 1}
    assert run["processes"] == 2  # the hang ended the first child; the rest ran in a second


def test_a_file_whose_import_fails_is_not_run(synthetic: tuple[dict[str, Any], str]) -> None:
    run = _file(synthetic[0], "tpu_broken_test.py")
    assert run["tests"] == []
    assert run["not_run"] == "ModuleNotFoundError: No module named 'no_such_module_here'"


def test_the_table_has_a_row_per_file_and_the_non_passes(
    synthetic: tuple[dict[str, Any], str],
) -> None:
    doc, table = synthetic
    assert doc["tree"]["release"] == "0.10.2"
    rows = [ln for ln in table.splitlines() if ln.startswith("| tpu_")]
    assert rows[0].startswith(
        "| tpu_broken_test | 0 | not run: ModuleNotFoundError: No module named"
    )
    assert rows[1].startswith("| tpu_synthetic_test | 7 | 2/1/2/1/1 |")
    assert "- `SyntheticTest::test_hang`: hang: no result within 8 s (pytest-timeout)" in table
    assert "simulator: 7 tests, 2 pass, 1 fail, 2 error, 1 hang, 1 skip" in table
    assert "simulator: 2 of the 6 tests that were not skipped pass (33.3%)" in table
    assert "| 1 | hang | no result within _ s (pytest-timeout) |" in table
    assert "| 1 | fail | AssertionError: _ != _ : one and one |" in table


def test_stock_mode_sees_the_chip_on_the_host_devices(tmp_path: Path) -> None:
    tree = read_tree(_tree(tmp_path))
    files = select_files(tree, ["tpu_synthetic_test"])
    (run,) = run_tree(tree, files, ["stock"], tmp_path / "out", timeout=30, keyword="gate or pass")
    assert {r.nodeid.rsplit("::", 1)[-1]: r.status for r in run.results} == {
        "test_pass": "pass",
        "test_tpu_gate": "pass",  # 4 host devices: what the file's tests need, as stock runs it
    }


def test_children_keep_bytecode_out_of_the_tree_even_where_it_is_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine with PYTHONDONTWRITEBYTECODE made every child compile jax from source again; the
    children cache bytecode under the prefix and write nothing beside the tree's files."""
    cache = tmp_path / "pycache"
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(cache))
    root = _tree(tmp_path)
    tree = read_tree(root)
    files = select_files(tree, ["tpu_synthetic_test"])
    (run,) = run_tree(tree, files, ["stock"], tmp_path / "out", timeout=30, keyword="pass")
    assert [r.status for r in run.results] == ["pass"]
    cached = {p.name.split(".")[0] for p in cache.rglob("*.pyc")}
    assert {"tpu_synthetic_test", "synthetic_test_util", "api"} <= cached  # the tree's, jax's
    assert not list(root.rglob("__pycache__"))


def test_children_compile_at_xla_cpu_level_1_unless_the_user_chose_a_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4 --xla_dump_to=d")
    flags = child_environment("sim", "tpu_x_test.py")["XLA_FLAGS"].split()
    assert sorted(flags) == sorted(
        ["--xla_dump_to=d", XLA_CPU_LEVEL, "--xla_force_host_platform_device_count=16"]
    )
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=3")
    flags = child_environment("stock", "tpu_x_test.py")["XLA_FLAGS"].split()
    assert [f for f in flags if "optimization_level" in f] == ["--xla_backend_optimization_level=3"]


def test_cli_usage_error_on_a_missing_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["upstream", "--jax-tests", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith("coremesh upstream: no JAX test tree at ")


def test_stock_mode_forces_interpret_mode_only_for_tpu_tests() -> None:
    """The CPU interpret-mode files pass their own InterpretParams, which a forced mode would
    replace; TPU test files need the forced mode to run on the host at all."""
    from jax._src import config

    from coremesh.testing.upstream.needs import Needs
    from coremesh.testing.upstream.shims import _context

    def forced() -> object:
        value: object = config.pallas_tpu_interpret_mode_context_manager.value
        return value

    with _context("stock", Needs(device_under_test="cpu")):
        assert forced() is None
    with _context("stock", Needs(device_under_test="tpu")):
        assert forced() is not None
    assert forced() is None


def _subset_run(tmp_path: Path, names: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    tree = _tree(tmp_path)
    subsets = tmp_path / "subsets"
    subsets.mkdir()
    ids = [f"tpu_synthetic_test.py::SyntheticTest::{n}" for n in names]
    (subsets / "jax-0.10.2.txt").write_text("# what must pass\n" + "\n".join(ids) + "\n")
    argv = ["upstream", "--jax-tests", str(tree), "--mode", "sim", "--timeout", "30"]
    code = cli.main([*argv, "--subset", str(subsets), "--out", str(tmp_path / "out"), "-q"])
    doc = json.loads(next((tmp_path / "out").glob("upstream-jax-*.json")).read_text())
    ran = [t["nodeid"] for f in doc["files"] for t in f["tests"]]
    assert sorted(ran) == sorted(ids)  # only the listed tests ran, and only their file
    return code


def test_a_subset_runs_only_its_tests_and_passes_when_they_all_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _subset_run(tmp_path, ["test_pass", "test_tpu_gate"], capsys) == 0
    assert "subset jax-0.10.2.txt: all 2 tests passed on the simulator" in capsys.readouterr().out


def test_a_subset_fails_naming_each_listed_test_that_did_not_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _subset_run(tmp_path, ["test_pass", "test_fail", "test_skip"], capsys) == 1
    out = capsys.readouterr().out
    assert "subset jax-0.10.2.txt: 2 of 3 tests did not pass:" in out
    assert "SyntheticTest::test_fail: fail: AssertionError: 2 != 3 : one and one" in out
    assert "SyntheticTest::test_skip: skip: skipped on purpose" in out


def test_a_subset_line_that_is_not_a_node_id_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _tree(tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_text("tpu_synthetic_test.py::SyntheticTest::test_pass\ntest_fail\n")
    argv = ["upstream", "--jax-tests", str(tree), "--subset", str(bad), "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: 'test_fail' is not a node id" in err


MEMORY = """
import time
import unittest

import numpy as np


class MemoryTest(unittest.TestCase):

  def test_a_hog(self):
    held = np.ones(2**30 // 8)  # 1 GiB, every page written
    time.sleep(60)
    del held

  def test_b_after(self):
    pass
"""


def _one_file(tmp_path: Path, name: str, source: str) -> tuple[Any, list[Path]]:
    """The tiny tree with test file ``name`` added: (the tree, ``[that file]``)."""
    root = _tree(tmp_path)
    (root / "tests" / "pallas" / f"{name}.py").write_text(textwrap.dedent(source))
    tree = read_tree(root)
    return tree, select_files(tree, [name])


def test_a_test_over_the_memory_limit_is_stopped_and_the_file_goes_on(tmp_path: Path) -> None:
    tree, files = _one_file(tmp_path, "tpu_memory_test", MEMORY)
    (run,) = run_tree(tree, files, ["stock"], tmp_path / "out", timeout=120, memory_limit=2**29)
    assert {r.nodeid.rsplit("::", 1)[-1]: (r.status, r.message) for r in run.results} == {
        "test_a_hog": ("error", "over 0.5 GiB of host memory; the runner stopped it"),
        "test_b_after": ("pass", ""),
    }
    assert run.processes == 2


GROWTH = """
import unittest

import numpy as np

HELD = []  # what a process keeps from test to test, as jax's caches do


class GrowthTest(unittest.TestCase):

  def _grow(self):
    self.assertLess(len(HELD), 2, "a process went on past the recycle threshold")
    HELD.append(np.ones(600 * 2**20 // 8))  # 600 MiB, every page written

  def test_1(self):
    self._grow()

  def test_2(self):
    self._grow()

  def test_3(self):
    self._grow()

  def test_4(self):
    self._grow()

  def test_5(self):
    self._grow()
"""


def test_a_process_holding_half_the_memory_limit_after_a_test_is_replaced(
    tmp_path: Path,
) -> None:
    # At a 2 GiB limit the child stops after a test once it holds over 1 GiB (at the latest
    # after its second 600 MiB); the runner runs the tests left in a new one. Without that the
    # third test of a process fails.
    tree, files = _one_file(tmp_path, "tpu_growth_test", GROWTH)
    (run,) = run_tree(tree, files, ["stock"], tmp_path / "out", timeout=120, memory_limit=2**31)
    assert [(r.nodeid.rsplit("::", 1)[-1], r.status) for r in run.results] == [
        (f"test_{i}", "pass") for i in range(1, 6)
    ]
    assert 3 <= run.processes <= 5


def test_the_largest_of_processes_together_over_the_budget_is_stopped() -> None:
    """Two processes share a 1 GiB budget: 200 MiB beside 600 MiB is inside it; 700 MiB beside
    600 MiB is not, and only the larger is stopped; one process alone over it is stopped."""
    import subprocess
    import sys

    from coremesh.testing.upstream.memory_budget import MemoryBudget, resident_bytes

    def holding(mib: int) -> subprocess.Popen[bytes]:
        code = f"import sys, numpy; a = numpy.ones({mib} * 2**20 // 8); print(1, flush=True); "
        code += "sys.stdin.read()"
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"1\n"  # every page written
        return proc

    budget = MemoryBudget(2**30, jobs=2)
    assert budget.recycle_bytes == 2**28  # half of each job's share
    small, big = holding(200), holding(600)
    try:
        with budget.watching(small.pid), budget.watching(big.pid):
            assert not budget.over(small.pid) and not budget.over(big.pid)
            bigger = holding(700)
            try:
                with budget.watching(bigger.pid):
                    held = {p: resident_bytes(p) or 0 for p in (small.pid, big.pid, bigger.pid)}
                    assert sum(held.values()) > 2**30  # over together, each alone under
                    assert [budget.over(p) for p in (small.pid, big.pid, bigger.pid)] == [
                        False,
                        False,
                        True,
                    ]
            finally:
                bigger.kill()
                bigger.wait()
        assert MemoryBudget(2**28).over(big.pid)  # alone over a 256 MiB budget
    finally:
        for proc in (small, big):
            proc.kill()
            proc.wait()
    assert "together held over 1.0 GiB" in budget.message()


def test_jobs_run_files_at_once_and_keep_their_order(tmp_path: Path) -> None:
    tree = read_tree(_tree(tmp_path))
    files = select_files(tree, [])
    runs = run_tree(tree, files, ["stock"], tmp_path / "out", timeout=30, keyword="pass", jobs=2)
    assert [(r.file, r.mode) for r in runs] == [(f.name, "stock") for f in files]
    assert [r.file for r in runs] == ["tpu_broken_test.py", "tpu_synthetic_test.py"]
    assert runs[0].not_run is not None
    assert [(r.nodeid.rsplit("::", 1)[-1], r.status) for r in runs[1].results] == [
        ("test_pass", "pass")
    ]


def test_regressions_are_the_stock_passes_the_simulator_does_not_pass() -> None:
    def run(mode: Mode, *results: tuple[str, Status]) -> FileRun:
        return FileRun(
            "tpu_x_test.py",
            mode,
            [
                TestResult(f"tpu_x_test.py::T::{n}", s, "" if s == "pass" else "why")
                for n, s in results
            ],
        )

    runs = [
        run("sim", ("a", "pass"), ("b", "fail"), ("c", "error"), ("d", "skip")),
        run("stock", ("a", "pass"), ("b", "pass"), ("c", "error"), ("d", "pass")),
    ]
    assert report.regressions(runs) == [
        ("tpu_x_test.py::T::b", "fail", "why"),
        ("tpu_x_test.py::T::d", "skip", "why"),
    ]
    assert report.causes(runs) == [(1, "fail", "why"), (1, "error", "why")]


def test_a_cause_blanks_numbers_names_and_places() -> None:
    assert report.cause("ValueError: 'foo' has shape (8, 128) at kernel.py:12, got 3.5e-05") == (
        "ValueError: _ has shape (_, _) at _, got _"
    )


HANGS = """
import time
import unittest


class HangTest(unittest.TestCase):

  def test_a(self):
    time.sleep(600)

  def test_b(self):
    time.sleep(600)

  def test_c(self):
    time.sleep(600)

  def test_d(self):
    pass
"""


def test_the_runner_gives_up_on_a_file_after_hangs_in_a_row(tmp_path: Path) -> None:
    tree, files = _one_file(tmp_path, "tpu_hangs_test", HANGS)
    (run,) = run_tree(tree, files, ["stock"], tmp_path / "out", timeout=3, give_up=2)
    assert [(r.nodeid.rsplit("::", 1)[-1], r.status) for r in run.results] == [
        ("test_a", "hang"),
        ("test_b", "hang"),
    ]
    assert (run.unrun, run.gave_up) == (2, "the runner gave up on the file after 2 hangs in a row")
    assert report._cell(run) == "0/0/0/2/0 (+2 not run: gave up after hangs)"
    # A simulator run goes on: its deadlocks raise, so a hang there is a slow test.
    (run,) = run_tree(tree, files, ["sim"], tmp_path / "sim", timeout=3, give_up=2)
    assert [(r.nodeid.rsplit("::", 1)[-1], r.status) for r in run.results] == [
        ("test_a", "hang"),
        ("test_b", "hang"),
        ("test_c", "hang"),
        ("test_d", "pass"),
    ]
    assert (run.unrun, run.gave_up) == (0, None)


SLOW = """
import time
import unittest


class SlowTest(unittest.TestCase):

  def test_slow(self):
    time.sleep(4)

  def test_quick(self):
    pass
"""


def _outcomes(run: FileRun) -> dict[str, tuple[Status, str]]:
    return {r.nodeid.rsplit("::", 1)[-1]: (r.status, r.message) for r in run.results}


def test_a_test_measured_to_be_slow_gets_a_watchdog_of_its_own(tmp_path: Path) -> None:
    """The watchdog is for hangs: a test known to take longer than ``timeout`` gets twice its
    measured time, in pytest-timeout and in the runner's stall check; the others keep
    ``timeout``, and a hang past its own watchdog names that watchdog."""
    tree, files = _one_file(tmp_path, "tpu_slow_test", SLOW)
    node = "tpu_slow_test.py::SlowTest::test_slow"
    (plain,) = run_tree(tree, files, ["stock"], tmp_path / "plain", timeout=2, slow={})
    assert _outcomes(plain) == {
        "test_quick": ("pass", ""),
        "test_slow": ("hang", "no result within 2 s (pytest-timeout)"),
    }
    (known,) = run_tree(tree, files, ["stock"], tmp_path / "known", timeout=2, slow={node: 4})
    assert _outcomes(known) == {"test_quick": ("pass", ""), "test_slow": ("pass", "")}
    (short,) = run_tree(tree, files, ["stock"], tmp_path / "short", timeout=2, slow={node: 1.5})
    assert _outcomes(short)["test_slow"] == ("hang", "no result within 3 s (pytest-timeout)")


def test_with_several_jobs_the_files_that_took_longest_last_time_start_first(
    tmp_path: Path,
) -> None:
    tree = read_tree(_tree(tmp_path))
    files = select_files(tree, [])
    out = tmp_path / "out"
    runs = run_tree(tree, files, ["stock"], out, timeout=30, keyword="pass", jobs=2)
    table = out / "table.json"
    table.write_text(report.to_json(runs, tree, "0.0"))
    last = read_last_run(table).seconds
    assert last == {(r.file, "stock"): pytest.approx(r.elapsed_s, abs=0.01) for r in runs}
    a, b = (Path(f"tpu_{n}_test.py") for n in "ab")
    pairs: list[tuple[Path, Mode]] = [(a, "sim"), (a, "stock"), (b, "sim"), (b, "stock")]
    timed = {("tpu_a_test.py", "sim"): 5.0, ("tpu_b_test.py", "sim"): 50.0}
    timed[("tpu_a_test.py", "stock")] = 7.0
    whole = [(pair, WHOLE) for pair in pairs]
    assert [u[0] for u in start_order(whole, timed)] == [
        (b, "stock"), (b, "sim"), (a, "stock"), (a, "sim")
    ]  # fmt: skip
    assert read_last_run(tmp_path / "missing.json").seconds == {}


def test_a_first_run_orders_the_files_jax_s_tree_is_known_to_take_longest_first() -> None:
    """Without timings of its own, the typical ones order the files: a file not in the table
    first (it may be long), then the longest; each mode gets the simulator's figure."""
    from coremesh.testing.upstream.typical import SIM_SECONDS, typical_seconds

    paged, ops, new = (
        Path(n)
        for n in ("tpu_paged_attention_kernel_test.py", "tpu_ops_test.py", "tpu_new_test.py")
    )
    typical = typical_seconds([ops, paged, new], ["sim", "stock"])
    assert typical[(paged.name, "stock")] == typical[(paged.name, "sim")] == SIM_SECONDS[paged.name]
    assert (new.name, "sim") not in typical
    pairs: list[tuple[Path, Mode]] = [(ops, "sim"), (paged, "sim"), (new, "sim")]
    assert SIM_SECONDS[paged.name] > SIM_SECONDS[ops.name]
    whole = [(pair, WHOLE) for pair in pairs]
    assert [u[0] for u in start_order(whole, typical)] == [
        (new, "sim"),
        (paged, "sim"),
        (ops, "sim"),
    ]


def test_the_pass_rate_leaves_out_skips_and_tests_that_read_a_tpu_compile(tmp_path: Path) -> None:
    def result(test: str, status: Status) -> TestResult:
        return TestResult(f"pallas/tpu_pallas_test.py::{test}", status, "why")

    run = FileRun(
        "tpu_pallas_test.py",
        "sim",
        [
            result("PallasCallTest::test_a", "pass"),
            result("PallasCallTest::test_b", "pass"),
            result("PallasCallTest::test_c", "fail"),
            result("PallasCallTest::test_d", "skip"),
            result("PallasHloNamesTest::test_parameter_names", "fail"),
            result("PallasCallTest::test_cost_analysis_vmap", "error"),
            result("PallasHloNamesTest::test_parameter_names_shared", "pass"),
        ],
    )
    # 3 of a, b, c and the names test that passed; the failed names and cost tests left out
    assert report.counted(run) == (3, 4, 2)
    tree = read_tree(_tree(tmp_path))
    table = report.markdown([run], tree, "0.0")
    (row,) = [ln for ln in table.splitlines() if ln.startswith("| tpu_pallas_test |")]
    assert row.endswith("| 2 | 75.0% |")
    assert "files under 90%: tpu_pallas_test (75.0%)" in table
    assert "test_parameter_names`: fail: why (not counted: it compares the HLO text" in table
    assert "test_c`: fail: why\n" in table + "\n"


def test_the_tables_are_written_as_each_file_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-tree run stopped part way keeps the tables of the files it finished."""
    from coremesh.testing.upstream import command

    tree = _tree(tmp_path)
    real = run_tree

    def stopped_after_one(*args: Any, **kw: Any) -> list[FileRun]:
        files = args[1]
        real(args[0], files[1:], *args[2:], **kw)  # the synthetic file: its progress is heard
        raise KeyboardInterrupt  # stopped before the rest

    monkeypatch.setattr(command, "run_tree", stopped_after_one)
    out = tmp_path / "out"
    argv = ["upstream", "--jax-tests", str(tree), "--mode", "stock", "--timeout", "30"]
    with pytest.raises(KeyboardInterrupt):
        cli.main([*argv, "-k", "pass", "--out", str(out), "-q"])
    (doc,) = [json.loads(p.read_text()) for p in out.glob("upstream-jax-*.json")]
    assert [(f["file"], f["counts"]["pass"]) for f in doc["files"]] == [
        ("tpu_synthetic_test.py", 1)
    ]
    (table,) = [p.read_text() for p in out.glob("upstream-jax-*.md")]
    assert "| tpu_synthetic_test | 1 | 1/0/0/0/0 |" in table


# A long file split across processes ------------------------------------------------------


def test_tests_are_dealt_into_hands_of_about_equal_seconds() -> None:
    tests = [("t1", 9.0), ("t2", 1.0), ("t3", 5.0), ("t4", 4.0), ("t5", 1.0)]
    # longest first to the lightest hand: t1 -> A (9), t3 -> B (5), t4 -> B (9), then
    # t2 -> A (10) and t5 -> B (10), each hand in the file's order
    assert deal(tests, 2) == [["t1", "t2"], ["t3", "t4", "t5"]]
    assert deal(tests, 1) == [["t1", "t2", "t3", "t4", "t5"]]


def test_only_a_file_longer_than_its_share_is_split_and_the_last_part_takes_the_rest() -> None:
    timed = {
        ("long", "sim"): [(f"long::t{k}", 10.0) for k in range(6)],
        ("short", "sim"): [("short::t0", 5.0)],
    }
    seconds = {("long", "sim"): 60.0, ("short", "sim"): 5.0, ("mid", "sim"): 15.0}
    keys = list(seconds)
    # 80 s over 4 jobs is a share of 20 s: the long file is 3 shares, the others whole
    parts = plan(keys, seconds, timed, jobs=4)
    assert parts[("short", "sim")] == [Part(0, 1, seconds=5.0)]
    assert parts[("mid", "sim")] == [Part(0, 1, seconds=15.0)]
    first, second, last = parts[("long", "sim")]
    assert first.only == frozenset({"long::t0", "long::t3"}) and first.seconds == 20.0
    assert second.only == frozenset({"long::t1", "long::t4"})
    assert last.only is None and last.others == first.only | second.only
    assert [p.suffix for p in parts[("long", "sim")]] == [".part1of3", ".part2of3", ".part3of3"]
    # one job, or no timed tests: nothing is split
    assert all(len(v) == 1 for v in plan(keys, seconds, timed, jobs=1).values())
    assert all(len(v) == 1 for v in plan(keys, seconds, {}, jobs=4).values())


SPLIT = """
import unittest


class SplitTest(unittest.TestCase):

  def test_a(self):
    pass

  def test_b(self):
    pass

  def test_c(self):
    self.assertEqual(1, 2)

  def test_d(self):
    pass

  def test_new(self):
    pass
"""


def test_a_split_file_runs_each_test_once_and_reports_one_row(tmp_path: Path) -> None:
    """The last run timed four of the tests; a fifth is new. Split in two, every test runs
    once, the new one in the last part, and the file is one run of two processes."""
    tree, files = _one_file(tmp_path, "tpu_split_test", SPLIT)
    (split,) = [f for f in files if f.name == "tpu_split_test.py"]
    name = split.name
    nodeids = [f"{name}::SplitTest::test_{n}" for n in "abcd"]
    # the node ids as the shims write them: take them from a whole run
    (whole,) = run_tree(tree, [split], ["stock"], tmp_path / "whole", timeout=60)
    ids = {r.nodeid.rsplit("::", 1)[-1]: r.nodeid for r in whole.results}
    assert sorted(ids) == ["test_a", "test_b", "test_c", "test_d", "test_new"]
    timed = {(name, "stock"): [(ids[n.rsplit("::", 1)[-1]], 1.0) for n in nodeids]}
    seconds = {(name, "stock"): 100.0}
    seen: list[FileRun] = []
    runs = run_tree(
        tree, [split], ["stock"], tmp_path / "out", timeout=60, jobs=2,
        previous_seconds=seconds, previous_tests=timed, progress=seen.append,
    )  # fmt: skip
    (run,) = runs
    assert seen == runs
    assert run.processes == 2
    outcomes = {r.nodeid.rsplit("::", 1)[-1]: r.status for r in run.results}
    assert outcomes == {"test_a": "pass", "test_b": "pass", "test_c": "fail", "test_d": "pass",
                        "test_new": "pass"}  # fmt: skip
    assert len(run.results) == 5
    assert [r.nodeid for r in run.results][:4] == [
        ids[n] for n in ("test_a", "test_b", "test_c", "test_d")
    ]
    logs = sorted(p.name for p in (tmp_path / "out" / "logs" / "stock").iterdir())
    assert logs == ["tpu_split_test.part1of2.log", "tpu_split_test.part2of2.log"]
    # the next run reads each test's seconds back from the table
    table = tmp_path / "out" / "table.json"
    table.write_text(report.to_json(runs, tree, "0.0"))
    back = read_last_run(table).tests[(name, "stock")]
    assert sorted(n for n, _ in back) == sorted(ids.values())
    assert read_last_run(tmp_path / "missing.json").tests == {}


# The heartbeat of a run in progress ----------------------------------------------------------

STEADY = """
import time
import unittest


class SteadyTest(unittest.TestCase):

  def test_a(self):
    pass

  def test_b(self):
    time.sleep(4)

  def test_c(self):
    pass
"""


def test_the_heartbeat_names_each_running_file_and_how_far_it_has_got() -> None:
    now = [0.0]
    live = Live(28, clock=lambda: now[0])
    live.update("tpu_paged_attention_kernel_test", 0, None)
    live.update("tpu_splash_attention_kernel_test", 15, 83)
    now[0] = 61.0
    assert live.line() == (
        "[1m01s] 0 of 28 files done; running: tpu_paged_attention_kernel_test (collecting), "
        "tpu_splash_attention_kernel_test 15/83"
    )
    live.update("tpu_paged_attention_kernel_test", 212, 872)
    live.update("tpu_splash_attention_kernel_test", 16, None)  # a new child: the total is kept
    for _ in range(3):
        live.file_done()
    now[0] = 725.0
    assert live.line() == (
        "[12m05s] 3 of 28 files done; running: tpu_paged_attention_kernel_test 212/872, "
        "tpu_splash_attention_kernel_test 16/83"
    )
    live.ended("tpu_paged_attention_kernel_test")
    live.ended("tpu_splash_attention_kernel_test")
    assert live.line() == "[12m05s] 3 of 28 files done"


def test_the_heartbeat_prints_while_its_block_runs_and_stops_with_it() -> None:
    live = Live(2)
    live.update("tpu_ops_test", 5, 9)
    stream = io.StringIO()
    with heartbeat(live, stream, every_s=0.01):
        for _ in range(3000):  # a hang guard only: the first line comes after 0.01 s
            if stream.getvalue():
                break
            time.sleep(0.01)
    printed = stream.getvalue()
    assert printed.splitlines()[0].endswith("] 0 of 2 files done; running: tpu_ops_test 5/9")
    time.sleep(0.05)
    assert stream.getvalue() == printed  # the thread ended with the block


def test_a_running_file_reports_the_tests_its_child_has_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While ``test_b`` runs (4 s), the runner reads the child's events: 1 of its 3 tests done;
    when the file ends it is no longer running and counts as done."""
    from coremesh.testing.upstream import run as run_module

    heard: list[tuple[str, int, int | None]] = []

    class Recording(Live):
        def update(self, unit: str, finished: int, total: int | None) -> None:
            heard.append((unit, finished, total))
            super().update(unit, finished, total)

    monkeypatch.setattr(run_module, "LIVE_READ_S", 0.0)
    tree, files = _one_file(tmp_path, "tpu_steady_test", STEADY)
    live = Recording(1)
    (run,) = run_tree(tree, files, ["stock"], tmp_path / "out", timeout=60, slow={}, live=live)
    assert [r.status for r in run.results] == ["pass", "pass", "pass"]
    assert heard[0] == ("tpu_steady_test", 0, None)
    assert ("tpu_steady_test", 1, 3) in heard
    assert live.line().endswith("] 1 of 1 files done")
