"""Every TensorCore op compiles with libtpu for every TPU generation (v4 in megacore mode)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

import coremesh.core as cc
from coremesh.tensorcore.programs import programs
from coremesh.testing.aot import compile_matrix


@pytest.mark.aot
@pytest.mark.parametrize("chip", list(cc.CHIPS))
def test_ops_compile(chip: str) -> None:
    progs = programs()
    results = compile_matrix(progs, [chip])
    failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert len(results) == len(progs) == 8


def test_programs_are_registered_for_the_compile_matrix() -> None:
    (ep,) = [e for e in entry_points(group="coremesh.programs") if e.name == "tensorcore"]
    assert ep.load() is programs
