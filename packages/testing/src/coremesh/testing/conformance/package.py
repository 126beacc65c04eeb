"""Checks every coremesh distribution runs against itself, whatever its backend."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from collections.abc import Sequence

from coremesh.core import CoreKind, jax_versions

#: What every backend package exports, beside its mesh class, its ops and their references.
BACKEND_NAMES = ("mesh", "kernel", "device_shards", "inside_shard_map", "on_devices")


def check_import_refuses_old_jax(module: str, fake_version: str = "0.9.4") -> None:
    """Importing ``module`` in a fresh process whose jax says it is ``fake_version`` (older than
    supported) must stop with coremesh's refusal, naming the version and the supported range."""
    code = f"import jax; jax.__version__ = {fake_version!r}; import {module}"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode != 0, f"importing {module} under jax {fake_version} succeeded"
    refusal = (
        f"CoremeshError: jax {fake_version} is installed, and coremesh needs at least "
        f"jax {jax_versions.MINIMUM}"
    )
    assert refusal in run.stderr, run.stderr
    assert jax_versions.supported_range() in run.stderr, run.stderr


def check_backend_face(module: str, *, mesh_class: str, ops: Sequence[str]) -> None:
    """Backend package ``module`` shows the face every backend shares, so code written against one
    reads the same against another: ``mesh(kind=<its default kind>, *, axis_name="core", ...,
    target=None)``, ``kernel``, its mesh class, each op beside its XLA ``<op>_reference``, and
    the sharding helpers."""
    mod = importlib.import_module(module)
    exported = set(mod.__all__)
    want = {*BACKEND_NAMES, mesh_class, *ops, *(f"{op}_reference" for op in ops)}
    assert want <= exported, f"{module} does not export {sorted(want - exported)}"
    assert all(callable(getattr(mod, name)) for name in want), module
    kind, *rest = inspect.signature(mod.mesh).parameters.values()
    assert kind.name == "kind" and kind.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, kind
    assert isinstance(kind.default, CoreKind), f"{module}.mesh has no default kind"
    keywords = {p.name: p.default for p in rest if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert len(keywords) == len(rest), f"{module}.mesh takes only the kind positionally"
    assert keywords.get("axis_name") == "core", f"{module}.mesh has no axis_name='core'"
    assert "target" in keywords and keywords["target"] is None, f"{module}.mesh has no target="
