"""Checks every coremesh distribution runs against itself, whatever its backend."""

from __future__ import annotations

import subprocess
import sys

from coremesh.core import jax_versions


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
