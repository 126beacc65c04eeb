"""The Target conformance suite on coremesh's targets: the simulator (the local TPU instead under
``--coremesh-target=hardware``, as ``nox -s tpu_tests`` runs it) and the compile-only target."""

from __future__ import annotations

import pytest

from coremesh.core.targets import Target
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.conformance.targets import TargetFactory, TargetSuite
from coremesh.testing.plugin import SliceFactory

#: (chip, devices): v5p (2 TensorCores and SparseCores per device), v5e (1, no SparseCores).
SIMULATED = [("v5p", 2), ("v5e", 1)]
COMPILED = [("v5p", 4), ("v5e", 4)]


class TestSimulatorOrHardware(TargetSuite):
    @pytest.fixture(params=SIMULATED, ids=[f"{c}x{d}" for c, d in SIMULATED])
    def target_slice(self, request: pytest.FixtureRequest) -> tuple[str, int]:
        chip, devices = request.param
        return str(chip), int(devices)

    @pytest.fixture
    def make_target(self, slice_target: SliceFactory) -> TargetFactory:
        def make(chip: str, devices: int) -> Target:
            return slice_target(chip, devices, deadline=20.0)

        return make

    @pytest.fixture
    def missing_devices(self) -> int:
        return 4096  # more than the host devices jax started with (or the TPUs a VM has)

    @pytest.fixture
    def can_run(self) -> bool:
        return True


class TestCompileOnly(TargetSuite):
    @pytest.fixture(params=COMPILED, ids=[f"{c}x{d}" for c, d in COMPILED])
    def target_slice(self, request: pytest.FixtureRequest) -> tuple[str, int]:
        chip, devices = request.param
        return str(chip), int(devices)

    @pytest.fixture
    def make_target(self) -> TargetFactory:
        def make(chip: str, devices: int) -> Target:
            return CompileTarget.for_chip(chip, devices=devices)

        return make

    @pytest.fixture
    def missing_devices(self) -> int:
        return 3  # no slice of these chips has 3 devices
