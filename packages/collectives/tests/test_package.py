"""The collectives distribution installs and resolves its declared dependencies."""

from __future__ import annotations

from importlib.metadata import requires, version


def test_declares_core_and_tensorcore_ranges() -> None:
    import coremesh.collectives as cl

    assert cl.__version__ == version("coremesh-collectives") == "0.1.0"
    reqs = " ".join(requires("coremesh-collectives") or [])
    assert "coremesh-core<0.2,>=0.1" in reqs.replace(" ", "") or "coremesh-core>=0.1,<0.2" in reqs
    assert "coremesh-tensorcore" in reqs
