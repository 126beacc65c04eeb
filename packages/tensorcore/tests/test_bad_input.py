"""Bad input to TensorCore ops: a clear coremesh error before anything is traced."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.core.targets import HardwareTarget


class Untraceable(HardwareTarget):
    """A target whose device mesh must never be reached: errors come first."""

    def device_mesh(self, axis_name: str = "device") -> object:
        raise AssertionError("validation should have failed before reaching the devices")


@pytest.fixture(params=["v5p", "v5e"])
def target(request: pytest.FixtureRequest) -> Iterator[HardwareTarget]:
    chip = cc.get_chip(request.param)
    t = Untraceable(chip, 2, chip.default_cores_per_device)
    with cc.using_target(t):
        yield t


def f32(*shape: int) -> jax.Array:
    return jnp.zeros(shape, jnp.float32)


def test_shapes_not_divisible_into_tiles(target: HardwareTarget) -> None:
    with pytest.raises(cc.LayoutError, match=r"(?s)\(100, 128\).*pad x to \(112, 128\)") as e:
        tc.reduce(f32(100, 128), 0)
    assert e.value.chip == target.chip.name
    with pytest.raises(cc.LayoutError, match=r"columns of 128"):
        tc.map_blocks(jnp.negative, f32(64, 100))


@pytest.mark.parametrize(
    ("call", "name", "shape"),
    [
        (lambda: tc.map_blocks(jnp.negative, f32(0, 128)), "arrays[0]", (0, 128)),
        (lambda: tc.reduce(f32(0, 128), 0), "x", (0, 128)),
        (lambda: tc.reduce(f32(16, 0), 1), "x", (16, 0)),
        (lambda: tc.matmul(f32(16, 0), f32(0, 128)), "a", (16, 0)),
        (lambda: tc.gather_blocks(f32(0, 128), jnp.zeros((2,), jnp.int32)), "x", (0, 128)),
    ],
)
def test_an_empty_operand_is_named_as_empty(
    target: HardwareTarget, call: Any, name: str, shape: tuple[int, int]
) -> None:
    # Not "pipeline grid (0, 1) is empty": the operand, its shape, and what to do instead.
    with pytest.raises(cc.LayoutError, match=re.escape(f"{name} is empty: shape {shape}")) as e:
        call()
    assert e.value.chip == target.chip.name and f"{name}.size == 0" in str(e.value.fix)


def test_no_indices_gather_no_blocks(target: HardwareTarget) -> None:
    x, idx = f32(64, 128), jnp.zeros((0,), jnp.int32)
    out = tc.gather_blocks(x, idx)
    ref = np.take(np.zeros((8, 8, 128), np.float32), np.zeros(0, np.int64), axis=0)
    assert out.shape == ref.reshape(-1, 128).shape == (0, 128) and out.dtype == x.dtype


def test_rows_must_split_over_devices(target: HardwareTarget) -> None:
    with pytest.raises(cc.LayoutError, match="over 2 devices"):
        tc.map_blocks(jnp.negative, f32(8, 128))


def test_mismatched_operands(target: HardwareTarget) -> None:
    with pytest.raises(cc.LayoutError, match=r"arrays\[1\] is float32\[64, 256\]"):
        tc.map_blocks(jnp.add, f32(64, 128), f32(64, 256))
    with pytest.raises(cc.LayoutError, match="inner dims differ"):
        tc.matmul(f32(64, 128), f32(256, 128))
    with pytest.raises(cc.LayoutError, match="2-D"):
        tc.reduce(jnp.zeros((4, 8, 128)), 0)


def test_non_blockwise_function(target: HardwareTarget) -> None:
    with pytest.raises(cc.LayoutError, match="blockwise"):
        tc.map_blocks(lambda x: x.sum(axis=0), f32(64, 128))


def test_a_transpose_is_refused_even_on_square_blocks(target: HardwareTarget) -> None:
    # (128, 128) blocks: a.T keeps their shape, so only the wider probe shows it.
    with pytest.raises(
        cc.LayoutError,
        match=r"f maps a \(128, 256\) array to \(256, 128\): it is not blockwise, and keeps the "
        r"shape of the \(128, 128\) block only because that block is square",
    ) as e:
        tc.map_blocks(lambda a: a.T, f32(256, 128), block=(128, 128))
    assert e.value.chip == target.chip.name and "transpose" in str(e.value.fix)
    with pytest.raises(cc.LayoutError, match="not blockwise"):
        tc.map_blocks(lambda a, b: a.T @ b, f32(256, 128), f32(256, 128), block=(128, 128))


def test_dtypes_the_chip_lacks(target: HardwareTarget) -> None:
    # float64 would make emit_pipeline's tiling loop forever in jax 0.10.2: refused first.
    with pytest.raises(cc.UnsupportedOnChipError, match="float64"):
        tc.map_blocks(np.negative, np.zeros((64, 128), np.float64))
    v4 = Untraceable(cc.get_chip("v4"), 1, 2)
    with cc.using_target(v4), pytest.raises(cc.UnsupportedOnChipError, match="v4 cannot multiply"):
        tc.matmul(jnp.zeros((64, 128), jnp.int8), jnp.zeros((128, 128), jnp.int8))


def test_scratch_beyond_vmem(target: HardwareTarget) -> None:
    big = pltpu.VMEM((8192, 8192), jnp.float32)  # 256 MiB
    with pytest.raises(cc.CapacityError, match=r"scratch of kernel <lambda> needs 256\.00 MiB"):
        tc.kernel(
            lambda *r: None, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), scratch=[big]
        )
    smem = pltpu.SMEM((1 << 19,), jnp.int32)  # 2 MiB of SMEM
    with pytest.raises(cc.CapacityError, match="SMEM"):
        tc.kernel(
            lambda *r: None, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), scratch=[smem]
        )


def test_core_axis_the_mesh_lacks(target: HardwareTarget) -> None:
    with pytest.raises(cc.MeshError, match="'cores' is not an axis"):
        tc.validate.check_core_axis("cores", list(tc.mesh().axes), target.chip)


def test_bad_reduction(target: HardwareTarget) -> None:
    with pytest.raises(cc.LayoutError, match="unknown reduction 'prod'"):
        tc.reduce(f32(64, 128), 0, "prod")  # type: ignore[arg-type]
    with pytest.raises(cc.LayoutError, match="axis=2"):
        tc.reduce(f32(64, 128), 2)


def test_gather_indices_checked(target: HardwareTarget) -> None:
    x = f32(64, 128)  # 8 blocks of 8 rows
    with pytest.raises(cc.LayoutError, match=r"indices\[1\] = 8 is outside 0..7"):
        tc.gather_blocks(x, jnp.array([0, 8], jnp.int32))
    with pytest.raises(cc.LayoutError, match="1-D integer"):
        tc.gather_blocks(x, jnp.array([[0]], jnp.int32))
    with pytest.raises(cc.LayoutError, match="do not split over 2 devices"):
        tc.gather_blocks(x, jnp.array([0, 1, 2], jnp.int32))
    with pytest.raises(cc.LayoutError, match="block_rows=12"):
        tc.gather_blocks(x, np.array([0, 1], np.int32), block_rows=12)
