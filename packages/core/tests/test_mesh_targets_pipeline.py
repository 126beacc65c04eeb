from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from coremesh.core import (
    Block,
    ChipError,
    CoreKind,
    CoreMesh,
    DeviceCoreView,
    LayoutError,
    Manual,
    MeshError,
    Parallel,
    PipelineSpec,
    Semantics,
    Target,
    check_axis,
    current_target,
    get_chip,
    num_cores,
    using_target,
)
from coremesh.core.targets import HardwareTarget


class SCMesh:
    kind = CoreKind.SPARSE_VECTOR
    chip = get_chip("v5p")
    axes = MappingProxyType({"core": 4, "subcore": 16})

    def pallas_mesh(self) -> Any:
        return None


def test_mesh_protocol_and_axes() -> None:
    m = SCMesh()
    assert isinstance(m, CoreMesh)
    assert num_cores(m) == 64
    assert check_axis(m, "subcore") == 16
    with pytest.raises(MeshError, match=r"(?s)no axis 'lane'.*'core', 'subcore'") as e:
        check_axis(m, "lane")
    assert e.value.chip == "v5p"


def test_device_core_view_orders_cores_first() -> None:
    v = DeviceCoreView("device", 4, "core", 2)
    assert v.size == 8
    assert [v.global_index(d, c) for d in range(4) for c in range(2)] == list(range(8))
    assert v.locate(5) == (2, 1)
    with pytest.raises(MeshError):
        v.global_index(0, 2)
    with pytest.raises(MeshError):
        v.locate(8)
    with pytest.raises(MeshError):
        DeviceCoreView("device", 0, "core", 2)


def test_using_target_nests() -> None:
    a = HardwareTarget(get_chip("v5p"), 4, 2)
    b = HardwareTarget(get_chip("v6e"), 1, 1)
    assert isinstance(a, Target)
    with using_target(a):
        assert current_target() is a
        with b.activate():
            assert current_target().chip.name == "v6e"
        assert current_target() is a


def test_no_target_without_tpu_is_a_clear_error() -> None:
    # This machine has no TPU: the error says how to get a target.
    if HardwareTarget.detect() is not None:
        pytest.skip("a TPU is attached; this checks the no-TPU message")
    with pytest.raises(ChipError, match="simulate"):
        current_target()


def test_pipeline_semantics_follow_the_split() -> None:
    body = lambda *refs: None  # noqa: E731
    blk = Block((8, 128), lambda i, j: (i, j))
    p = PipelineSpec(body, (16, 4), [blk], [blk], Parallel("core", 0))
    assert p.semantics == (Semantics.PARALLEL, Semantics.ARBITRARY)
    m = PipelineSpec(body, (16, 4), [blk], [blk], Manual("core", 1))
    assert m.semantics == (Semantics.ARBITRARY, Semantics.ARBITRARY)
    with pytest.raises(LayoutError, match="grid axis 2"):
        PipelineSpec(body, (16, 4), [blk], [blk], Parallel("core", 2))
    with pytest.raises(LayoutError, match="empty"):
        PipelineSpec(body, (0, 4), [blk], [blk])
