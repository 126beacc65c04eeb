"""A roofline lower bound from the chip registry, and cycles turned into seconds.

For one JAX device of a chip (``Chip.device(cores)``: a v5p megacore device has the whole chip's HBM
bandwidth, a TPU7x device half of it) a program that moves ``bytes_accessed`` bytes through HBM and
does ``flops`` operations cannot finish sooner than::

    max(bytes_accessed / hbm_bytes_per_s, flops / peak_ops_per_s)

The peak is the MXU's (bfloat16 unless the work says otherwise), the highest rate the chip has, so
the bound stays a lower bound for vector-unit work too. ``ratio = estimate / bound`` says how far
a cycle estimate is from it; a ratio under 1 means the estimate is faster than the bound allows,
i.e. the estimate's model leaves something out (libtpu's static profile does not charge all HBM
traffic at the bandwidth limit).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from coremesh.core.chips import Chip, get_chip


@dataclasses.dataclass(frozen=True)
class Work:
    """What one device of a program must do: HBM bytes moved and operations."""

    bytes_accessed: int
    flops: int = 0
    peak_dtype: str = "bfloat16"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Roofline:
    """The lower bound for ``work`` on one device of ``chip``."""

    chip: str
    cores_per_device: int
    work: Work
    hbm_bytes_per_s: float
    peak_ops_per_s: float
    peak_dtype: str

    @property
    def memory_s(self) -> float:
        return self.work.bytes_accessed / self.hbm_bytes_per_s

    @property
    def compute_s(self) -> float:
        return self.work.flops / self.peak_ops_per_s

    @property
    def bound_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def limiter(self) -> Literal["memory", "compute"]:
        return "compute" if self.compute_s > self.memory_s else "memory"

    def ratio(self, seconds: float | None) -> float | None:
        """``seconds / bound_s``; None when either is unknown or the bound is zero."""
        if seconds is None or self.bound_s <= 0:
            return None
        return seconds / self.bound_s

    def to_json(self) -> dict[str, Any]:
        return {
            "chip": self.chip,
            "cores_per_device": self.cores_per_device,
            "bytes_accessed": self.work.bytes_accessed,
            "flops": self.work.flops,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "peak_ops_per_s": self.peak_ops_per_s,
            "peak_dtype": self.peak_dtype,
            "memory_s": self.memory_s,
            "compute_s": self.compute_s,
            "bound_s": self.bound_s,
            "limiter": self.limiter,
        }


def roofline_for(work: Work, chip: str | Chip, cores_per_device: int | None = None) -> Roofline:
    """The roofline bound of ``work`` on one device of ``chip`` in the given core mode."""
    c = get_chip(chip)
    dev = c.device(cores_per_device)
    dtype = work.peak_dtype if work.peak_dtype in dev.peak_ops_per_s else "bfloat16"
    return Roofline(
        chip=c.name,
        cores_per_device=dev.tensorcores,
        work=work,
        hbm_bytes_per_s=dev.hbm_bytes_per_s,
        peak_ops_per_s=dev.peak_ops_per_s[dtype],
        peak_dtype=dtype,
    )


def cycles_to_seconds(cycles: int, chip: str | Chip) -> float:
    """``cycles`` of the chip's TensorCore clock, in seconds."""
    return cycles / get_chip(chip).clock_hz
