"""A static cycle estimate: libtpu's cycles for one program, variant and chip, by operation.

``aot.profile`` (``aot.profiler``) makes them; ``aot.report`` puts them in tables. An estimate
keeps the operations read from libtpu's dump (``profile_dump.OpCycles``), the roofline bound of
the program's work, and the jax and libtpu that made it (estimates move between releases). Where
there is no estimate (v4; SparseCore programs, which the static profile does not cover) the status
says so and the bundle counts libtpu does dump are kept: scheduled TensorCore bundles per
operation and SparseCore bundles per section (``scs`` scalar sequencer, ``tec`` vector subcores).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from coremesh.core.chips import get_chip
from coremesh.testing.aot.profile_dump import OpCycles
from coremesh.testing.aot.roofline import Roofline, Work, cycles_to_seconds

Variant = Literal["kernel", "xla"]
CycleStatus = Literal[
    "ok", "no_estimate", "failed", "invalid", "unsupported", "aborted", "timeout", "error"
]


@dataclasses.dataclass(frozen=True)
class CycleEstimate:
    """libtpu's estimate for one program (or its XLA version) on one chip."""

    program: str
    variant: Variant
    chip: str
    topology: str
    mode: str
    num_devices: int
    cores_per_device: int
    status: CycleStatus
    ops: tuple[OpCycles, ...] = ()
    sparsecore_bundles: Mapping[str, int] = dataclasses.field(default_factory=dict)
    note: str | None = None
    work: Work | None = None
    roofline: Roofline | None = None
    compile_seconds: float = 0.0
    error: Mapping[str, Any] | None = None
    #: ``ops`` were read from the dump after the child died mid-program: only those it got to.
    partial: bool = False
    #: Bytes XLA copies into VMEM by copy-start (cross-program prefetches and copies inside the
    #: program, ``aot.hlo``): the profile has no operation for them, so ``cycles`` leaves them out.
    prefetch_bytes: int = 0
    #: The jax and libtpu that compiled and estimated it (estimates move between releases).
    jax_version: str | None = None
    libtpu_version: str | None = None

    @property
    def cycles(self) -> int | None:
        """Sum of the estimated cycles of the program's TensorCore operations.

        None unless the status is "ok": after an abort or timeout ``ops`` holds only the
        operations profiled before it, whose sum would pass for a (far too low) estimate.
        """
        known = [o.cycles for o in self.ops if o.cycles is not None]
        return sum(known) if known and self.status == "ok" else None

    @property
    def kernel_cycles(self) -> int | None:
        """Sum over the Pallas kernels only (None when the program has none with an estimate,
        or the status is not "ok")."""
        known = [o.cycles for o in self.ops if o.kind == "mosaic" and o.cycles is not None]
        return sum(known) if known and self.status == "ok" else None

    @property
    def bundles(self) -> int | None:
        """Scheduled TensorCore bundles. None after an abort or timeout, which can stop code
        generation midway; kept for "no_estimate" (libtpu profiles after scheduling)."""
        known = [o.bundles for o in self.ops if o.bundles is not None]
        return sum(known) if known and self.status not in ("aborted", "timeout") else None

    @property
    def seconds(self) -> float | None:
        c = self.cycles
        return None if c is None else cycles_to_seconds(c, self.chip)

    @property
    def prefetch_seconds(self) -> float | None:
        """The uncounted copies into VMEM (``aot.hlo``) at the device's HBM bandwidth."""
        if self.roofline is None:
            return None
        return self.prefetch_bytes / self.roofline.hbm_bytes_per_s

    def charged_seconds(self, *, kernels_only: bool = False) -> float | None:
        """The estimate (all ops, or the Pallas kernels only) plus the prefetch it leaves out."""
        c = self.kernel_cycles if kernels_only else self.cycles
        extra = self.prefetch_seconds
        if c is None or extra is None:
            return None
        return cycles_to_seconds(c, self.chip) + extra

    @property
    def ratio(self) -> float | None:
        """Estimated time over the roofline bound (1.0 = at the bound)."""
        return None if self.roofline is None else self.roofline.ratio(self.seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "variant": self.variant,
            "chip": self.chip,
            "topology": self.topology,
            "mode": self.mode,
            "num_devices": self.num_devices,
            "cores_per_device": self.cores_per_device,
            "status": self.status,
            "cycles": self.cycles,
            "kernel_cycles": self.kernel_cycles,
            "seconds": self.seconds,
            "clock_hz": get_chip(self.chip).clock_hz,
            "ratio": self.ratio,
            "roofline": self.roofline.to_json() if self.roofline else None,
            "ops": [dataclasses.asdict(o) for o in self.ops],
            "bundles": self.bundles,
            "sparsecore_bundles": dict(self.sparsecore_bundles),
            "note": self.note,
            "compile_seconds": round(self.compile_seconds, 4),
            "error": dict(self.error) if self.error else None,
            "partial": self.partial,
            "prefetch_bytes": self.prefetch_bytes,
            "jax": self.jax_version,
            "libtpu": self.libtpu_version,
        }
