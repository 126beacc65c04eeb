"""The collectives distribution installs and resolves its declared dependencies."""

from __future__ import annotations

from importlib.metadata import requires, version


def test_declares_core_and_tensorcore_ranges() -> None:
    import coremesh.collectives as cl

    assert cl.__version__ == version("coremesh-collectives") == "0.1.0"
    reqs = " ".join(requires("coremesh-collectives") or [])
    assert "coremesh-core<0.2,>=0.1" in reqs.replace(" ", "") or "coremesh-core>=0.1,<0.2" in reqs
    assert "coremesh-tensorcore" in reqs


def test_import_refuses_a_jax_older_than_supported() -> None:
    """Importing the package under a jax that says it is 0.9.4 stops with the supported range."""
    import subprocess
    import sys

    code = "import jax; jax.__version__ = '0.9.4'; import coremesh.collectives"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode != 0
    assert "CoremeshError: jax 0.9.4 is installed, and coremesh needs at least jax 0.10.2" in (
        run.stderr
    )
    assert "jax 0.10.2 to 0.12.0.1" in run.stderr
