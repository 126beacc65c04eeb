"""The collectives distribution installs and resolves its declared dependencies."""

from __future__ import annotations

from importlib.metadata import requires, version

from coremesh.testing.conformance.package import check_import_refuses_old_jax


def test_declares_core_and_tensorcore_ranges() -> None:
    import coremesh.collectives as cl

    assert cl.__version__ == version("coremesh-collectives") == "0.1.0"
    reqs = " ".join(requires("coremesh-collectives") or [])
    assert "coremesh-core<0.2,>=0.1" in reqs.replace(" ", "") or "coremesh-core>=0.1,<0.2" in reqs
    assert "coremesh-tensorcore" in reqs


def test_import_refuses_a_jax_older_than_supported() -> None:
    """Importing the package under a jax that says it is 0.9.4 stops with the supported range."""
    check_import_refuses_old_jax("coremesh.collectives")
