"""Bad input gets a coremesh error (what, rule, chip, fix) before anything is traced."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coremesh.core as cc
import coremesh.sparsecore as sc
from coremesh.core.targets import HardwareTarget


@pytest.fixture
def on_chip() -> Iterator[Callable[[str], Any]]:
    """Make a (hardware-like) target of the chip current; errors fire before any kernel runs."""
    stack: list[Any] = []

    def enter(chip: str, devices: int = 1) -> Any:
        c = cc.get_chip(chip)
        ctx = cc.using_target(HardwareTarget(c, devices, c.default_cores_per_device))
        stack.append(ctx)
        return ctx.__enter__()

    yield enter
    while stack:
        stack.pop().__exit__(None, None, None)


def _complete(err: cc.CoremeshError, chip: str) -> None:
    assert err.chip == chip and err.rule and err.fix, str(err)


def f32(*shape: int) -> jax.Array:
    return jnp.zeros(shape, jnp.float32)


def i32(*values: int) -> jax.Array:
    return jnp.asarray(values, jnp.int32)


OPS: dict[str, Callable[[], Any]] = {
    "gather": lambda: sc.gather(f32(8, 16), i32(1, 2)),
    "scatter_add": lambda: sc.scatter_add(f32(8, 16), i32(1, 2), f32(2, 16)),
    "segment_sum": lambda: sc.segment_sum(f32(2, 16), i32(1, 2), 4),
    "embedding_bag": lambda: sc.embedding_bag(f32(8, 16), i32(1, 2), i32(0)),
    "mesh": sc.mesh,
}


@pytest.mark.parametrize("chip", ["v4", "v5e"])
@pytest.mark.parametrize("op", list(OPS))
def test_chips_without_sparsecore(on_chip: Any, chip: str, op: str) -> None:
    on_chip(chip)
    with pytest.raises(cc.UnsupportedOnChipError, match=f"{chip} has no SparseCore") as e:
        OPS[op]()
    _complete(e.value, chip)
    assert "v5p, v6e or TPU7x" in str(e.value)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.int16, jnp.uint8, jnp.int8])
def test_gather_refuses_dtypes_sparsecores_do_not_move(on_chip: Any, dtype: Any) -> None:
    on_chip("v5p")
    with pytest.raises(cc.UnsupportedOnChipError, match="table has dtype") as e:
        sc.gather(jnp.zeros((8, 64), dtype), i32(0))
    _complete(e.value, "v5p")
    assert "int32, float32, bfloat16" in str(e.value)


def test_scatter_add_refuses_bfloat16_accumulation(on_chip: Any) -> None:
    on_chip("v6e")
    t = jnp.zeros((8, 32), jnp.bfloat16)
    with pytest.raises(cc.UnsupportedOnChipError, match="updates has dtype bfloat16") as e:
        sc.scatter_add(t, i32(0), jnp.zeros((1, 32), jnp.bfloat16))
    _complete(e.value, "v6e")
    assert "cast updates to one of int32, float32" in str(e.value)


@pytest.mark.parametrize(("chip", "width"), [("v5p", 8), ("v6e", 8), ("TPU7x", 16)])
def test_rows_must_be_whole_registers_of_the_chip(on_chip: Any, chip: str, width: int) -> None:
    on_chip(chip)
    with pytest.raises(cc.LayoutError, match="features per row") as e:
        sc.gather(f32(8, width + 4), i32(0))
    _complete(e.value, chip)
    assert f"multiple of {width}" in str(e.value)
    # bfloat16 packs two elements per 32-bit lane: rows are whole registers of 2x the lanes.
    with pytest.raises(cc.LayoutError, match=f"multiple of {2 * width}"):
        sc.gather(jnp.zeros((8, width), jnp.bfloat16), i32(0))


def test_register_shapes_come_from_the_lane_count() -> None:
    assert sc.register_shape(jnp.int32, "v5p") == (4, 8)
    assert sc.register_shape(jnp.int32, "TPU7x") == (4, 16)  # the guide's (4, 16) int32
    assert sc.register_shape(jnp.bfloat16, "v6e") == (4, 16)
    sc.check_register_shape((4, 16), jnp.int32, "TPU7x")
    sc.check_register_shape((8,), jnp.float32, "v5p")
    for shape, chip in [((4, 16), "v5p"), ((8, 128), "TPU7x"), ((8, 8), "v6e"), ((16,), "v6e")]:
        with pytest.raises(cc.LayoutError, match="does not match") as e:
            sc.check_register_shape(shape, jnp.int32, chip)
        _complete(e.value, chip)
        assert "lanes of 32 bits" in str(e.value)


def test_out_of_range_concrete_indices_raise(on_chip: Any) -> None:
    on_chip("v5p")
    with pytest.raises(cc.LayoutError, match=r"indices\[2\] = -1 is outside 0\.\.7") as e:
        sc.gather(f32(8, 16), i32(0, 7, -1))
    _complete(e.value, "v5p")
    with pytest.raises(cc.LayoutError, match=r"indices\[0\] = 8 is outside"):
        sc.scatter_add(f32(8, 16), i32(8), f32(1, 16))
    with pytest.raises(cc.LayoutError, match=r"segment_ids\[1\] = 4 is outside 0\.\.3"):
        sc.segment_sum(f32(2, 16), i32(0, 4), 4, mode="check")
    with pytest.raises(cc.LayoutError, match=r"indices\[0\] = 9 is outside"):
        sc.embedding_bag(f32(8, 16), i32(9), i32(0))


def test_traced_indices_need_an_explicit_mode(on_chip: Any) -> None:
    on_chip("TPU7x")
    with pytest.raises(cc.LayoutError, match="traced, so mode='check' cannot check") as e:
        jax.jit(lambda i: sc.gather(f32(8, 16), i))(i32(1))
    _complete(e.value, "TPU7x")
    assert "mode='clip' or mode='fill'" in str(e.value)
    with pytest.raises(cc.LayoutError, match="mode='clip' or mode='drop'"):
        jax.jit(lambda i: sc.scatter_add(f32(8, 16), i, f32(1, 16)))(i32(1))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sc.gather(f32(8, 16), i32(0), mode="wrap"), "mode='wrap'"),
        (lambda: sc.scatter_add(f32(8, 16), i32(0), f32(1, 16), mode="fill"), "mode='fill'"),
        (lambda: sc.gather(f32(8, 16), i32(0), method="hbm"), "method='hbm'"),
        (lambda: sc.gather(f32(8, 16), jnp.zeros((2, 2), jnp.int32)), "1-D integer vector"),
        (lambda: sc.gather(f32(8, 16), jnp.zeros((2,), jnp.float32)), "1-D integer vector"),
        (lambda: sc.gather(f32(16), i32(0)), "has shape \\[16\\]"),
        (lambda: sc.scatter_add(f32(8, 16), i32(0, 1), f32(1, 16)), "2 indices for 1 update"),
        (lambda: sc.scatter_add(f32(8, 16), i32(0), f32(1, 8)), "do not match"),
        (lambda: sc.segment_sum(f32(2, 16), i32(0, 1), 0), "num_segments=0"),
        (lambda: sc.embedding_bag(f32(8, 16), i32(0), i32(0), combiner="max"), "combiner"),
        (
            lambda: sc.embedding_bag(
                jnp.zeros((8, 16), jnp.int32), i32(0), i32(0), combiner="mean"
            ),
            "combiner='mean' on a int32",
        ),
        (
            lambda: sc.embedding_bag(f32(8, 16), i32(0, 1, 2), i32(0, 2, 1)),
            r"offsets decrease at bag 2: offsets\[1\] = 2 > offsets\[2\] = 1",
        ),
        (lambda: sc.scatter_add(f32(8, 16), i32(0), f32(1, 16), chunk_rows=0), "chunk_rows=0"),
    ],
)
def test_malformed_arguments(on_chip: Any, call: Callable[[], Any], match: str) -> None:
    on_chip("v5p")
    with pytest.raises(cc.LayoutError, match=match) as e:
        call()
    _complete(e.value, "v5p")


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ((0, 2, 5), r"offsets\[2\] = 5 is outside 0\.\.3 \(3 indices\)"),
        ((-1, 0, 2), r"offsets\[0\] = -1 is outside 0\.\.3"),
    ],
)
def test_sorted_offsets_out_of_range_are_not_called_unsorted(
    on_chip: Any, offsets: tuple[int, ...], match: str
) -> None:
    on_chip("v5p")
    with pytest.raises(cc.LayoutError, match=match) as e:
        sc.embedding_bag(f32(8, 16), i32(0, 1, 2), i32(*offsets))
    assert "decrease" not in e.value.what and "0..3" in str(e.value.fix)
    _complete(e.value, "v5p")


def test_offsets_check_takes_sorted_offsets_up_to_the_end(on_chip: Any) -> None:
    from coremesh.sparsecore.ops.bag import check_offsets

    check_offsets(np.array([0, 0, 2, 3]), 3, "v5p")  # empty first and last bags
    on_chip("v5p")
    # Unsigned offsets that decrease are caught too (np.diff would wrap them to large ones).
    with pytest.raises(cc.LayoutError, match="offsets decrease at bag 1"):
        sc.embedding_bag(f32(8, 16), i32(0, 1, 2), jnp.asarray([2, 1], jnp.uint32))


def test_indices_must_split_over_the_devices(on_chip: Any) -> None:
    on_chip("v5p", devices=4)
    with pytest.raises(cc.LayoutError, match="3 indices do not split over 4 devices") as e:
        sc.gather(f32(8, 16), i32(0, 1, 2))
    _complete(e.value, "v5p")


def test_capacity_of_a_vector_subcore(on_chip: Any) -> None:
    on_chip("v6e")  # 256 KiB per vector subcore
    # gather's (lanes, D) row buffer: 8 rows x 8192 float32 = 256 KiB does not fit.
    with pytest.raises(cc.CapacityError, match="SparseCore VMEM; a v6e vector subcore") as e:
        sc.gather(f32(4, 8192), i32(0))
    _complete(e.value, "v6e")
    # method='vmem' stages the whole table: a table beyond the subcore's VMEM is refused.
    sc_table = f32(1024, 128)  # 512 KiB
    with pytest.raises(cc.CapacityError, match="staged table") as e:
        sc.gather(sc_table, i32(0), method="vmem")
    _complete(e.value, "v6e")
    # The fix is the other method, and how large a table this one takes (256 KiB less the two
    # (8, 128) float32 row buffers and their indices: 8128 bytes).
    assert "pass method='dma' (the default)" in str(e.value.fix)
    most = (256 * 1024 - (2 * (8 * 128 * 4 + 8 * 4) + 64)) // (128 * 4)
    assert f"method='vmem' takes at most {most} rows of 128 float32" in str(e.value.fix)
    # scatter's chunk lives in VMEM: too many rows asked for, or one row too wide.
    with pytest.raises(cc.CapacityError, match="chunk_rows=4096") as e:
        sc.scatter_add(f32(8, 128), i32(0), f32(1, 128), chunk_rows=4096)
    _complete(e.value, "v6e")
    with pytest.raises(cc.CapacityError, match="one row of 65536 float32") as e:
        sc.segment_sum(f32(1, 65536), i32(0), 2)
    _complete(e.value, "v6e")


def test_no_out_of_range_index_reaches_a_kernel_unchecked() -> None:
    """The host check sees every entry, not a sample: a single bad index among many raises."""
    idx = np.zeros(4096, np.int32)
    idx[4095] = 10
    c = cc.get_chip("v5p")
    with (
        cc.using_target(HardwareTarget(c, 1, 2)),
        pytest.raises(cc.LayoutError, match=r"indices\[4095\] = 10"),
    ):
        sc.gather(f32(10, 16), jnp.asarray(idx))
