"""The chip registry against jax's own hardware table and its own invariants.

jax's table is read where the installed jax keeps it (``jax_compat.tpu_info_module()``). For the
five chips coremesh knows, every ``TpuInfo`` field in every core mode is the same in jax 0.10.2,
0.11.2 and 0.12.0.1 (0.11 added the 8t chip and reworded the TPU7x matmul rule without changing
which pairs it accepts), so one set of expectations holds on every tested line.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax.numpy as jnp
import numpy as np
import pytest

from coremesh.core import CHIPS, ChipError, UnsupportedOnChipError, get_chip, jax_compat
from coremesh.core.dtypes import check_matmul_dtypes, mxu_operand

tpu_info = jax_compat.tpu_info_module()

_JAX_VERSION = {
    "v4": tpu_info.ChipVersion.TPU_V4,
    "v5e": tpu_info.ChipVersion.TPU_V5E,
    "v5p": tpu_info.ChipVersion.TPU_V5P,
    "v6e": tpu_info.ChipVersion.TPU_V6E,
    "TPU7x": tpu_info.ChipVersion.TPU_7X,
}


@pytest.mark.parametrize("name", list(CHIPS))
def test_registry_matches_jax_table(name: str) -> None:
    chip = get_chip(name)
    version = _JAX_VERSION[name]
    # jax describes one logical device per its core count; its capacities are per TensorCore.
    info = tpu_info.get_tpu_info_for_chip(version, chip.default_cores_per_device)
    per_tc = chip.tensorcores_per_chip
    assert info.generation == chip.generation
    assert version.num_physical_tensor_cores_per_chip == chip.tensorcores_per_chip
    assert version.supports_megacore == chip.has_megacore
    assert tpu_info.chip_version_from_device_kind(chip.device_kind) == version
    assert info.num_lanes == chip.lanes
    assert info.num_sublanes == chip.sublanes
    assert info.vmem_capacity_bytes == chip.vmem_bytes_per_core
    assert info.smem_capacity_bytes == chip.smem_bytes_per_core
    assert info.mxu_column_size == chip.mxu_size
    assert info.num_mxus == chip.mxus_per_core
    assert info.hbm_capacity_bytes * per_tc == pytest.approx(chip.hbm_bytes, rel=1e-3)
    assert info.mem_bw_bytes_per_second * per_tc == pytest.approx(chip.hbm_bytes_per_s, rel=1e-3)
    assert info.bf16_ops_per_second * per_tc == pytest.approx(
        chip.peak_ops_per_s["bfloat16"], rel=1e-3
    )
    for field, key in (("int8", "int8"), ("fp8", "float8"), ("int4", "int4")):
        theirs = getattr(info, f"{field}_ops_per_second") * per_tc
        ours = chip.peak_ops_per_s.get(key, 0)
        assert ours == pytest.approx(theirs, rel=1e-3), field
    if info.sparse_core is None:
        assert chip.sparsecore is None
    else:
        assert chip.sparsecore is not None
        sc = info.sparse_core
        assert (sc.num_cores, sc.num_subcores, sc.num_lanes) == (
            chip.sparsecore.cores,
            chip.sparsecore.subcores,
            chip.sparsecore.lanes,
        )
        assert sc.vmem_capacity_bytes == chip.sparsecore.vmem_bytes_per_subcore
        assert sc.dma_granule_size_bytes == chip.sparsecore.dma_granule_bytes


#: Every dtype a TPU holds; the matmul check and jax must agree on each ordered pair.
_MATMUL_DTYPES = (
    "float32",
    "bfloat16",
    "float16",
    "int32",
    "int8",
    "uint8",
    "int4",
    "uint4",
    "float8_e5m2",
    "float8_e4m3fn",
    "float8_e4m3b11fnuz",
)


@pytest.mark.parametrize("name", list(CHIPS))
def test_matmul_dtypes_match_jax_table(name: str) -> None:
    chip = get_chip(name)
    info = tpu_info.get_tpu_info_for_chip(_JAX_VERSION[name], chip.default_cores_per_device)
    accepted = 0
    for lhs in _MATMUL_DTYPES:
        for rhs in _MATMUL_DTYPES:
            theirs = bool(info.is_matmul_supported(jnp.dtype(lhs), jnp.dtype(rhs)))
            try:
                check_matmul_dtypes(jnp.dtype(lhs), jnp.dtype(rhs), chip)
                ours = True
            except UnsupportedOnChipError:
                ours = False
            assert ours == theirs, (lhs, rhs)
            accepted += ours
    assert accepted >= 4  # float32/bfloat16 x float32/bfloat16 at least


@pytest.mark.parametrize("name", list(CHIPS))
def test_every_figure_has_a_source(name: str) -> None:
    chip = get_chip(name)
    skip = {"name", "sources", "lanes", "sublanes", "default_cores_per_device"}
    for f in dataclasses.fields(chip):
        value = getattr(chip, f.name)
        if f.name in skip:
            continue
        if isinstance(value, numbers.Number) or f.name in chip.sources:
            assert chip.sources.get(f.name), f"{name}.{f.name} has no source"


@pytest.mark.parametrize("name", list(CHIPS))
def test_per_device_figures_split_the_chip(name: str) -> None:
    chip = get_chip(name)
    for cores in chip.core_modes:
        dev = chip.device(cores)
        n = chip.devices_per_chip(cores)
        assert n * cores == chip.tensorcores_per_chip
        assert dev.hbm_bytes * n == pytest.approx(chip.hbm_bytes, rel=1e-9)
        assert dev.peak_ops_per_s["bfloat16"] * n == pytest.approx(chip.peak_ops_per_s["bfloat16"])


def test_clock_is_consistent_with_peak_for_published_mxu_counts() -> None:
    # peak bf16 = 2 flops x MXU cells x MXUs x cores x clock, for chips whose MXU count is public.
    for name in ("v4", "v5e", "v5p"):
        c = get_chip(name)
        peak = 2 * c.mxu_size**2 * c.mxus_per_core * c.tensorcores_per_chip * c.clock_hz
        assert peak == pytest.approx(c.peak_ops_per_s["bfloat16"], rel=0.01), name


def test_aliases_and_device_kinds_resolve() -> None:
    assert get_chip("TPU v5 lite").name == "v5e"
    assert get_chip("tpu7x").name == "TPU7x"
    assert get_chip("V5P").name == "v5p"
    for chip in CHIPS.values():
        assert get_chip(chip.device_kind) is chip


def test_unknown_chip_names_the_value_and_the_choices() -> None:
    with pytest.raises(ChipError) as e:
        get_chip("v9z")
    msg = str(e.value)
    assert "'v9z'" in msg
    for name in CHIPS:
        assert name in msg
    assert "Fix:" in msg


def test_core_count_the_chip_lacks_is_refused() -> None:
    with pytest.raises(ChipError, match=r"v5e has no mode with 2 TensorCore") as e:
        get_chip("v5e").device(2)
    assert e.value.chip == "v5e"
    assert "v4, v5p" in str(e.value)
    assert get_chip("v5p").devices_per_chip(1) == 2


def test_tiles_scale_with_packing() -> None:
    c = get_chip("v5p")
    assert c.tile(4) == (8, 128)
    assert c.tile(2) == (16, 128)
    assert c.tile(1) == (32, 128)
    with pytest.raises(ChipError):
        c.tile(8)


def test_sparsecore_register_shape_comes_from_lanes() -> None:
    sc7 = get_chip("TPU7x").sparsecore
    sc5 = get_chip("v5p").sparsecore
    assert sc7 is not None and sc5 is not None
    assert sc7.register_shape(4) == (4, 16)  # the guide's (4, 16) int32 register
    assert sc5.register_shape(4) == (4, 8)
    assert sc7.register_shape(2) == (4, 32)
    assert sc5.total_subcores == 64


def test_default_topologies() -> None:
    assert get_chip("v5e").default_topology == "v5e:2x2"
    assert get_chip("TPU7x").default_topology == "TPU7x:2x2x1"


def test_mxu_operand_rounds_float32_to_the_nearest_bfloat16_ties_to_even() -> None:
    # bfloat16 keeps 7 mantissa bits: near 1 its values are 2**-7 apart.
    ulp = 2.0**-7
    x = np.array(
        [1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2.0**-20, -(1 + ulp / 4), 3.0], np.float32
    )
    want = np.array([1.0, 1 + 2 * ulp, 1 + ulp, -1.0, 3.0], np.float32)
    got = mxu_operand(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert isinstance(mxu_operand(jnp.asarray(x)), type(jnp.asarray(x)))
    np.testing.assert_array_equal(np.asarray(mxu_operand(jnp.asarray(x))), want)
    ints = np.arange(4, dtype=np.int32)
    assert mxu_operand(ints) is ints
    assert np.isnan(mxu_operand(np.array([np.nan], np.float32))).all()
