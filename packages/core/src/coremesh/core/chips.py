"""The chip registry: one frozen record per TPU generation coremesh supports.

Every figure carries its source in ``Chip.sources`` so a reader can check it; figures that are
derived rather than published say how. Capacities and rates are *per chip* as the vendor quotes
them; ``Chip.device(cores_per_device)`` gives the per-JAX-device view a kernel actually sees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from coremesh.core.errors import ChipError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: jax's TpuInfo table; these chips' entries are identical in jax 0.10.2
#: (jax/_src/pallas/mosaic/tpu_info.py), 0.11.2 and 0.12.0.1 (jax/_src/tpu_info.py).
JAX_TABLE = "jax's TpuInfo table (jax/_src/tpu_info.py, same figures in jax 0.10.2 to 0.12.0.1)"
CLOUD_DOCS = "Cloud TPU system architecture docs"
AOT_MEASURED = "measured with libtpu 0.0.52 (research/AOT_COMPILE.md)"


@dataclasses.dataclass(frozen=True)
class SparseCoreSpec:
    """SparseCores of one chip: ``cores`` SparseCores of ``subcores`` vector subcores each."""

    cores: int
    subcores: int
    lanes: int
    vmem_bytes_per_subcore: int
    dma_granule_bytes: int

    @property
    def total_subcores(self) -> int:
        return self.cores * self.subcores

    def register_shape(self, itemsize: int) -> tuple[int, int]:
        """Shape of one vector register for a dtype of ``itemsize`` bytes.

        A SparseCore vector register holds ``lanes`` 32-bit words per row and 4 rows as the
        core_map guide's (4, 16) int32 register on a 16-lane chip shows; packed dtypes hold more
        elements per lane.
        """
        if itemsize not in (1, 2, 4):
            raise ChipError(
                f"no SparseCore register shape for {itemsize}-byte elements",
                rule="SparseCore vector registers hold 8-, 16- or 32-bit elements",
                fix="use int32/float32, bfloat16/int16 or int8 data",
            )
        return (4, self.lanes * (4 // itemsize))


@dataclasses.dataclass(frozen=True)
class DeviceFigures:
    """What one JAX device of a chip has: the unit a kernel's roofline is computed for."""

    tensorcores: int
    hbm_bytes: int
    hbm_bytes_per_s: float
    peak_ops_per_s: Mapping[str, float]
    ici_bytes_per_s: float


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation. Per-chip figures unless the field name says otherwise.

    ``sparsecore`` is what one JAX device sees in the chip's default mode (the span of a
    ``VectorSubcoreMesh``): v5p's megacore device has all 4 SparseCores, a TPU7x device
    (one TensorCore) has 2 of the chip's 4.
    """

    name: str
    generation: int
    device_kind: str
    topology_prefix: str
    topology_rank: int
    tensorcores_per_chip: int
    #: cores per JAX device -> libtpu ``chip_config_name`` (None: the topology's default).
    core_modes: Mapping[int, str | None]
    default_cores_per_device: int
    sparsecore: SparseCoreSpec | None
    vmem_bytes_per_core: int
    scoped_vmem_default_bytes: int
    smem_bytes_per_core: int
    hbm_bytes: int
    hbm_bytes_per_s: float
    peak_ops_per_s: Mapping[str, float]
    clock_hz: float
    mxus_per_core: int
    mxu_size: int
    ici_links: int
    ici_bytes_per_s: float
    #: chips in the largest slice (pod) of this generation
    max_slice_chips: int
    sources: Mapping[str, str]
    lanes: int = 128
    sublanes: int = 8

    @property
    def has_megacore(self) -> bool:
        return max(self.core_modes) > 1

    @property
    def default_topology(self) -> str:
        return f"{self.topology_prefix}:{'x'.join(['2', '2', '1'][: self.topology_rank])}"

    def check_cores_per_device(self, cores: int) -> int:
        if cores not in self.core_modes:
            modes = ", ".join(str(c) for c in sorted(self.core_modes))
            raise ChipError(
                f"{self.name} has no mode with {cores} TensorCore(s) per device",
                rule=f"{self.name} devices have {modes} TensorCore(s)",
                chip=self.name,
                fix=f"ask for cores_per_device in ({modes}), or pick a megacore chip (v4, v5p)",
            )
        return cores

    def devices_per_chip(self, cores_per_device: int | None = None) -> int:
        cores = self.check_cores_per_device(cores_per_device or self.default_cores_per_device)
        return self.tensorcores_per_chip // cores

    def device(self, cores_per_device: int | None = None) -> DeviceFigures:
        """Figures for one JAX device in the given mode (TPU7x: each TensorCore is a device)."""
        cores = self.check_cores_per_device(cores_per_device or self.default_cores_per_device)
        share = cores / self.tensorcores_per_chip
        return DeviceFigures(
            tensorcores=cores,
            hbm_bytes=int(self.hbm_bytes * share),
            hbm_bytes_per_s=self.hbm_bytes_per_s * share,
            peak_ops_per_s=MappingProxyType({k: v * share for k, v in self.peak_ops_per_s.items()}),
            ici_bytes_per_s=self.ici_bytes_per_s * share,
        )

    def tile(self, itemsize: int) -> tuple[int, int]:
        """The native (sublane, lane) tile of a TensorCore for ``itemsize``-byte elements.

        32-bit data tiles as (8, 128); packed types stack more rows per sublane: (16, 128) for
        16-bit, (32, 128) for 8-bit, as Mosaic lays them out.
        """
        if itemsize not in (1, 2, 4):
            raise ChipError(
                f"no TensorCore tile for {itemsize}-byte elements",
                rule="TPU vector registers hold 8-, 16- or 32-bit elements",
                chip=self.name,
                fix="use a 32-bit or narrower dtype (64-bit types do not exist on TPU)",
            )
        return (self.sublanes * (4 // itemsize), self.lanes)


def _ro(d: dict[str, float]) -> Mapping[str, float]:
    return MappingProxyType(d)


def _sources(**extra: str) -> Mapping[str, str]:
    base = {
        "device_kind": JAX_TABLE,
        "tensorcores_per_chip": JAX_TABLE,
        "core_modes": f"{JAX_TABLE}; {AOT_MEASURED}",
        "vmem_bytes_per_core": JAX_TABLE,
        "smem_bytes_per_core": JAX_TABLE,
        "hbm_bytes": f"{JAX_TABLE} (x TensorCores per chip)",
        "hbm_bytes_per_s": f"{JAX_TABLE} (x TensorCores per chip)",
        "peak_ops_per_s": f"{JAX_TABLE} (x TensorCores per chip); {CLOUD_DOCS}",
        "sparsecore": JAX_TABLE,
        "mxus_per_core": JAX_TABLE,
        "mxu_size": JAX_TABLE,
        "scoped_vmem_default_bytes": AOT_MEASURED + " (E1001 CompileTimeScopedVmemOom limit)",
        "topology_prefix": AOT_MEASURED,
        "topology_rank": CLOUD_DOCS + " (v5e, v6e: 2D torus; v4, v5p, TPU7x: 3D torus)",
        "generation": JAX_TABLE,
        "ici_links": CLOUD_DOCS + " (ICI ports per chip; 3D torus: 6 neighbours, 2D: 4)",
        "ici_bytes_per_s": CLOUD_DOCS + " (ICI bandwidth per chip as the docs state it)",
        "max_slice_chips": CLOUD_DOCS + " (chips in the largest slice: a pod)",
    }
    base.update(extra)
    return MappingProxyType(base)


_CHIPS: tuple[Chip, ...] = (
    Chip(
        name="v4",
        generation=4,
        device_kind="TPU v4",
        topology_prefix="v4",
        topology_rank=3,
        tensorcores_per_chip=2,
        core_modes=MappingProxyType({2: "megacore", 1: None}),
        default_cores_per_device=2,
        sparsecore=None,
        vmem_bytes_per_core=16 * MiB,
        scoped_vmem_default_bytes=16 * MiB,
        smem_bytes_per_core=1 * MiB,
        hbm_bytes=34_400_000_000,
        hbm_bytes_per_s=1.23e12,
        peak_ops_per_s=_ro({"bfloat16": 2.75e14}),
        clock_hz=1.05e9,
        mxus_per_core=4,
        mxu_size=128,
        ici_links=6,
        ici_bytes_per_s=300e9,
        max_slice_chips=4096,
        sources=_sources(
            clock_hz="TPU v4 paper (arXiv 2304.01433): 1050 MHz",
            ici_bytes_per_s=CLOUD_DOCS + ": 2400 Gbps per chip",
            sparsecore="v4 SparseCores serve embeddings only and are not programmable from "
            "Pallas (jax's TpuInfo table lists none)",
        ),
    ),
    Chip(
        name="v5e",
        generation=5,
        device_kind="TPU v5 lite",
        topology_prefix="v5e",
        topology_rank=2,
        tensorcores_per_chip=1,
        core_modes=MappingProxyType({1: None}),
        default_cores_per_device=1,
        sparsecore=None,
        vmem_bytes_per_core=128 * MiB,
        scoped_vmem_default_bytes=16 * MiB,
        smem_bytes_per_core=1 * MiB,
        hbm_bytes=17_200_000_000,
        hbm_bytes_per_s=8.20e11,
        peak_ops_per_s=_ro({"bfloat16": 1.97e14, "int8": 3.94e14, "int4": 7.88e14}),
        clock_hz=1.5e9,
        mxus_per_core=4,
        mxu_size=128,
        ici_links=4,
        ici_bytes_per_s=200e9,
        max_slice_chips=256,
        sources=_sources(
            clock_hz="derived: 197 TFLOP/s / (4 MXUs x 128 x 128 x 2 flops) = 1.50 GHz",
            ici_bytes_per_s=CLOUD_DOCS + ": 1600 Gbps per chip",
        ),
    ),
    Chip(
        name="v5p",
        generation=5,
        device_kind="TPU v5",
        topology_prefix="v5p",
        topology_rank=3,
        tensorcores_per_chip=2,
        core_modes=MappingProxyType({2: None, 1: "legacy"}),
        default_cores_per_device=2,
        sparsecore=SparseCoreSpec(
            cores=4, subcores=16, lanes=8, vmem_bytes_per_subcore=512 * KiB, dma_granule_bytes=32
        ),
        vmem_bytes_per_core=64 * MiB,
        scoped_vmem_default_bytes=16 * MiB,
        smem_bytes_per_core=1 * MiB,
        hbm_bytes=103_000_000_000,
        hbm_bytes_per_s=2.46e12,
        peak_ops_per_s=_ro({"bfloat16": 4.59e14, "int8": 9.18e14, "int4": 1.84e15}),
        clock_hz=1.75e9,
        mxus_per_core=4,
        mxu_size=128,
        ici_links=6,
        ici_bytes_per_s=1200e9,
        max_slice_chips=8960,
        sources=_sources(
            clock_hz="derived: 459 TFLOP/s / (2 cores x 4 MXUs x 128 x 128 x 2 flops) = 1.75 GHz",
            ici_bytes_per_s=CLOUD_DOCS + ": 1200 GB/s bidirectional per chip",
        ),
    ),
    Chip(
        name="v6e",
        generation=6,
        device_kind="TPU v6 lite",
        topology_prefix="v6e",
        topology_rank=2,
        tensorcores_per_chip=1,
        core_modes=MappingProxyType({1: None}),
        default_cores_per_device=1,
        sparsecore=SparseCoreSpec(
            cores=2, subcores=16, lanes=8, vmem_bytes_per_subcore=256 * KiB, dma_granule_bytes=32
        ),
        vmem_bytes_per_core=128 * MiB,
        scoped_vmem_default_bytes=32 * MiB,
        smem_bytes_per_core=1 * MiB,
        hbm_bytes=34_400_000_000,
        hbm_bytes_per_s=1.64e12,
        peak_ops_per_s=_ro(
            {"bfloat16": 9.20e14, "int8": 1.84e15, "float8": 9.20e14, "int4": 3.68e15}
        ),
        clock_hz=1.75e9,
        mxus_per_core=2,
        mxu_size=256,
        ici_links=4,
        ici_bytes_per_s=800e9,
        max_slice_chips=256,
        sources=_sources(
            clock_hz="derived, unconfirmed: 918 TFLOP/s / (4 MXU-equivalents of 256x256 x 2 "
            "flops) = 1.75 GHz; no published clock",
            ici_bytes_per_s=CLOUD_DOCS + ": 800 GB/s bidirectional per chip",
        ),
    ),
    Chip(
        name="TPU7x",
        generation=7,
        device_kind="TPU7x",
        topology_prefix="TPU7x",
        topology_rank=3,
        tensorcores_per_chip=2,
        core_modes=MappingProxyType({1: None}),
        default_cores_per_device=1,
        sparsecore=SparseCoreSpec(
            cores=2, subcores=16, lanes=16, vmem_bytes_per_subcore=512 * KiB, dma_granule_bytes=32
        ),
        vmem_bytes_per_core=64 * MiB,
        scoped_vmem_default_bytes=32 * MiB,
        smem_bytes_per_core=1 * MiB,
        hbm_bytes=206_000_000_000,
        hbm_bytes_per_s=7.40e12,
        peak_ops_per_s=_ro({"bfloat16": 2.31e15, "float8": 4.60e15}),
        clock_hz=2.2e9,
        mxus_per_core=2,
        mxu_size=256,
        ici_links=6,
        ici_bytes_per_s=1200e9,
        max_slice_chips=9216,
        sources=_sources(
            clock_hz="derived, unconfirmed: 2307 TFLOP/s / (2 cores x 4 MXU-equivalents of "
            "256x256 x 2 flops) = 2.2 GHz; no published clock",
            ici_bytes_per_s=CLOUD_DOCS + ": 1200 GB/s bidirectional per chip",
            sparsecore=JAX_TABLE + " (per device: the chip's 4 SparseCores, 2 per TensorCore)",
        ),
    ),
)

CHIPS: Mapping[str, Chip] = MappingProxyType({c.name: c for c in _CHIPS})

_ALIASES = {
    "v4": "v4",
    "tpu v4": "v4",
    "v5e": "v5e",
    "v5 lite": "v5e",
    "v5litepod": "v5e",
    "tpu v5 lite": "v5e",
    "tpu v5e": "v5e",
    "v5p": "v5p",
    "tpu v5": "v5p",
    "tpu v5p": "v5p",
    "v6e": "v6e",
    "tpu v6 lite": "v6e",
    "tpu v6e": "v6e",
    "trillium": "v6e",
    "tpu7x": "TPU7x",
    "7x": "TPU7x",
    "v7x": "TPU7x",
    "ironwood": "TPU7x",
}


def get_chip(name: str | Chip) -> Chip:
    """Look a chip up by name, JAX ``device_kind`` or common alias (case-insensitive)."""
    if isinstance(name, Chip):
        return name
    key = _ALIASES.get(str(name).strip().lower())
    if key is None:
        raise ChipError(
            f"unknown chip {name!r}",
            rule=f"coremesh knows the TPU generations {', '.join(CHIPS)}",
            fix="pass one of those names (or a JAX device_kind such as 'TPU v5 lite')",
        )
    return CHIPS[key]


def chip_names() -> tuple[str, ...]:
    return tuple(CHIPS)
