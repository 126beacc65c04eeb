"""How a chunk is cut into parts (per core, per ring direction) without breaking TPU tiling.

A TPU ref keeps its last two dims in (sublane, lane) tiles. Cutting a chunk along its first dim
is free when that dim is not one of the two tiled dims (chunks of rank >= 3); a rank-2 chunk can
only be cut at multiples of the sublane tile (8 rows for 32-bit data, 16 for 16-bit, 32 for
8-bit: bf16 cuts at other rows do not compile), a rank-1 chunk at multiples of 128 lanes.
Shares may differ in size; a part with no rows is dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from coremesh.core import Chip, jax_compat
from coremesh.core.dtypes import itemsize

LANES = 128


@dataclasses.dataclass(frozen=True)
class Part:
    """Rows ``[start, start + size)`` of a chunk's first dim."""

    start: int
    size: int

    def of(self, ref: Any) -> Any:
        """This part of a chunk ref (the whole ref when the part is all of it)."""
        from jax.experimental import pallas as pl

        if self.start == 0 and self.size == ref.shape[0]:
            return ref
        return ref.at[pl.ds(self.start, self.size)]

    def shape(self, chunk: Sequence[int]) -> tuple[int, ...]:
        return (self.size, *chunk[1:])


def cut_unit(chunk: Sequence[int], dtype: Any, chip: Chip | None) -> int:
    """The granularity at which a chunk's first dim can be cut."""
    if len(chunk) >= 3:
        return 1
    if len(chunk) == 1:
        return LANES
    size = itemsize(dtype)
    if chip is not None:
        return chip.tile(size)[0]
    return 8 * (4 // size)


def split(chunk: Sequence[int], parts: int, dtype: Any, chip: Chip | None) -> tuple[Part, ...]:
    """Up to ``parts`` non-empty parts of the chunk's first dim, as even as the cut unit allows."""
    if not chunk or parts <= 1:
        return (Part(0, chunk[0] if chunk else 1),)
    n = chunk[0]
    unit = cut_unit(chunk, dtype, chip)
    units, tail = divmod(n, unit)
    if units < 2:
        return (Part(0, n),)
    base, extra = divmod(units, parts)
    out, start = [], 0
    for p in range(parts):
        size = (base + (1 if p < extra else 0)) * unit
        if p == parts - 1:
            size += tail
        if size:
            out.append(Part(start, size))
        start += size
    return tuple(out)


def memory_space(ref: Any) -> str:
    """``"vmem"``, ``"smem"``, ``"any"``/``"hbm"`` or ``""`` for a ref in a kernel body."""
    return jax_compat.ref_memory_space(ref)


def in_vmem(ref: Any) -> bool:
    return "vmem" in memory_space(ref)


def compute_dtype(dtype: Any) -> Any:
    """Arithmetic happens in 32 bits: narrower floats in float32, narrower ints in int32."""
    import jax.numpy as jnp

    d = jnp.dtype(dtype)
    if jnp.issubdtype(d, jnp.floating):
        return jnp.float32
    if jnp.issubdtype(d, jnp.unsignedinteger):
        return jnp.uint32
    if jnp.issubdtype(d, jnp.integer):
        return jnp.int32
    return d


def combiner(op: str, dtype: Any) -> Callable[[Any, Any], Any]:
    """Elementwise ``op`` (sum / max / min) of two values of ``dtype``, computed in 32 bits."""
    import jax.numpy as jnp

    fn = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum}[op]
    wide = compute_dtype(dtype)

    def combine(a: Any, b: Any) -> Any:
        if jnp.dtype(dtype) == jnp.dtype(wide):
            return fn(a, b)
        return fn(a.astype(wide), b.astype(wide)).astype(dtype)

    return combine
