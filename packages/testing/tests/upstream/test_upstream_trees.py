"""Trees for each jax line, the device gates, the tree's imports, and one real upstream file."""

from __future__ import annotations

import fnmatch
import importlib
import re
import sys
from pathlib import Path

import pytest

from coremesh.core import jax_versions
from coremesh.core.errors import CoremeshError
from coremesh.testing.upstream import beyond_cpu, gates, imports
from coremesh.testing.upstream.needs import Needs, most_devices, needs_for
from coremesh.testing.upstream.run import run_tree, select_files
from coremesh.testing.upstream.tree import (
    default_corpus,
    find_trees,
    nearest_tree,
    read_tree,
    resolve,
)

REPO = Path(__file__).resolve().parents[4]


def _make(root: Path, name: str, commit: str) -> Path:
    (root / name / "tests" / "pallas").mkdir(parents=True)
    (root / name / "COMMIT").write_text(commit + "\n")
    return root / name


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    _make(tmp_path, "jax-0.10.2", "jax-v0.10.2")
    _make(tmp_path, "jax-post-0.11.0", "cec06d116c05f0d52adfceee3d3b730fdbcb0ce5")
    (tmp_path / "notes").mkdir()  # not a tree
    return tmp_path


@pytest.mark.parametrize(
    ("jax_version", "tree"),
    [
        ("0.10.2", "jax-0.10.2"),
        ("0.11.0", "jax-post-0.11.0"),
        ("0.11.2", "jax-post-0.11.0"),
        ("0.12.0.1", "jax-post-0.11.0"),
        ("0.10.0", "jax-0.10.2"),  # older than every tree: the oldest
        ("0.10.5", "jax-0.10.2"),
    ],
)
def test_each_jax_line_runs_the_nearest_tree(corpus: Path, jax_version: str, tree: str) -> None:
    assert nearest_tree(jax_version, find_trees(corpus)).root.name == tree


def test_a_tree_reads_its_release_from_commit_or_name(corpus: Path) -> None:
    tagged, post = find_trees(corpus)
    assert (tagged.release, tagged.post, tagged.commit) == ("0.10.2", False, "jax-v0.10.2")
    assert (post.release, post.post, post.commit[:7]) == ("0.11.0", True, "cec06d1")
    assert resolve(corpus / "jax-0.10.2", "0.12.0.1").root.name == "jax-0.10.2"  # a tree: itself


def test_a_folder_that_is_no_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CoremeshError, match="no JAX test tree at"):
        resolve(tmp_path, "0.10.2")
    _make(tmp_path, "mystery", "")
    with pytest.raises(CoremeshError, match="cannot tell which jax release"):
        read_tree(tmp_path / "mystery")


def test_the_default_corpus_is_beside_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COREMESH_UPSTREAM_TESTS", raising=False)
    assert default_corpus(REPO) == (REPO / ".." / "shared" / "upstream").resolve()
    monkeypatch.setenv("COREMESH_UPSTREAM_TESTS", "/elsewhere")
    assert default_corpus(REPO) == Path("/elsewhere")


def test_needs_table() -> None:
    assert needs_for("x/tpu_all_gather_test.py::AllGatherTest::test_all_gather_1d_mesh") == Needs(
        "v5e", 4
    )
    assert needs_for("tpu_pallas_interpret_distributed_test.py::T::test_x") == Needs(
        "v5p", 8, "cpu"
    )
    assert needs_for("tpu_sparsecore_pallas_test.py::PallasSCTest::test_x") == Needs()
    # v5p's megacore would split the parallel dimension the test expects on core 0.
    randomized = (
        "tpu_pallas_interpret_test.py::InterpretTest::test_randomization_of_parallel_dimensions"
    )
    assert needs_for(randomized) == Needs("v5e", 1, "cpu")
    assert needs_for("tpu_pallas_interpret_test.py::InterpretTest::test_x") == Needs(
        "v5p", 1, "cpu"
    )
    # Tests that skip below TPU v6 get a v6e; their neighbours keep the file's slice.
    assert needs_for("tpu_ops_test.py::OpsTest::test_quantize1") == Needs("v6e", 4)
    assert needs_for("tpu_ops_test.py::OpsTest::test_bitcast3") == Needs()
    dma = "tpu_pallas_test.py::PallasCallDMATest::"
    assert needs_for(dma + "test_dma_with_regular_semaphore") == Needs("v6e", 1)
    assert needs_for(dma + "test_dma_with_dma_semaphore") == Needs("v5p", 1)
    assert most_devices("tpu_pallas_async_test.py") == 4
    assert most_devices("tpu_pallas_test.py") == 1


def test_gates_answer_for_the_chip_and_are_restored() -> None:
    from jax._src import test_util as jtu

    before = jtu.device_under_test()
    originals = gates.install(jtu)
    try:
        gates.set_needs(Needs("v6e", 4))
        assert jtu.test_device_matches(["tpu"])
        assert not jtu.test_device_matches(["cpu"])
        assert jtu.get_tpu_version() == 6
        assert jtu.is_device_tpu(6, "e")
        assert not jtu.is_device_tpu(5, "p")
        assert jtu.is_device_tpu_at_least(6)
        assert not jtu.is_device_tpu_at_least(7)
        gates.set_needs(Needs("TPU7x", 4))
        assert jtu.is_device_tpu(7, "x")
        gates.set_needs(Needs("v5p", 1, "cpu"))
        assert jtu.test_device_matches(["cpu"])
        assert not jtu.is_device_tpu()
    finally:
        gates.uninstall(originals, jtu)
        gates.set_needs(Needs())
    assert jtu.device_under_test() == before
    assert jtu.xla_bridge.devices()[0].device_kind != "TPU7x"


def test_the_tree_serves_only_what_jax_lacks(tmp_path: Path) -> None:
    src = tmp_path / "jax" / "_src"
    src.mkdir(parents=True)
    (src / "coremesh_probe_util.py").write_text("WHERE = 'tree'\n")
    (src / "lax_reference.py").write_text("WHERE = 'tree'\n")  # jax ships one: must not win
    finder = imports.install(tmp_path)
    try:
        probe = importlib.import_module("jax._src.coremesh_probe_util")
        assert probe.WHERE == "tree"
        sys.modules.pop("jax._src.lax_reference", None)
        installed = importlib.import_module("jax._src.lax_reference")
        assert not hasattr(installed, "WHERE")
        assert "site-packages" in str(installed.__file__)
    finally:
        imports.uninstall(finder)
        sys.modules.pop("jax._src.coremesh_probe_util", None)
    assert finder not in sys.meta_path


def test_a_real_upstream_file_passes_on_the_simulator(tmp_path: Path) -> None:
    corpus = default_corpus(REPO)
    if not find_trees(corpus):
        pytest.skip(f"no JAX test tree at {corpus}")
    tree = resolve(corpus, jax_versions.installed())
    files = select_files(tree, ["tpu_sparsecore_pallas_distributed_test"])
    (run,) = run_tree(
        tree, files, ["sim"], tmp_path, timeout=120, keyword="test_collective_permute_1d"
    )
    assert run.not_run is None
    assert len(run.results) == 4  # direction x num_devices
    assert run.counts()["pass"] >= 1, [(r.nodeid, r.message) for r in run.results]


def test_each_test_left_out_of_the_pass_rate_is_a_test_of_a_tree() -> None:
    corpus = default_corpus(REPO)
    trees = find_trees(corpus)
    if not trees:
        pytest.skip(f"no JAX test tree at {corpus}")
    keys = []
    for tree in trees:
        for path in sorted(tree.tests.glob("tpu_*_test.py")):
            cls = ""
            for line in path.read_text().splitlines():
                found = re.match(r"class (\w+)", line) or re.match(r"  def (test\w*)\(", line)
                if found and line.startswith("class"):
                    cls = found.group(1)
                elif found:
                    keys.append(f"{path.name}::{cls}::{found.group(1)}")
    for pattern, why in beyond_cpu.TABLE:
        assert fnmatch.filter(keys, pattern), (pattern, why)
    assert (
        beyond_cpu.reason("tests/pallas/tpu_pallas_test.py::PallasCallTest::test_add_one") is None
    )
