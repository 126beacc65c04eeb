"""SparseCore meshes follow the target's chip; chips without SparseCore are refused."""

from __future__ import annotations

import pytest

import coremesh.core as cc
from coremesh.core.targets import HardwareTarget
from coremesh.sparsecore import SparseCoreBackend, mesh
from coremesh.testing.conformance.package import check_backend_face, check_import_refuses_old_jax


def _target(chip: str) -> HardwareTarget:
    c = cc.get_chip(chip)
    return HardwareTarget(c, 4, c.default_cores_per_device)


@pytest.mark.parametrize(
    ("chip", "cores", "subcores"), [("v5p", 4, 16), ("v6e", 2, 16), ("TPU7x", 2, 16)]
)
def test_vector_mesh(chip: str, cores: int, subcores: int) -> None:
    m = mesh(target=_target(chip))
    assert dict(m.axes) == {"core": cores, "subcore": subcores}


def test_scalar_mesh() -> None:
    m = mesh(cc.CoreKind.SPARSE_SCALAR, target=_target("v5p"))
    assert dict(m.axes) == {"core": 4}


def test_mesh_names_its_axes() -> None:
    m = mesh(axis_name="sc", subcore_axis_name="lane_group", target=_target("v6e"))
    assert dict(m.axes) == {"sc": 2, "lane_group": 16}
    scalar = mesh(cc.CoreKind.SPARSE_SCALAR, axis_name="subcore", target=_target("v6e"))
    assert dict(scalar.axes) == {"subcore": 2}  # a scalar mesh has no subcore axis to clash with


def test_tensor_kind_is_refused() -> None:
    with pytest.raises(cc.MeshError, match="cannot be of kind") as e:
        mesh(cc.CoreKind.TENSOR, target=_target("v5p"))
    assert "coremesh.tensorcore.mesh()" in str(e.value)


@pytest.mark.parametrize(("core", "subcore"), [("my core", "subcore"), ("core", "core")])
def test_axis_names_are_distinct_identifiers(core: str, subcore: str) -> None:
    with pytest.raises(cc.MeshError, match="not distinct identifiers"):
        mesh(axis_name=core, subcore_axis_name=subcore, target=_target("v5p"))


def test_public_face_is_the_backends_shared_one() -> None:
    check_backend_face(
        "coremesh.sparsecore",
        mesh_class="SparseCoreMesh",
        ops=("gather", "scatter_add", "segment_sum", "embedding_bag"),
    )


@pytest.mark.parametrize("chip", ["v4", "v5e"])
def test_chips_without_sparsecore_are_refused(chip: str) -> None:
    with pytest.raises(cc.UnsupportedOnChipError, match=f"{chip} has no SparseCore") as e:
        mesh(target=_target(chip))
    assert "v5p, v6e or TPU7x" in str(e.value)


def test_registered_backend_serves_sparse_meshes() -> None:
    cc.backends.refresh()
    b = cc.get_backend("sparsecore")
    assert isinstance(b, SparseCoreBackend)
    assert cc.backend_for(cc.CoreKind.SPARSE_VECTOR) is b
    assert cc.backend_for(cc.CoreKind.SPARSE_SCALAR) is b


def test_split_mode_device_drives_half_of_v5ps_sparsecores() -> None:
    c = cc.get_chip("v5p")
    split = mesh(target=HardwareTarget(c, 4, 1))
    assert dict(split.axes) == {"core": 2, "subcore": 16}
    assert mesh(cc.CoreKind.SPARSE_SCALAR, target=HardwareTarget(c, 4, 1)).axes == {"core": 2}


def test_import_refuses_a_jax_older_than_supported() -> None:
    """Importing the package under a jax that says it is 0.9.4 stops with the supported range."""
    check_import_refuses_old_jax("coremesh.sparsecore")
