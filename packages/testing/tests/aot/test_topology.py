"""Deviceless topologies: the names coremesh picks, and what libtpu builds from them."""

from __future__ import annotations

from typing import Any

import jax
import pytest
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.core.chips import CHIPS
from coremesh.core.errors import ChipError, MeshError
from coremesh.core.targets import Target, current_target
from coremesh.testing.aot.topology import CompileTarget, topology_for


@pytest.mark.parametrize(
    ("chip", "kwargs", "name", "config", "cores"),
    [
        ("v5e", {}, "v5e:2x2", None, 1),
        ("v6e", {"devices": 8}, "v6e:4x2", None, 1),
        ("v5p", {}, "v5p:2x2x1", None, 2),
        ("v5p", {"mode": "split"}, "v5p:2x1x1", "legacy", 1),
        ("v4", {}, "v4:2x2x1", "megacore", 2),
        ("v4", {"cores_per_device": 1}, "v4:2x1x1", None, 1),
        ("TPU7x", {}, "TPU7x:2x1x1", None, 1),  # 2 devices per chip
        ("TPU7x", {"devices": 16}, "TPU7x:2x2x2", None, 1),
        ("v5e", {"mode": "megacore"}, "v5e:2x2", None, 1),  # one-mode chips keep their mode
        ("v5p", {"topology": "4x4x4"}, "v5p:4x4x4", None, 2),
    ],
)
def test_topology_names(
    chip: str, kwargs: dict[str, Any], name: str, config: str | None, cores: int
) -> None:
    spec = topology_for(chip, **kwargs)
    assert (spec.name, spec.chip_config_name, spec.cores_per_device) == (name, config, cores)


@pytest.mark.parametrize(
    ("chip", "mode", "label"),
    [
        ("v4", None, "megacore"),
        ("v5p", "split", "split"),
        ("v5e", None, "single"),
        ("TPU7x", None, "single"),
    ],
)
def test_mode_labels(chip: str, mode: str | None, label: str) -> None:
    assert topology_for(chip, mode=mode).mode == label


def test_single_chip_topology_has_host_bounds() -> None:
    spec = topology_for("v5p", devices=1)
    assert spec.name == "v5p:1x1x1"
    assert spec.kwargs() == {"chips_per_host_bounds": [1, 1, 1]}


@pytest.mark.parametrize(
    ("chip", "kwargs"),
    [
        ("TPU7x", {"devices": 3}),  # 2 devices per chip
        ("v5p", {"mode": "quad"}),
        ("v5p", {"topology": "2x2"}),  # v5p grids are 3-d
        ("v5p", {"mode": "split", "cores_per_device": 1}),
    ],
)
def test_bad_topology_requests_are_mesh_errors(chip: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(MeshError) as e:
        topology_for(chip, **kwargs)
    assert e.value.chip == chip and e.value.fix


def test_megacore_on_a_one_core_chip_is_refused_when_asked_by_count() -> None:
    with pytest.raises(ChipError, match="v6e has no mode with 2"):
        topology_for("v6e", cores_per_device=2)


@pytest.mark.parametrize(
    ("chip", "mode"),
    [
        ("v4", None),
        ("v4", "split"),
        ("v5e", None),
        ("v5p", None),
        ("v5p", "split"),
        ("v6e", None),
        ("TPU7x", None),
    ],
)
def test_libtpu_devices_match_the_spec(chip: str, mode: str | None) -> None:
    target = CompileTarget.for_chip(chip, mode=mode)
    devices = target.devices
    assert len(devices) == target.num_devices == 4
    assert {d.num_cores for d in devices} == {target.cores_per_device}
    assert {d.device_kind for d in devices} == {CHIPS[chip].device_kind}
    assert target.mesh.shape == {"device": 4}


@pytest.mark.parametrize("chip", list(CHIPS))
def test_activate_makes_pallas_and_coremesh_see_the_chip(chip: str) -> None:
    target = CompileTarget.for_chip(chip)
    assert isinstance(target, Target)
    c = CHIPS[chip]
    with target.activate():
        info = pltpu.get_tpu_info()
        tc_mesh = jax_compat.tensorcore_mesh("core")  # the core count of the chip's devices
        assert current_target() is target
        assert jax.sharding.get_abstract_mesh().shape == {"device": 4}
    assert jax_compat.mesh_cores(tc_mesh) == target.cores_per_device
    assert info.num_cores == target.cores_per_device
    assert info.vmem_capacity_bytes == c.vmem_bytes_per_core
    sc = info.sparse_core
    if c.sparsecore is None:
        assert sc is None
    else:
        assert sc is not None
        assert (sc.num_cores, sc.num_subcores, sc.num_lanes) == (
            c.sparsecore.cores,
            c.sparsecore.subcores,
            c.sparsecore.lanes,
        )
