"""Block sizes per chip, from a rule rather than one size for all.

A pipeline double-buffers every operand's block in VMEM, so the block budget is the chip's scoped
VMEM limit (16 MiB on v4/v5e/v5p, 32 MiB on v6e/TPU7x) shared by ``operands`` x 2 buffers, with
half kept back for the body's temporaries. Lanes are made as wide as the array allows (lane-dense
DMAs and stores) and rows leave every core at least one block, so a PARALLEL split has work for
each core.
"""

from __future__ import annotations

from typing import Any

from coremesh.core import Chip, get_chip, tile_shape
from coremesh.core.dtypes import itemsize

MAX_LANES = 2048


def _largest_divisor(n: int, unit: int, cap: int) -> int:
    """Largest multiple of ``unit`` dividing ``n`` and at most ``cap`` (at least ``unit``)."""
    best = unit
    k = unit
    while k <= min(n, cap):
        if n % k == 0:
            best = k
        k += unit
    return best


def block_budget(chip: str | Chip, operands: int) -> int:
    """Bytes one block may take for a pipeline with ``operands`` double-buffered operands."""
    c = get_chip(chip)
    return c.scoped_vmem_default_bytes // (2 * 2 * max(operands, 1))


def choose_block(
    rows: int, cols: int, dtype: Any, *, chip: str | Chip, operands: int, cores: int = 1
) -> tuple[int, int]:
    """A (rows, cols) block for a 2-D elementwise/reduction pipeline on ``chip``."""
    c = get_chip(chip)
    sub, lane = tile_shape(dtype, c)
    bc = _largest_divisor(cols, lane, MAX_LANES)
    per_core = rows // cores if rows % (cores * sub) == 0 else rows
    cap_rows = max(sub, block_budget(c, operands) // (bc * itemsize(dtype)))
    br = _largest_divisor(per_core, sub, cap_rows)
    return br, bc


def choose_matmul_blocks(
    m: int, k: int, n: int, dtype: Any, *, chip: str | Chip, cores: int = 1
) -> tuple[int, int, int]:
    """(bm, bk, bn) for a blocked matmul: MXU-aligned k/n, rows split evenly over cores."""
    c = get_chip(chip)
    sub, _ = tile_shape(dtype, c)
    size = itemsize(dtype)
    bn = _largest_divisor(n, 128, 512 if c.mxu_size == 128 else 1024)
    bk = _largest_divisor(k, 128, 512 if c.mxu_size == 128 else 1024)
    per_core = m // cores if m % (cores * sub) == 0 else m
    budget = c.scoped_vmem_default_bytes // 2
    bm = sub
    for cand in range(sub, min(per_core, 1024) + 1, sub):
        if per_core % cand:
            continue
        need = 2 * (cand * bk + bk * bn) * size + 2 * cand * bn * 4 + cand * bn * 4
        if need <= budget:
            bm = cand
    return bm, bk, bn
