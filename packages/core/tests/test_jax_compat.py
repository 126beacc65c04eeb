"""The public jax spellings that differ between lines, on the installed line.

Every assertion here runs on each tested jax (0.10.2, 0.11.2, 0.12.0.1) and, with warnings as
errors, shows that coremesh's spellings are not the deprecated ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import MeshError, get_chip, jax_compat, jax_versions


@pytest.fixture(autouse=True)
def _no_deprecated_spellings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        yield


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_tensorcore_mesh_has_the_asked_cores(cores: int) -> None:
    mesh = jax_compat.tensorcore_mesh("core", num_cores=cores)
    assert isinstance(mesh, jax_compat.tensorcore_mesh_class())
    assert jax_compat.mesh_cores(mesh) == cores
    assert dict(mesh.shape) == {"core": cores}


def test_tensorcore_mesh_axis_name() -> None:
    mesh = jax_compat.tensorcore_mesh(axis_name="tc", num_cores=2)
    assert dict(mesh.shape) == {"tc": 2}
    assert jax_compat.mesh_cores(mesh) == 2


def test_tensorcore_mesh_is_the_public_class_where_there_is_one() -> None:
    mesh = jax_compat.tensorcore_mesh("core", num_cores=2)
    if jax_versions.at_least(jax_compat.TENSORCORE_MESH_CLASS_SINCE):
        assert jax_compat.tensorcore_mesh_class() is pltpu.TensorCoreMesh
        assert mesh == pltpu.TensorCoreMesh(axis_name="core", num_cores=2)
        assert mesh.num_cores == 2
    else:
        assert not hasattr(pltpu, "TensorCoreMesh")  # 0.10.2 exports only the factory
        assert len(mesh.devices) == 2


def test_a_kernel_over_the_mesh_sees_its_cores() -> None:
    """The mesh is one ``pl.kernel`` takes, and its body sees the asked number of cores."""
    seen: list[Any] = []

    def body(x_ref: Any, o_ref: Any) -> None:
        seen.append(lax.axis_size("core"))
        pltpu.sync_copy(x_ref, o_ref)

    x = jnp.zeros((8, 128), jnp.float32)
    for cores in (1, 2):
        seen.clear()
        mesh = jax_compat.tensorcore_mesh("core", num_cores=cores)
        f = pl.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh)
        jaxpr = jax.make_jaxpr(f)(x)
        assert seen == [cores]
        assert len(jaxpr.jaxpr.eqns) == 1


def test_default_core_count_off_tpu_is_a_clear_error() -> None:
    """Off a TPU (and outside the simulator) the device has no core count to default to."""
    if hasattr(jax.devices()[0], "num_cores"):
        pytest.fail(f"this test expects a CPU default device, got {jax.devices()[0]}")
    with pytest.raises(MeshError, match=r"default jax device \(cpu\) has no TensorCores") as e:
        jax_compat.tensorcore_mesh("core")
    assert "num_cores" in str(e.value)


def test_mesh_cores_reads_the_one_axis() -> None:
    class Shaped:
        shape: ClassVar[dict[str, int]] = {"c": 3}

    assert jax_compat.mesh_cores(Shaped()) == 3


def test_tpu_info_module_holds_the_chip_table() -> None:
    info = jax_compat.tpu_info_module()
    moved = jax_versions.at_least(jax_compat.TPU_INFO_MOVED_IN)
    assert info.__name__ == ("jax._src.tpu_info" if moved else "jax._src.pallas.mosaic.tpu_info")
    v5p = info.get_tpu_info_for_chip(info.ChipVersion.TPU_V5P, 2)
    assert v5p.vmem_capacity_bytes == get_chip("v5p").vmem_bytes_per_core
    assert isinstance(info.registry, dict)


def test_registry_is_the_one_pallas_reads() -> None:
    """An entry in the module's ``registry`` is what ``pltpu.get_tpu_info()`` answers for a
    device of that kind (the hook a simulated chip uses); the answer is cached, and the module's
    ``get_tpu_info.cache_clear()`` forgets it."""
    info = jax_compat.tpu_info_module()
    kind = jax.devices()[0].device_kind
    v5p = info.get_tpu_info_for_chip(info.ChipVersion.TPU_V5P, 2)
    info.get_tpu_info.cache_clear()
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        pltpu.get_tpu_info()
    info.registry[kind] = lambda: v5p
    try:
        assert pltpu.get_tpu_info() is v5p
    finally:
        del info.registry[kind]
    assert pltpu.get_tpu_info() is v5p  # cached
    info.get_tpu_info.cache_clear()
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        pltpu.get_tpu_info()


def test_ref_memory_space_of_refs_views_and_non_refs() -> None:
    """Read inside a traced kernel body, where ``ref.memory_space`` fails from jax 0.11."""
    seen: dict[str, str] = {}

    def body(x_hbm: Any, o_hbm: Any) -> None:
        def scoped(v: Any, s: Any, sem: Any) -> None:
            seen["hbm"] = jax_compat.ref_memory_space(x_hbm)
            seen["vmem"] = jax_compat.ref_memory_space(v)
            seen["smem"] = jax_compat.ref_memory_space(s)
            seen["sem"] = jax_compat.ref_memory_space(sem)
            seen["vmem view"] = jax_compat.ref_memory_space(v.at[0:4])
            seen["view of a view"] = jax_compat.ref_memory_space(v.at[0:4].at[1:2])
            seen["hbm view"] = jax_compat.ref_memory_space(o_hbm.at[0:8])
            pltpu.sync_copy(x_hbm, v)
            pltpu.sync_copy(v, o_hbm)

        pl.run_scoped(
            scoped,
            pltpu.VMEM((8, 128), jnp.float32),
            pltpu.SMEM((4,), jnp.int32),
            pltpu.SemaphoreType.DMA(()),
        )

    x = jnp.zeros((8, 128), jnp.float32)
    mesh = jax_compat.tensorcore_mesh("core", num_cores=1)
    jax.make_jaxpr(pl.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh))(x)
    assert seen["vmem"] == seen["vmem view"] == seen["view of a view"] == "vmem"
    assert seen["smem"] == "smem"
    assert seen["hbm"] == seen["hbm view"] == "any"  # pl.kernel operands live anywhere (pl.ANY)
    assert "sem" in seen["sem"]
    assert jax_compat.ref_memory_space(object()) == ""
