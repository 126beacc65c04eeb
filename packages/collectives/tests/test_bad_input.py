"""Bad input: a clear coremesh error (what, rule, chip, fix) before anything is traced."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coremesh.collectives as cl
import coremesh.core as cc
from coremesh.core import jax_versions
from coremesh.core.dtypes import BOOL_OPERANDS_SINCE
from coremesh.core.targets import HardwareTarget
from coremesh.testing.plugin import SliceFactory


class Untraceable(HardwareTarget):
    """A target whose devices must never be reached: every error comes first."""

    def device_mesh(self, axis_name: str = "device") -> Any:
        raise AssertionError("validation should have failed before reaching the devices")


@pytest.fixture(params=["v5p", "v6e"])
def target(request: pytest.FixtureRequest) -> Iterator[HardwareTarget]:
    chip = cc.get_chip(request.param)
    t = Untraceable(chip, 4, chip.default_cores_per_device)
    with cc.using_target(t):
        yield t


def f32(*shape: int) -> jax.Array:
    return jnp.zeros(shape, jnp.float32)


def complete(err: cc.CoremeshError, chip: str) -> None:
    """The four parts every coremesh error carries."""
    assert err.what and err.rule and err.fix
    assert err.chip == chip


def test_an_axis_the_mesh_lacks(target: HardwareTarget) -> None:
    with pytest.raises(cc.MeshError, match="outside shard_map") as e:
        cl.all_gather(f32(32, 128), "chips")
    complete(e.value, target.chip.name)
    with pytest.raises(cc.MeshError, match="puts the core axis first") as e:
        cl.psum(f32(32, 128), ("core", "device"))
    assert "('device', 'core')" in str(e.value.fix)
    with pytest.raises(cc.MeshError, match="is not a collective axis"):
        cl.psum(f32(32, 128), ("device", "x", "core"))


def test_an_axis_the_shard_map_lacks() -> None:
    chip = cc.get_chip("v5p")
    mesh = jax.sharding.AbstractMesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    errors: list[cc.MeshError] = []

    @partial(jax.shard_map, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x"))
    def f(v: Any) -> Any:
        try:
            return cl.all_gather(v, "device")
        except cc.MeshError as err:
            errors.append(err)
            return v

    with cc.using_target(Untraceable(chip, 4, 2)), jax.sharding.use_abstract_mesh(mesh):
        jax.jit(f).trace(jax.ShapeDtypeStruct((32, 128), jnp.float32))
    (err,) = errors
    assert "has no axis 'device'" in str(err) and "'x'" in str(err.rule)


def test_a_permutation_that_is_not_one(target: HardwareTarget) -> None:
    with pytest.raises(cc.LayoutError, match=r"destination\(s\) \[1\] appear more than once"):
        cl.ppermute(f32(32, 128), "device", [(0, 1), (2, 1)])
    with pytest.raises(cc.LayoutError, match=r"source\(s\) \[0\]"):
        cl.ppermute(f32(32, 128), "device", [(0, 1), (0, 2)])
    with pytest.raises(cc.LayoutError, match=r"participant\(s\) \[4\]") as e:
        cl.ppermute(f32(32, 128), "device", [(0, 4)])
    complete(e.value, target.chip.name)
    with pytest.raises(cc.LayoutError, match="pairs"):
        cl.ppermute(f32(32, 128), "device", [0, 1])  # type: ignore[list-item]


def test_shapes_not_divisible_by_the_axis(target: HardwareTarget) -> None:
    with pytest.raises(cc.LayoutError, match="split over the target's 4 devices") as e:
        cl.psum(f32(30, 128), "device")
    complete(e.value, target.chip.name)
    with pytest.raises(cc.LayoutError, match="does not split over the 4 participants"):
        cl.psum_scatter(f32(4 * 6, 128), "device", tiled=True)
    with pytest.raises(cc.LayoutError, match="one entry per participant"):
        cl.psum_scatter(f32(4 * 3, 128), "device")
    with pytest.raises(cc.LayoutError, match="split_axis"):
        cl.all_to_all(f32(4 * 5, 6), "device", 0, 1, tiled=True)
    if target.cores_per_device == 2:
        with pytest.raises(cc.LayoutError, match="divisible by 2"):
            cl.all_gather(f32(4 * 3, 128), "core")


def test_a_dtype_the_chip_lacks(target: HardwareTarget) -> None:
    name = target.chip.name
    with pytest.raises(cc.UnsupportedOnChipError, match="float64") as e:
        cl.psum(np.zeros((32, 128), np.float64), "device")
    complete(e.value, name)
    if not jax_versions.at_least(BOOL_OPERANDS_SINCE):  # jax 0.11 lowers bool DMAs
        with pytest.raises(cc.UnsupportedOnChipError, match="bool") as e:
            cl.all_gather(np.zeros((32, 128), np.bool_), "device")
        assert "int8" in str(e.value.fix)
    with pytest.raises(cc.UnsupportedOnChipError, match="cannot reduce float8_e5m2"):
        cl.psum(jnp.zeros((32, 128), jnp.float8_e5m2), "device")
    with pytest.raises(cc.UnsupportedOnChipError, match="float16 cannot be a TPU kernel") as e:
        cl.all_gather(jnp.zeros((32, 128), jnp.float16), "device")
    assert "bfloat16" in str(e.value.fix)
    with pytest.raises(cc.UnsupportedOnChipError, match="cannot move int4"):
        cl.all_gather(jnp.zeros((32, 128), jnp.int4), "device")


def test_float8_on_a_chip_without_it() -> None:
    chip = cc.get_chip("v4")
    with (
        cc.using_target(Untraceable(chip, 4, 2)),
        pytest.raises(
            cc.UnsupportedOnChipError, match=r"\[v4\] collectives on v4 cannot move float8_e5m2"
        ),
    ):
        cl.all_gather(jnp.zeros((32, 128), jnp.float8_e5m2), "device")


def test_algorithms_that_do_not_apply(target: HardwareTarget) -> None:
    with pytest.raises(cc.MeshError, match="'hierarchical' over the device axis"):
        cl.all_gather(f32(32, 128), "device", algorithm="hierarchical")
    with pytest.raises(cc.CoremeshError, match="unknown algorithm 'tree'"):
        cl.all_gather(f32(32, 128), "device", algorithm="tree")  # type: ignore[arg-type]
    with pytest.raises(cc.CoremeshError, match="unknown sync mode"):
        cl.psum(f32(32, 128), "device", sync="never")
    with pytest.raises(cc.CoremeshError, match="unknown reduction 'prod'"):
        cl.all_reduce(f32(32, 128), "device", op="prod")  # type: ignore[arg-type]
    with pytest.raises(cc.LayoutError, match="cannot be cut in two") as e:
        cl.all_gather(f32(4 * 8, 128), "device", algorithm="bidirectional")
    assert "algorithm='ring'" in str(e.value.fix)


def test_a_collective_id_already_taken(target: HardwareTarget) -> None:
    alloc = cc.default_allocator()
    with alloc.scope():
        taken = alloc.allocate("another kernel")
        with pytest.raises(cc.CollectiveIdError, match="already taken by 'another kernel'"):
            cl.psum(f32(32, 128), "device", collective_id=taken)
        with pytest.raises(cc.CollectiveIdError, match="outside the pool"):
            cl.psum(f32(32, 128), "device", collective_id=10_000)


def test_vmem_staging_over_the_limit(slice_target: SliceFactory) -> None:
    """Over the core axes received data is staged in VMEM: too much is refused, with the fix."""
    x = jax.ShapeDtypeStruct((4 * 2 * 4096, 1024), jnp.float32)  # 16 MiB per core
    with slice_target(chip="v5p", devices=4), pytest.raises(cc.CapacityError) as e:
        jax.jit(lambda v: cl.all_gather(v, "core", tiled=True)).trace(x)
    assert "VMEM" in str(e.value) and "vmem_limit_bytes" in str(e.value.fix)
    complete(e.value, "v5p")
