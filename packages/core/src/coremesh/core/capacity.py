"""Memory budgets: scratch that must fit in VMEM, SMEM or a SparseCore subcore's VMEM.

Mosaic's scoped VMEM limit is lower than the physical VMEM (16 MiB on v4/v5e/v5p, 32 MiB on
v6e/TPU7x) and is raised per kernel with ``CompilerParams(vmem_limit_bytes=...)`` up to the
physical size; these checks say so before the compiler does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from coremesh.core.chips import Chip, get_chip
from coremesh.core.dtypes import itemsize
from coremesh.core.errors import CapacityError, UnsupportedOnChipError

Space = Literal["vmem", "smem", "sparsecore_vmem"]


def nbytes(shape: Iterable[int], dtype: Any) -> int:
    return math.prod(shape) * itemsize(dtype)


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
                f"{what} needs {_mib(total_bytes)} of VMEM but the limit is {_mib(limit)}",
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
