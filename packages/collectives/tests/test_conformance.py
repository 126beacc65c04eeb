"""coremesh.collectives against coremesh's collectives conformance suite: every collective over
every axis and algorithm, equal to jax.lax, on v5p slices (2 cores per device) of 2 and 4 devices
from the plugin's ``slice_target`` (the simulator, with DMAs completed last-in first-out when
waited for and the race detector on; the TPU in ``tpu_tests``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from coremesh.collectives.reference import collective as by_name
from coremesh.testing.conformance import CollectivesSuite
from coremesh.testing.plugin import SliceFactory

pytestmark = pytest.mark.sim

SIMULATED = [("v5p", 2), ("v5p", 4)]  # (chip, devices)


class TestCollectives(CollectivesSuite):
    @pytest.fixture(params=SIMULATED, ids=[f"{c}x{d}" for c, d in SIMULATED])
    def target(self, request: pytest.FixtureRequest, slice_target: SliceFactory) -> Iterator[Any]:
        chip, devices = request.param
        options = {"dma_execution_mode": "on_wait", "races": True, "deadline": 60}
        with slice_target(chip, devices, **options) as s:
            yield s

    @pytest.fixture
    def collective(self) -> Callable[..., Any]:
        return by_name

    @pytest.fixture
    def algorithms(self) -> dict[str, Sequence[str]]:
        rings = ("ring", "bidirectional")
        return {"device": rings, "core": rings, "device_core": (*rings, "hierarchical")}

    @pytest.fixture
    def supports_core_axis(self) -> bool:
        return True

    @pytest.fixture
    def supports_device_core_axis(self) -> bool:
        return True
