"""The TensorCore backend against coremesh's conformance suites: on the simulator (v5p with 2
cores per device, v6e with 1) and compiled with libtpu for every TPU generation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.testing.conformance import (
    TensorCoreCompileSuite,
    TensorCoreKernelSuite,
    TensorCorePipelineSuite,
)
from coremesh.testing.plugin import SliceFactory

SIMULATED = [("v5p", 2), ("v6e", 2)]  # (chip, devices)


class _TensorCore:
    @pytest.fixture(params=SIMULATED, ids=[f"{c}x{d}" for c, d in SIMULATED])
    def target(self, request: pytest.FixtureRequest, slice_target: SliceFactory) -> Iterator[Any]:
        chip, devices = request.param
        with slice_target(chip, devices, deadline=20.0) as sim:
            yield sim

    @pytest.fixture
    def make_mesh(self) -> Any:
        return tc.mesh

    @pytest.fixture
    def make_pipeline(self) -> Any:
        return tc.pipeline

    @pytest.fixture
    def supports_inter_core_dma(self) -> bool:
        return True

    @pytest.fixture
    def supports_manual_split(self) -> bool:
        return True


class TestKernels(_TensorCore, TensorCoreKernelSuite):
    pass


class TestPipelines(_TensorCore, TensorCorePipelineSuite):
    pass


class TestCompiles(TensorCoreCompileSuite):
    @pytest.fixture(params=list(cc.CHIPS))
    def chip(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    @pytest.fixture
    def make_mesh(self) -> Any:
        return tc.mesh

    @pytest.fixture
    def make_pipeline(self) -> Any:
        return tc.pipeline
