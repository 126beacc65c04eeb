"""The chip registry as people read it: one table for ``coremesh info`` and the demo.

A chip's TensorCores and a JAX device's cores are different counts (a TPU7x chip has two
TensorCores, each its own JAX device; a v5p chip's two are one megacore device by default), so the
table shows both and :func:`core_notes` says in words what each chip's JAX device is.
"""

from __future__ import annotations

from coremesh.core import CHIPS, Chip

HEADERS = (
    "chip",
    "device kind",
    "TCs/chip",
    "cores per JAX device (mode)",
    "SparseCores",
    "VMEM MiB (scoped)",
    "HBM GB",
    "HBM TB/s",
    "bf16 TFLOP/s",
    "GHz",
    "topology",
)


def sparsecore_cell(chip: Chip) -> str:
    sc = chip.sparsecore
    if sc is None:
        return "-"
    return f"{sc.cores}x{sc.subcores}, {sc.lanes} lanes, {sc.vmem_bytes_per_subcore // 1024} KiB"


def modes_cell(chip: Chip) -> str:
    """``2 (megacore, default), 1``: the core counts a JAX device can have on the chip."""
    cells = []
    for cores, mode in sorted(chip.core_modes.items(), reverse=True):
        notes = [
            n for n in (mode, "default" if cores == chip.default_cores_per_device else None) if n
        ]
        cells.append(f"{cores} ({', '.join(notes)})" if notes else str(cores))
    return ", ".join(cells)


def row(chip: Chip) -> list[str]:
    return [
        chip.name,
        chip.device_kind,
        str(chip.tensorcores_per_chip),
        modes_cell(chip),
        sparsecore_cell(chip),
        f"{chip.vmem_bytes_per_core // 2**20} / {chip.scoped_vmem_default_bytes // 2**20}",
        f"{chip.hbm_bytes / 1e9:.0f}",
        f"{chip.hbm_bytes_per_s / 1e12:.2f}",
        f"{chip.peak_ops_per_s['bfloat16'] / 1e12:.0f}",
        f"{chip.clock_hz / 1e9:.2f}",
        chip.default_topology,
    ]


def rows() -> list[list[str]]:
    return [row(c) for c in CHIPS.values()]


def core_note(chip: Chip) -> str:
    """What one JAX device of ``chip`` is, by default."""
    per_device = chip.default_cores_per_device
    tcs = chip.tensorcores_per_chip
    if per_device == tcs == 1:
        return f"{chip.name}: one TensorCore per chip, one JAX device each"
    if per_device == tcs:
        mode = chip.core_modes.get(per_device)
        how = f" ({mode})" if mode else ""
        return f"{chip.name}: the chip's {tcs} TensorCores are one JAX device{how}"
    return (
        f"{chip.name}: {tcs} TensorCores per chip, each its own JAX device of {per_device} core"
        + ("s" if per_device > 1 else "")
    )


def core_notes() -> list[str]:
    return [core_note(c) for c in CHIPS.values()]
