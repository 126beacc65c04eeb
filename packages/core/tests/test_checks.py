"""Dtype and capacity checks: each names the value, the rule, the chip and the fix."""

from __future__ import annotations

import pytest

from coremesh.core import (
    CapacityError,
    UnsupportedOnChipError,
    check_array_dtype,
    check_fits,
    check_matmul_dtypes,
    check_operand_dtype,
    jax_versions,
    nbytes,
)
from coremesh.core.chips import MiB
from coremesh.core.dtypes import BOOL_OPERANDS_SINCE


def test_float64_refused_everywhere() -> None:
    with pytest.raises(UnsupportedOnChipError) as e:
        check_array_dtype("float64", "v6e")
    assert e.value.chip == "v6e"
    assert (
        "float64" in str(e.value) and "float32" in str(e.value) and "JAX_ENABLE_X64" in str(e.value)
    )


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "TPU7x"])
def test_operands_mosaic_refuses(chip: str) -> None:
    with pytest.raises(UnsupportedOnChipError) as e:
        check_operand_dtype("float16", chip)
    assert e.value.chip == chip and "float16" in e.value.what
    assert "cast to bfloat16" in (e.value.fix or "")


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "TPU7x"])
def test_bool_operands_by_jax_line(chip: str) -> None:
    # jax 0.10's Mosaic lowering refuses DMAs of bool, 0.11 lowers them (the compile tests of
    # coremesh-testing show both, per line): coremesh refuses exactly where the compiler does.
    if jax_versions.at_least(BOOL_OPERANDS_SINCE):
        assert check_operand_dtype("bool", chip) == "bool"
        return
    with pytest.raises(UnsupportedOnChipError) as e:
        check_operand_dtype("bool", chip)
    assert e.value.chip == chip and "bool" in e.value.what
    assert "cast to int8 or int32" in (e.value.fix or "")


@pytest.mark.parametrize(
    "dtype", ["bfloat16", "float32", "int32", "uint32", "int16", "uint16", "int8", "uint8"]
)
def test_operands_mosaic_takes(dtype: str) -> None:
    assert check_operand_dtype(dtype, "v5e") == dtype
    with pytest.raises(UnsupportedOnChipError):  # still refused as arrays: 64-bit
        check_operand_dtype("int64", "v5e")


@pytest.mark.parametrize(
    ("chip", "lhs", "rhs", "ok"),
    [
        ("v4", "bfloat16", "bfloat16", True),
        ("v4", "int8", "int8", False),  # E2001 CompileTimeMosaicUnsupportedRhsType on v4
        ("v5e", "int8", "int8", True),
        ("v6e", "float8_e5m2", "float8_e5m2", True),
        ("TPU7x", "float8_e4m3fn", "float8_e4m3fn", True),
        ("TPU7x", "int8", "int8", False),
    ],
)
def test_matmul_dtype_table(chip: str, lhs: str, rhs: str, ok: bool) -> None:
    import jax.numpy as jnp

    if ok:
        check_matmul_dtypes(jnp.dtype(lhs), jnp.dtype(rhs), chip)
    else:
        with pytest.raises(UnsupportedOnChipError, match=f"{chip} cannot multiply"):
            check_matmul_dtypes(jnp.dtype(lhs), jnp.dtype(rhs), chip)


def test_scratch_over_the_scoped_limit_says_how_to_raise_it() -> None:
    with pytest.raises(CapacityError) as e:
        check_fits(20 * MiB, "v5p")
    msg = str(e.value)
    assert "16.00 MiB" in msg and "vmem_limit_bytes=20971520" in msg and "64.00 MiB" in msg
    check_fits(20 * MiB, "v5p", vmem_limit_bytes=32 * MiB)
    check_fits(20 * MiB, "v6e")  # 32 MiB scoped default on v6e


def test_scratch_over_physical_vmem() -> None:
    with pytest.raises(CapacityError, match="physical"):
        check_fits(96 * MiB, "TPU7x")
    with pytest.raises(CapacityError, match=r"more than the 64\.00 MiB"):
        check_fits(1, "v5p", vmem_limit_bytes=65 * MiB)


def test_sparsecore_capacity_and_absence() -> None:
    check_fits(nbytes((128, 128), "float32"), "v6e", "sparsecore_vmem")
    with pytest.raises(CapacityError, match=r"256\.0 KiB"):
        check_fits(nbytes((512, 256), "float32"), "v6e", "sparsecore_vmem")
    with pytest.raises(UnsupportedOnChipError, match="v5e has no SparseCore"):
        check_fits(1, "v5e", "sparsecore_vmem")


def test_smem() -> None:
    with pytest.raises(CapacityError, match="SMEM"):
        check_fits(2 * MiB, "v5p", "smem")


def test_index_vectors_are_1d_integers_and_in_range_when_concrete() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from coremesh.core import LayoutError, get_chip
    from coremesh.core.indices import check_in_range, check_index_vector

    chip = get_chip("v5p")
    assert check_index_vector("idx", np.arange(5, dtype=np.int16), chip, rule="r") == 5
    for bad in (np.zeros((2, 2), np.int32), np.zeros(3, np.float32)):
        with pytest.raises(LayoutError, match="idx must be a 1-D integer vector") as e:
            check_index_vector("idx", bad, chip, rule="one index per row")
        assert e.value.rule == "one index per row" and e.value.chip == "v5p"
    check_in_range("idx", np.array([0, 3, 7]), 8, chip, rule="r", fix="f")
    with pytest.raises(LayoutError, match=r"idx\[2\] = 8 is outside 0\.\.7") as e:
        check_in_range("idx", np.array([0, 7, 8, -1]), 8, chip, rule="8 rows", fix="fix it")
    assert (e.value.rule, e.value.fix) == ("8 rows", "fix it")

    # Traced indices cannot be checked here; the caller decides what out of range means.
    def traced(i: jax.Array) -> jax.Array:
        check_in_range("idx", i, 8, chip, rule="r", fix="f")
        return i

    np.testing.assert_array_equal(jax.jit(traced)(jnp.arange(9)), np.arange(9))
