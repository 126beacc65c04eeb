from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from coremesh.core import (
    ChipError,
    CoreKind,
    CoreMesh,
    Target,
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
