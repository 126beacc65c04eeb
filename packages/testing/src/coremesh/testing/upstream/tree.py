"""JAX test trees and which one each jax line runs.

A tree is a folder holding JAX's ``tests/pallas/tpu_*.py`` and the ``jax/_src`` test helpers they
import, cut from one jax commit (its ``COMMIT`` file: a release tag such as ``jax-v0.10.2``, or a
commit id). A corpus is a folder of trees (``../shared/upstream`` beside the repository, or
``COREMESH_UPSTREAM_TESTS``). The tests are written against the jax of their commit, so each jax
line runs the tree cut at its own release, or else the newest one cut before it (or just after
its line began: ``jax-post-0.11.0`` is nearest for 0.11.x and 0.12.x).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from coremesh.core import jax_versions
from coremesh.core.errors import CoremeshError

#: Overrides where the corpus of JAX test trees is.
CORPUS_ENV = "COREMESH_UPSTREAM_TESTS"
#: Where the test files sit inside a tree.
TESTS_DIR = Path("tests", "pallas")

_TAG = re.compile(r"jax-v(\d+(?:\.\d+)*)$")
_NAME = re.compile(r"jax-(post-)?(\d+(?:\.\d+)*)$")


@dataclasses.dataclass(frozen=True)
class TestTree:
    """One JAX test tree: its root, the commit it was cut from and the release it follows."""

    __test__ = False  # not a pytest test class

    root: Path
    commit: str
    release: str
    #: True when the tree is a commit after ``release`` rather than the release itself.
    post: bool

    @property
    def tests(self) -> Path:
        return self.root / TESTS_DIR

    @property
    def label(self) -> str:
        return f"{'after ' if self.post else ''}jax {self.release} ({self.commit[:12]})"

    def order(self) -> tuple[jax_versions.Version, int]:
        return (jax_versions.parse(self.release), int(self.post))


def is_tree(path: Path) -> bool:
    return (path / TESTS_DIR).is_dir()


def read_tree(root: Path) -> TestTree:
    """The tree at ``root``: its release from ``COMMIT`` (a tag) or from the folder's name."""
    root = Path(root)
    if not is_tree(root):
        raise CoremeshError(
            f"no JAX test tree at {root}",
            rule=f"a tree holds JAX's test files under {TESTS_DIR}/",
            fix="pass a folder such as ../shared/upstream/jax-0.10.2, or the folder of trees",
        )
    commit_file = root / "COMMIT"
    commit = commit_file.read_text().strip() if commit_file.is_file() else ""
    tag = _TAG.match(commit)
    name = _NAME.match(root.name)
    if tag is not None:
        return TestTree(root, commit, tag.group(1), post=False)
    if name is not None:
        return TestTree(root, commit or "unknown", name.group(2), post=name.group(1) is not None)
    raise CoremeshError(
        f"cannot tell which jax release the test tree {root} follows",
        rule="a tree's COMMIT is a release tag (jax-v0.10.2), or its folder is named jax-<release> "
        "or jax-post-<release>",
        fix=f"rename the folder (e.g. jax-post-0.11.0) or write the tag into {commit_file}",
    )


def find_trees(corpus: Path) -> list[TestTree]:
    """The trees in ``corpus`` (or ``corpus`` itself, when it is one), oldest first."""
    corpus = Path(corpus)
    if is_tree(corpus):
        return [read_tree(corpus)]
    if not corpus.is_dir():
        return []
    trees = [read_tree(p) for p in sorted(corpus.iterdir()) if p.is_dir() and is_tree(p)]
    return sorted(trees, key=TestTree.order)


def nearest_tree(jax_version: str, trees: list[TestTree]) -> TestTree:
    """The tree for ``jax_version``: its own release, else the newest tree cut before it or
    after a release of its line; the oldest tree for a jax older than every tree."""
    if not trees:
        raise CoremeshError(
            "no JAX test trees to choose from",
            fix=f"pass a tree or a folder of trees (or set {CORPUS_ENV})",
        )
    ordered = sorted(trees, key=TestTree.order)
    want = jax_versions.parse(jax_version)
    exact = [t for t in ordered if not t.post and jax_versions.parse(t.release) == want]
    if exact:
        return exact[-1]
    before = [t for t in ordered if t.order() <= (want, 1)]
    return before[-1] if before else ordered[0]


def default_corpus(repo_root: Path) -> Path:
    """``$COREMESH_UPSTREAM_TESTS``, else ``../shared/upstream`` from the repository's root."""
    override = os.environ.get(CORPUS_ENV)
    if override:
        return Path(override)
    return (Path(repo_root) / ".." / "shared" / "upstream").resolve()


def resolve(path: Path, jax_version: str) -> TestTree:
    """A tree, or the tree of a corpus nearest ``jax_version``."""
    trees = find_trees(path)
    if not trees:
        raise CoremeshError(
            f"no JAX test tree at {path}",
            rule=f"a tree holds JAX's test files under {TESTS_DIR}/; a corpus holds trees",
            fix="pass a folder such as ../shared/upstream/jax-0.10.2, or the folder of trees",
        )
    return nearest_tree(jax_version, trees)
