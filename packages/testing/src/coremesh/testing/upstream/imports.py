"""The test tree's own ``jax/_src`` helpers, importable beside the installed jax.

JAX's tests import ``jax._src.pallas.pallas_test_util`` and ``jax._src.hypothesis_test_util``,
which the jax wheel does not ship; the tree carries them. A finder placed last on
``sys.meta_path`` serves a module from the tree only when the installed jax has no module of that
name, so nothing of the installed jax is ever shadowed and nothing is copied anywhere.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


def tree_modules(tree_root: Path) -> dict[str, Path]:
    """``jax._src...`` module name -> file, for every ``.py`` under the tree's ``jax/``."""
    base = Path(tree_root) / "jax"
    out: dict[str, Path] = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(tree_root).with_suffix("").parts
        if parts[-1] == "__init__":
            continue  # the packages themselves are the installed jax's
        out[".".join(parts)] = path
    return out


class TreeFinder(importlib.abc.MetaPathFinder):
    """Finds the tree's modules that no earlier finder (the installed jax) provides."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = dict(modules)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        del path, target  # served by full name, wherever the parent package is
        file = self.modules.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def install(tree_root: Path) -> TreeFinder:
    """Append a :class:`TreeFinder` for ``tree_root`` to ``sys.meta_path`` (after every other
    finder, so the installed jax wins wherever it has the module)."""
    finder = TreeFinder(tree_modules(tree_root))
    sys.meta_path.append(finder)
    return finder


def uninstall(finder: TreeFinder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
