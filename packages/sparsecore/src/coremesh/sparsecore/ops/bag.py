"""``embedding_bag``: per-bag sums or means of embedding rows, as two SparseCore kernels.

The rows are gathered by :func:`~coremesh.sparsecore.ops.gather.gather` and summed per bag by
:func:`~coremesh.sparsecore.ops.scatter.segment_sum` (not fused: the gathered rows make one
round trip through HBM).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from coremesh.core import LayoutError, current_target
from coremesh.core.indices import is_traced
from coremesh.sparsecore.mesh import SparseCoreMesh
from coremesh.sparsecore.ops._checks import check_indices, check_mode, check_range
from coremesh.sparsecore.ops.gather import gather
from coremesh.sparsecore.ops.scatter import segment_sum

BAG_MODES = ("check", "clip", "drop")
COMBINERS = ("sum", "mean")


def bag_ids(offsets: Any, n: int) -> Any:
    """The bag of each of ``n`` indices: bag ``b`` is ``indices[offsets[b]:offsets[b + 1]]``
    (the last bag runs to the end); indices before ``offsets[0]`` belong to no bag (-1)."""
    pos = jnp.arange(n, dtype=jnp.int32)
    return (
        jnp.searchsorted(jnp.asarray(offsets, jnp.int32), pos, side="right").astype(jnp.int32) - 1
    )


def embedding_bag_reference(
    table: Any, indices: Any, offsets: Any, *, combiner: str = "sum", mode: str = "check"
) -> Any:
    rows = table.shape[0]
    idx = jnp.asarray(indices, jnp.int32)
    ids = bag_ids(offsets, idx.shape[0])
    valid = (idx >= 0) & (idx < rows)
    if mode == "clip":
        valid = jnp.ones_like(valid)
    ids = jnp.where(valid, ids, -1)
    got = jnp.take(table, jnp.clip(idx, 0, rows - 1), axis=0)
    bags = len(offsets)
    out = jax.ops.segment_sum(got, ids, bags)
    if combiner == "mean":
        counts = jax.ops.segment_sum(jnp.ones_like(ids), ids, bags)
        out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
    return out


def check_offsets(host: Any, n: int, chip: str) -> None:
    """Concrete offsets: each bag starts where the last one did or later, inside the indices.

    One rule per error: offsets that are sorted but run past the indices are reported as out of
    range, never as unsorted.
    """
    import numpy as np

    rule = "bag b holds indices[offsets[b]:offsets[b + 1]], the last bag runs to the end"
    down = np.flatnonzero(np.diff(host) < 0)
    if down.size:
        b = int(down[0])
        raise LayoutError(
            f"offsets decrease at bag {b + 1}: offsets[{b}] = {host[b]} > "
            f"offsets[{b + 1}] = {host[b + 1]}",
            rule=rule + "; offsets are non-decreasing",
            chip=chip,
            fix="pass each bag's start position in bag order (np.sort them if the bags are "
            "already in order of their start)",
        )
    if host[0] < 0 or host[-1] > n:
        b = 0 if host[0] < 0 else len(host) - 1
        raise LayoutError(
            f"offsets[{b}] = {host[b]} is outside 0..{n} ({n} indices)",
            rule=rule + f"; offsets lie in 0..len(indices) = 0..{n}",
            chip=chip,
            fix=f"offsets are start positions in indices: keep them in 0..{n} "
            "(an offset equal to len(indices) is an empty last bag)",
        )


def embedding_bag(
    table: jax.Array,
    indices: jax.Array,
    offsets: jax.Array,
    *,
    combiner: str = "sum",
    mode: str = "check",
    mesh: SparseCoreMesh | None = None,
) -> jax.Array:
    """Per-bag ``sum`` or ``mean`` of ``table`` rows (PyTorch ``EmbeddingBag`` with offsets).

    Bag ``b`` holds ``indices[offsets[b]:offsets[b + 1]]``, the last bag runs to the end;
    ``offsets`` is non-decreasing. An empty bag is zeros. ``table`` is int32 or float32
    (``mean`` needs float32). Out-of-range indices: ``mode="check"`` raises (concrete) or refuses
    (traced), ``mode="drop"`` leaves them out (a mean counts only the rows it sums),
    ``mode="clip"`` clamps them.
    """
    chip = current_target().chip
    check_mode(mode, BAG_MODES, chip)
    if combiner not in COMBINERS:
        raise LayoutError(
            f"combiner={combiner!r}",
            rule="a bag combines its rows by 'sum' or 'mean'",
            chip=chip.name,
            fix="pass combiner='sum' or combiner='mean'",
        )
    if combiner == "mean" and not jnp.issubdtype(table.dtype, jnp.floating):
        raise LayoutError(
            f"combiner='mean' on a {table.dtype} table",
            rule="a mean of integer rows is not an integer",
            chip=chip.name,
            fix="cast the table to float32, or use combiner='sum'",
        )
    rows = int(table.shape[0])
    n = check_indices("indices", indices, chip)
    bags = check_indices("offsets", offsets, chip)
    if bags < 1:
        raise LayoutError(
            "offsets is empty",
            rule="one offset per bag, at least one bag",
            chip=chip.name,
            fix="pass offsets=[0] for a single bag",
        )
    if not is_traced(offsets):
        import numpy as np

        check_offsets(np.asarray(offsets).astype(np.int64), n, chip.name)
    check_range("indices", indices, rows, mode, chip, "'clip' or mode='drop'")
    idx = jnp.asarray(indices, jnp.int32)
    ids = bag_ids(offsets, n)
    if mode != "clip":
        ids = jnp.where((idx >= 0) & (idx < rows), ids, -1)
    got = gather(table, idx, mode="clip", mesh=mesh)
    out = segment_sum(got, ids, bags, mode="drop", mesh=mesh)
    if combiner == "mean":
        counts = jax.ops.segment_sum(jnp.ones_like(ids), ids, bags)
        out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
    return out


__all__ = ["bag_ids", "embedding_bag", "embedding_bag_reference"]
