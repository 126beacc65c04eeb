"""Block sizes per chip, from a rule rather than one size for all.

A pipeline double-buffers every operand's block in VMEM, so the block budget is the chip's scoped
VMEM limit (16 MiB on v4/v5e/v5p, 32 MiB on v6e/TPU7x) shared by ``operands`` x 2 buffers, with
a quarter kept back for the body's temporaries, and at most ``MAX_BLOCK_BYTES_PER_CORE`` per
core. Lanes are made as wide as the array allows (lane-dense DMAs and stores) and rows leave
every core at least one block, so a PARALLEL split has work for each core.
"""

from __future__ import annotations

import dataclasses
import math
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


#: Past about 1 MiB per core a block only shortens the pipeline: per-step overhead is already
#: amortised and fewer steps leave less to overlap. Measured with libtpu's static estimates on
#: v5e, v5p, v6e and TPU7x (benchmarks/bench_tensorcore.py); a megacore device, whose two cores
#: stream at once, does best with twice that.
MAX_BLOCK_BYTES_PER_CORE = 1 << 20


def block_budget(chip: str | Chip, operands: int, cores: int = 1) -> int:
    """Bytes one block may take for a pipeline with ``operands`` double-buffered operands."""
    c = get_chip(chip)
    scoped = c.scoped_vmem_default_bytes * 3 // (4 * 2 * max(operands, 1))
    return min(MAX_BLOCK_BYTES_PER_CORE * cores, scoped)


def choose_block(
    rows: int,
    cols: int,
    dtype: Any,
    *,
    chip: str | Chip,
    operands: int,
    cores: int = 1,
    row_align: int = 1,
) -> tuple[int, int]:
    """A (rows, cols) block for a 2-D elementwise/reduction pipeline on ``chip``.

    ``row_align``: block rows must also be a multiple of this (e.g. 128 when rows become lanes
    of the output); when ``rows`` is not, the block spans all rows.
    """
    c = get_chip(chip)
    sub, lane = tile_shape(dtype, c)
    bc = _largest_divisor(cols, lane, MAX_LANES)
    if row_align > 1:
        if rows % row_align:
            return rows, bc
        sub = math.lcm(sub, row_align)
    per_core = rows // cores if rows % (cores * sub) == 0 else rows
    cap_rows = max(sub, block_budget(c, operands, cores) // (bc * itemsize(dtype)))
    br = _largest_divisor(per_core, sub, cap_rows)
    return br, bc


def choose_matmul_blocks(
    m: int, k: int, n: int, dtype: Any, *, chip: str | Chip, cores: int = 1
) -> tuple[int, int, int]:
    """(bm, bk, bn) for a blocked matmul on ``chip``.

    Among blocks that fit the chip's scoped VMEM (inputs double-buffered, the float32 output
    block double-buffered and used as accumulator), take the highest arithmetic intensity
    (flops per byte brought in: grows with bm and bn), then the fewest k steps. k and n are
    multiples of 128 (the MXU's width on every generation; 256-wide MXUs get up to 1024 columns);
    bm leaves each core at least one row block.
    """
    c = get_chip(chip)
    sub, _ = tile_shape(dtype, c)
    size = itemsize(dtype)
    per_core = m // cores if m % (cores * sub) == 0 else m
    budget = c.scoped_vmem_default_bytes * 3 // 4
    max_n = 512 if c.mxu_size == 128 else 1024

    def fits(bm: int, bk: int, bn: int) -> bool:
        return 2 * (bm * bk + bk * bn) * size + 2 * bm * bn * 4 <= budget

    best: tuple[float, int, tuple[int, int, int]] | None = None
    for bk in _divisors(k, 128, 2048):
        for bn in _divisors(n, 128, max_n):
            for bm in _divisors(per_core, sub, 1024):
                if not fits(bm, bk, bn):
                    continue
                score = (bm * bn / (bm + bn), bk)
                if best is None or score > best[:2]:
                    best = (*score, (bm, bk, bn))
    if best is None:
        return sub, 128, 128
    return best[2]


@dataclasses.dataclass(frozen=True)
class ResidentPlan:
    """A matmul that keeps all of ``b`` in VMEM and streams rows of ``a`` and of the output.

    ``rows``: output rows per pipeline step, fetched as ``streams`` sub-blocks (one DMA each, all
    in flight at once); ``b`` arrives as ``rhs_chunks`` DMAs started together; ``vmem_bytes`` is
    what the kernel needs in VMEM, to set its scoped limit.
    """

    rows: int
    streams: int
    rhs_chunks: int
    vmem_bytes: int


#: Output rows per step of a resident-``b`` matmul, and per DMA within a step. 512-row steps in
#: 128-row streams were best or within 3% of best for 2048^3 bf16 on v5e, v5p, v6e and TPU7x in
#: libtpu's static estimates (MXU cost depends only on flops there; larger steps expose more of
#: the first fetch and last write, smaller ones add per-step overhead).
RESIDENT_ROWS, STREAM_ROWS, RHS_CHUNKS = 512, 128, 8


def choose_resident_plan(
    m: int,
    k: int,
    n: int,
    dtype: Any,
    out_dtype: Any,
    *,
    chip: str | Chip,
    cores: int = 1,
) -> ResidentPlan | None:
    """A resident-``b`` plan for an (m, k) x (k, n) matmul on ``chip``, or None if none fits.

    Keeping ``b`` in VMEM reads every operand from HBM once (a blocked matmul re-reads ``b``
    once per row block) and lets every step contract all of K with no accumulator. It fits when
    ``b``, double-buffered ``a`` and output row blocks and one float32 stream result take at
    most half of a core's VMEM, and every core gets whole row blocks.
    """
    c = get_chip(chip)
    sub, _ = tile_shape(dtype, c)
    sub = max(sub, tile_shape(out_dtype, c)[0])
    if m % (cores * sub):
        return None
    per_core = m // cores
    size, out_size = itemsize(dtype), itemsize(out_dtype)
    rhs = k * n * size
    for rows in reversed(_divisors(per_core, sub, RESIDENT_ROWS)):
        if per_core % rows:
            continue
        stream = _largest_divisor(rows, sub, STREAM_ROWS)
        need = rhs + 2 * rows * (k * size + n * out_size) + stream * n * 4
        if need <= c.vmem_bytes_per_core // 2:
            chunks = next(d for d in (RHS_CHUNKS, 4, 2, 1) if k % (d * sub) == 0 or d == 1)
            return ResidentPlan(rows, rows // stream, chunks, need)
    return None


def _divisors(n: int, unit: int, cap: int) -> list[int]:
    """Multiples of ``unit`` that divide ``n``, up to ``cap`` (``[unit]`` if there are none)."""
    found = [d for d in range(unit, min(n, cap) + 1, unit) if n % d == 0]
    return found or [unit]
