"""Memory budgets: scratch that must fit in VMEM, SMEM or a SparseCore subcore's VMEM.

Mosaic's scoped VMEM limit is lower than the physical VMEM (16 MiB on v4/v5e/v5p, 32 MiB on
v6e/TPU7x) and is raised per kernel with ``CompilerParams(vmem_limit_bytes=...)`` up to the
physical size; these checks say so before the compiler does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from coremesh.core.chips import Chip, get_chip
from coremesh.core.dtypes import itemsize
from coremesh.core.errors import CapacityError, UnsupportedOnChipError

Space = Literal["vmem", "smem", "sparsecore_vmem"]


def nbytes(shape: Iterable[int], dtype: Any) -> int:
    return math.prod(shape) * itemsize(dtype)


def padded_nbytes(shape: Sequence[int], dtype: Any, chip: str | Chip) -> int:
    """Bytes a TensorCore buffer takes: its last two dims rounded up to the chip's tile.

    Mosaic lays VMEM/SMEM buffers out in (sublane, lane) tiles, so an (8, 1) float32 buffer
    takes a whole (8, 128) tile. This is the size the kernel check and the compile check use.
    """
    size = itemsize(dtype)
    dims = list(shape)
    if len(dims) >= 2 and size in (1, 2, 4):
        sub, lane = get_chip(chip).tile(size)
        dims[-2] = -(-dims[-2] // sub) * sub
        dims[-1] = -(-dims[-1] // lane) * lane
    return math.prod(dims) * size


def scratch_bytes(
    scratch: Sequence[Any], chip: str | Chip, *, tiled: bool = True
) -> dict[str, int]:
    """VMEM and SMEM bytes of ``pltpu.VMEM(...)``/``pltpu.SMEM(...)`` scratch (semaphores: 0).

    ``tiled`` pads each buffer to the TensorCore tile (``padded_nbytes``); SparseCore subcore
    memory is not laid out in TensorCore tiles, so its kernels count raw bytes.
    """
    import jax

    totals = {"vmem": 0, "smem": 0}
    for s in jax.tree.leaves(list(scratch), is_leaf=lambda x: hasattr(x, "shape")):
        space = str(getattr(s, "memory_space", "")).lower()
        shape, dtype = getattr(s, "shape", None), getattr(s, "dtype", None)
        if shape is None or dtype is None:
            continue
        key = "smem" if "smem" in space else "vmem" if "vmem" in space else None
        if key is None:
            continue
        try:
            size = padded_nbytes(shape, dtype, chip) if tiled else nbytes(shape, dtype)
        except (TypeError, ValueError):
            continue  # semaphore arrays carry a dtype that is no data type
        totals[key] += size
    return totals


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def check_fits(
    total_bytes: int,
    chip: str | Chip,
    space: Space = "vmem",
    *,
    vmem_limit_bytes: int | None = None,
    what: str = "scratch",
) -> None:
    """Refuse ``total_bytes`` of ``what`` that cannot fit in ``space`` on ``chip``."""
    c = get_chip(chip)
    if space == "vmem":
        physical = c.vmem_bytes_per_core
        limit = vmem_limit_bytes or c.scoped_vmem_default_bytes
        if vmem_limit_bytes is not None and vmem_limit_bytes > physical:
            raise CapacityError(
                f"vmem_limit_bytes={vmem_limit_bytes} ({_mib(vmem_limit_bytes)}) is more than "
                f"the {_mib(physical)} of VMEM a {c.name} TensorCore has",
                rule="the scoped VMEM limit can be raised up to the physical VMEM only",
                chip=c.name,
                fix=f"pass vmem_limit_bytes <= {physical}",
            )
        if total_bytes > limit:
            if total_bytes <= physical:
                fix = (
                    f"raise the limit: CompilerParams(vmem_limit_bytes={_round_up(total_bytes)}) "
                    f"(up to {_mib(physical)}), or use smaller blocks"
                )
            else:
                fix = (
                    f"it exceeds the physical {_mib(physical)} too: use smaller blocks or "
                    "pipeline the data through VMEM (emit_pipeline)"
                )
            raise CapacityError(
                f"{what} needs {_mib(total_bytes)} of VMEM, which would exceed memory: the "
                f"scoped limit is {_mib(limit)}",
                rule=f"{c.name} scoped VMEM limit {_mib(limit)}, physical {_mib(physical)} "
                "per TensorCore",
                chip=c.name,
                fix=fix,
            )
    elif space == "smem":
        if total_bytes > c.smem_bytes_per_core:
            raise CapacityError(
                f"{what} needs {_mib(total_bytes)} of SMEM; a {c.name} core has "
                f"{_mib(c.smem_bytes_per_core)}",
                rule="SMEM holds scalars and small index tables only",
                chip=c.name,
                fix="keep large index tables in HBM and copy a window into SMEM per step",
            )
    else:
        if c.sparsecore is None:
            raise UnsupportedOnChipError(
                f"{c.name} has no SparseCore for {what}",
                rule="SparseCores are on v5p, v6e and TPU7x",
                chip=c.name,
                fix="run SparseCore kernels on v5p, v6e or TPU7x",
            )
        cap = c.sparsecore.vmem_bytes_per_subcore
        if total_bytes > cap:
            raise CapacityError(
                f"{what} needs {_mib(total_bytes)} of SparseCore VMEM; a {c.name} vector subcore "
                f"has {_mib(cap)}",
                rule="each SparseCore vector subcore has its own small VMEM",
                chip=c.name,
                fix="pipeline the table through VMEM in chunks (emit_pipeline), or split it "
                "across more subcores",
            )


def _round_up(n: int, to: int = 2**20) -> int:
    return -(-n // to) * to
