"""The TensorCore mesh follows the target's chip; the backend is found through its entry point."""

from __future__ import annotations

from typing import Any

import pytest

import coremesh.core as cc
from coremesh.core import jax_compat
from coremesh.core.targets import HardwareTarget
from coremesh.tensorcore import TensorCoreBackend, TensorCoreMesh, mesh
from coremesh.testing.conformance.package import check_backend_face, check_import_refuses_old_jax


@pytest.mark.parametrize(
    ("chip", "cores"), [("v4", 2), ("v5p", 2), ("v5e", 1), ("v6e", 1), ("TPU7x", 1)]
)
def test_mesh_has_the_chips_cores(chip: str, cores: int) -> None:
    c = cc.get_chip(chip)
    with cc.using_target(HardwareTarget(c, 4, c.default_cores_per_device)):
        m = mesh()
    assert isinstance(m, cc.CoreMesh)
    assert dict(m.axes) == {"core": cores}
    pm = m.pallas_mesh()
    assert isinstance(pm, jax_compat.tensorcore_mesh_class())
    assert jax_compat.mesh_cores(pm) == cores
    assert dict(pm.shape) == {"core": cores}


def test_core_count_the_chip_lacks() -> None:
    with pytest.raises(cc.ChipError, match="v6e has no mode with 2"):
        TensorCoreMesh(cc.get_chip("v6e"), 2)


def test_bad_axis_name() -> None:
    with pytest.raises(cc.MeshError, match="not an identifier"):
        TensorCoreMesh(cc.get_chip("v5p"), 2, "my core")


def _v5p() -> HardwareTarget:
    c = cc.get_chip("v5p")
    return HardwareTarget(c, 4, c.default_cores_per_device)


def test_mesh_names_its_axis_and_takes_the_tensor_kind() -> None:
    m = mesh(cc.CoreKind.TENSOR, axis_name="tc", target=_v5p())
    assert dict(m.axes) == {"tc": 2} and m.kind is cc.CoreKind.TENSOR
    assert dict(m.pallas_mesh().shape) == {"tc": 2}


@pytest.mark.parametrize("kind", [cc.CoreKind.SPARSE_VECTOR, cc.CoreKind.SPARSE_SCALAR, "tc"])
def test_a_kind_other_than_tensor_is_refused(kind: Any) -> None:
    """The kind comes first (as in coremesh.sparsecore.mesh): a SparseCore kind, or an axis name
    passed where the kind goes, is a MeshError that says where the name belongs."""
    with pytest.raises(cc.MeshError, match="cannot be of kind") as e:
        mesh(kind, target=_v5p())
    assert "axis_name=" in str(e.value) and "coremesh.sparsecore.mesh" in str(e.value)


def test_public_face_is_the_backends_shared_one() -> None:
    check_backend_face(
        "coremesh.tensorcore",
        mesh_class="TensorCoreMesh",
        ops=("map_blocks", "reduce", "matmul", "gather_blocks"),
    )


def test_registered_backend_serves_tensor_meshes() -> None:
    cc.backends.refresh()
    assert "tensorcore" in cc.available_backends()
    b = cc.get_backend("tensorcore")
    assert isinstance(b, TensorCoreBackend)
    assert cc.backend_for(cc.CoreKind.TENSOR) is b


def test_import_refuses_a_jax_older_than_supported() -> None:
    """Importing the package under a jax that says it is 0.9.4 stops with the supported range."""
    check_import_refuses_old_jax("coremesh.tensorcore")
