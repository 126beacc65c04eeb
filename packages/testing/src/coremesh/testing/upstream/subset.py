"""A fixed subset of a JAX test tree that must pass: what CI runs on every jax line.

The whole tree takes hours on two CPUs; a subset chosen once, from tests that pass on every jax
line the tree serves, takes minutes and catches a simulator change that breaks what worked. A
subset is a text file of pytest node ids (``tpu_pallas_test.py::Class::test_name``), one per
line, ``#`` comments allowed; a folder of them holds one per tree, named after the tree's folder
(``jax-0.10.2.txt``, ``jax-post-0.11.0.txt``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from coremesh.core.errors import CoremeshError
from coremesh.testing.upstream.events import TestResult
from coremesh.testing.upstream.tree import TestTree


@dataclasses.dataclass(frozen=True)
class Subset:
    """Node ids grouped by test file, in the file's order."""

    path: Path
    by_file: dict[str, tuple[str, ...]]

    @property
    def nodeids(self) -> tuple[str, ...]:
        return tuple(n for ids in self.by_file.values() for n in ids)

    def missed(self, results: Iterable[TestResult]) -> list[tuple[str, str]]:
        """(node id, what happened) for every listed test that did not pass."""
        seen = {r.nodeid: r for r in results}
        out = []
        for nodeid in self.nodeids:
            got = seen.get(nodeid)
            if got is None:
                out.append((nodeid, "not run (not collected: renamed or removed?)"))
            elif got.status != "pass":
                out.append((nodeid, f"{got.status}: {got.message}"))
        return out


def subset_file(path: Path, tree: TestTree) -> Path:
    """``path`` itself, or the tree's file in the folder ``path``."""
    path = Path(path)
    if path.is_dir():
        path = path / f"{tree.root.name}.txt"
    if not path.is_file():
        raise CoremeshError(
            f"no test subset at {path}",
            rule="a subset is a file of node ids, or a folder holding <tree folder name>.txt",
            fix=f"write {path.name} (one node id per line), or pass the file itself",
        )
    return path


def read_subset(path: Path) -> Subset:
    """The node ids of a subset file, grouped by test file."""
    by_file: dict[str, list[str]] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        file, sep, rest = line.partition("::")
        if not sep or not file.endswith(".py") or not rest:
            raise CoremeshError(
                f"{path}:{number}: {line!r} is not a node id",
                rule="each line is a pytest node id: FILE.py::Class::test_name",
                fix="copy node ids from the runner's JSON (results[].nodeid)",
            )
        by_file.setdefault(file, []).append(line)
    if not by_file:
        raise CoremeshError(f"{path} lists no tests", fix="add node ids, one per line")
    return Subset(Path(path), {f: tuple(ids) for f, ids in by_file.items()})
