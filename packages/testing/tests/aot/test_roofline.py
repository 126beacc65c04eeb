"""The roofline bound, checked against hand arithmetic on the registry's published figures."""

from __future__ import annotations

import pytest

from coremesh.core.chips import CHIPS
from coremesh.testing.aot.roofline import Work, cycles_to_seconds, roofline_for

MIB = 1024 * 1024


def test_memory_bound_add_one_on_a_v5p_megacore_device() -> None:
    # 1024 x 1024 f32 read + written: 8 MiB through one v5p device = the whole chip (2 TCs).
    r = roofline_for(Work(bytes_accessed=8 * MIB, flops=1024 * 1024), "v5p")
    assert r.hbm_bytes_per_s == 2.46e12  # the registry's v5p HBM bandwidth, per chip
    assert r.memory_s == pytest.approx(8 * MIB / 2.46e12)
    assert r.compute_s == pytest.approx(1024 * 1024 / 4.59e14)
    assert r.bound_s == r.memory_s
    assert r.limiter == "memory"


def test_split_mode_and_tpu7x_devices_get_half_the_chip() -> None:
    # A split v5p device and a TPU7x device each own one of the chip's two TensorCores.
    assert roofline_for(Work(MIB), "v5p", 1).hbm_bytes_per_s == pytest.approx(2.46e12 / 2)
    r = roofline_for(Work(MIB, flops=10**12), "TPU7x")
    assert r.hbm_bytes_per_s == pytest.approx(7.40e12 / 2)
    assert r.peak_ops_per_s == pytest.approx(2.31e15 / 2)
    assert r.compute_s == pytest.approx(10**12 / (2.31e15 / 2))
    assert r.limiter == "compute"


def test_compute_bound_matmul_uses_the_dtype_peak() -> None:
    # 4096^3 int8 matmul on v5e: 2 * 4096^3 ops at 394 TOP/s vs 3 x 16 MiB of operands.
    n = 4096
    w = Work(bytes_accessed=3 * n * n, flops=2 * n**3, peak_dtype="int8")
    r = roofline_for(w, "v5e")
    assert r.peak_ops_per_s == 3.94e14
    assert r.bound_s == pytest.approx(2 * n**3 / 3.94e14)
    assert r.ratio(2 * r.bound_s) == pytest.approx(2.0)


def test_unknown_peak_dtype_falls_back_to_bfloat16() -> None:
    r = roofline_for(Work(0, flops=10**9, peak_dtype="float32"), "v6e")
    assert r.peak_dtype == "bfloat16"
    assert r.peak_ops_per_s == 9.20e14


def test_ratio_is_undefined_without_a_time_or_a_bound() -> None:
    r = roofline_for(Work(0), "v5e")
    assert r.ratio(1e-6) is None
    assert roofline_for(Work(MIB), "v5e").ratio(None) is None


@pytest.mark.parametrize(("chip", "hz"), [(c.name, c.clock_hz) for c in CHIPS.values()])
def test_cycles_to_seconds_uses_the_registry_clock(chip: str, hz: float) -> None:
    assert cycles_to_seconds(235_485, chip) == pytest.approx(235_485 / hz)


def test_json_carries_the_inputs_and_the_bound() -> None:
    d = roofline_for(Work(8 * MIB, 0), "v5e").to_json()
    assert d["bytes_accessed"] == 8 * MIB
    assert d["bound_s"] == pytest.approx(8 * MIB / 8.20e11)
    assert d["limiter"] == "memory"
