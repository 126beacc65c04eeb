"""The SparseCore backend against coremesh's SparseCore conformance suites: on the simulator
(v5p, v5p in split mode, v6e on two devices, TPU7x) and compiled with libtpu for every chip."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import coremesh.core as cc
import coremesh.sparsecore as sc
from coremesh.sparsecore.programs import programs
from coremesh.testing.conformance import (
    SparseCoreCompileSuite,
    SparseCoreKernelSuite,
    SparseCoreSplitCompileSuite,
)
from coremesh.testing.plugin import SliceFactory

#: (chip, devices, TensorCores per device or None for the chip's default)
SIMULATED = [("v5p", 1, None), ("v5p", 1, 1), ("v6e", 2, None), ("TPU7x", 1, None)]


def _id(p: tuple[str, int, int | None]) -> str:
    return f"{p[0]}x{p[1]}" + ("-split" if p[2] == 1 else "")


class TestKernels(SparseCoreKernelSuite):
    @pytest.fixture(params=SIMULATED, ids=[_id(p) for p in SIMULATED])
    def target(self, request: pytest.FixtureRequest, slice_target: SliceFactory) -> Iterator[Any]:
        chip, devices, cores = request.param
        with slice_target(chip, devices, cores_per_device=cores, deadline=60.0) as sim:
            yield sim

    @pytest.fixture
    def make_mesh(self) -> Any:
        return sc.mesh

    @pytest.fixture
    def gather(self) -> Any:
        return sc.gather

    @pytest.fixture
    def scatter_add(self) -> Any:
        return sc.scatter_add

    @pytest.fixture
    def segment_sum(self) -> Any:
        return sc.segment_sum

    @pytest.fixture
    def embedding_bag(self) -> Any:
        return sc.embedding_bag

    @pytest.fixture
    def supports_bfloat16_gather(self) -> bool:
        return True

    @pytest.fixture
    def supports_embedding_bag(self) -> bool:
        return True

    @pytest.fixture
    def supports_scalar_mesh(self) -> bool:
        return True


@pytest.mark.aot
class TestCompiles(SparseCoreCompileSuite):
    @pytest.fixture(params=list(cc.CHIPS))
    def chip(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    @pytest.fixture
    def sparsecore_programs(self) -> list[Any]:
        return programs()


@pytest.mark.aot
class TestCompilesSplit(SparseCoreSplitCompileSuite):
    @pytest.fixture
    def chip(self) -> str:
        return "v5p"

    @pytest.fixture
    def sparsecore_programs(self) -> list[Any]:
        return programs()
