"""``gather``: embedding lookup, ``table[indices]``, on SparseCore vector subcores.

Each device gathers its shard of the indices from a table replicated on every device. The
index vector is cut into groups of ``group_rows`` indices (a multiple of the register width,
up to 128, sized so two row buffers take at most a quarter of a subcore's VMEM); the groups are
split over every vector subcore of the device (cores x subcores, the first ``groups % workers``
subcores take one more). For each group a subcore copies the indices into VMEM and fetches all
of its rows with one indexed DMA (``table.at[idx_ref]``, the SparseCore's indirect stream),
double-buffered: group i+1's rows are in flight while group i is written to its output rows.
The table never has to fit in VMEM; the buffers do.

Mosaic takes an indexed DMA only of 32-bit elements in rows of whole 128-word tiles
(``coremesh.core.dma``). So 16-bit tables travel as 32-bit words (pairs of elements), and
tables whose rows are not a multiple of 128 words are fetched a register row (``lanes`` indices)
per group, one row DMA per index.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from coremesh.core import CapacityError, CostEstimate, LayoutError, check_fits, current_target
from coremesh.core.dma import indexed_dma_fits
from coremesh.core.dtypes import itemsize
from coremesh.core.partition import core_share
from coremesh.core.sharding import device_shards, on_devices
from coremesh.sparsecore.kernel import kernel
from coremesh.sparsecore.mesh import SparseCoreMesh
from coremesh.sparsecore.mesh import mesh as target_mesh
from coremesh.sparsecore.ops._checks import (
    GATHER_MODES,
    check_indices,
    check_mode,
    check_range,
    check_table,
)
from coremesh.sparsecore.registers import MOVE_DTYPES, check_dtype, register_width


def fill_value_for(dtype: Any) -> Any:
    """``jnp.take(..., mode='fill')``'s default: NaN for floats, the minimum for integers."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.nan
    return int(jnp.iinfo(dtype).min)


#: Most rows one indexed DMA fetches, and the share of a subcore's VMEM its two buffers may take.
MAX_GROUP_ROWS, GROUP_VMEM_SHARE = 128, 4


def indexed(cols: int, dtype: Any) -> bool:
    """Whether rows of ``cols`` elements of ``dtype``, as the 32-bit words the kernel moves, can
    be fetched by an indexed DMA (``coremesh.core.dma``)."""
    return indexed_dma_fits(jnp.int32, cols * itemsize(dtype) // 4)


def group_rows(n: int, row_bytes: int, lanes: int, workers: int, vmem_bytes: int) -> int:
    """Rows per indexed DMA: a multiple of ``lanes`` up to 128 whose two buffers fit in a
    quarter of ``vmem_bytes`` and no more than one worker's share of ``n`` rounded up; the
    largest such that divides ``n`` rounded up to ``lanes``, so the indices are padded (and the
    result sliced, a copy on the TensorCore) only as much as one register row needs."""
    share = -(-n // workers)
    fit = vmem_bytes // GROUP_VMEM_SHARE // (2 * (row_bytes + 4))
    cap = max(lanes, min(MAX_GROUP_ROWS, fit, -(-share // lanes) * lanes) // lanes * lanes)
    whole = -(-n // lanes) * lanes
    return next(g for g in range(cap, 0, -lanes) if whole % g == 0)


def _as_words(table: jax.Array) -> jax.Array:
    """16-bit rows as 32-bit words (pairs of elements): indexed DMAs move 32-bit elements only
    ("only 32-bit elements are supported" from Mosaic for a bfloat16 table)."""
    if itemsize(table.dtype) == 4:
        return table
    rows, cols = table.shape
    return jax.lax.bitcast_convert_type(table.reshape(rows, cols // 2, 2), jnp.int32)


def _from_words(words: jax.Array, dtype: Any) -> jax.Array:
    if words.dtype == dtype:
        return words
    rows, half = words.shape
    return jax.lax.bitcast_convert_type(words, dtype).reshape(rows, half * 2)


def gather_reference(
    table: Any, indices: Any, *, mode: str = "check", fill_value: Any = None
) -> Any:
    """The jax.numpy meaning of :func:`gather` (negative indices are out of range, not wrapped)."""
    rows = table.shape[0]
    idx = jnp.asarray(indices, jnp.int32)
    if mode == "clip":
        return jnp.take(table, jnp.clip(idx, 0, rows - 1), axis=0)
    valid = (idx >= 0) & (idx < rows)
    got = jnp.take(table, jnp.clip(idx, 0, rows - 1), axis=0)
    fill = fill_value_for(table.dtype) if fill_value is None else fill_value
    return jnp.where(valid[:, None], got, jnp.asarray(fill, table.dtype))


def gather(
    table: jax.Array,
    indices: jax.Array,
    *,
    mode: str = "check",
    fill_value: Any = None,
    method: str = "dma",
    mesh: SparseCoreMesh | None = None,
) -> jax.Array:
    """Rows ``table[indices]`` gathered by the SparseCores: an embedding lookup.

    ``table`` is ``(rows, D)`` int32, float32 or bfloat16 with ``D`` a multiple of the chip's
    register width; ``indices`` is a 1-D int32 vector split over the devices. Out-of-range
    indices (negative ones included: they never wrap around):

    * ``mode="check"`` (default): concrete indices are checked and raise ``LayoutError``;
      traced indices are refused, because they cannot be checked;
    * ``mode="clip"``: clamped to ``[0, rows - 1]``, as ``jnp.take(..., mode="clip")``;
    * ``mode="fill"``: the row is ``fill_value`` (default NaN for floats, the dtype's minimum
      for integers, as ``jnp.take(..., mode="fill")``).

    An out-of-range index is never used to address the table.

    ``method="dma"`` (default) fetches rows from HBM in groups, one indexed DMA per group (one
    DMA per row when a row is not a multiple of 512 bytes), for tables of any size.
    ``method="vmem"`` copies the whole table into every vector subcore's VMEM once and gathers
    from there with ``plsc.load_gather`` (no per-row DMA): for small tables only, a
    table beyond the subcore's VMEM raises ``CapacityError``.
    """
    t = current_target()
    chip = t.chip
    sc_mesh = mesh if mesh is not None else target_mesh()
    check_mode(mode, GATHER_MODES, chip)
    check_dtype("table", table.dtype, chip, MOVE_DTYPES)
    rows, cols = check_table("table", table, chip)
    n = check_indices("indices", indices, chip)
    check_range("indices", indices, rows, mode, chip, "'clip' or mode='fill'")
    shards = device_shards()
    if method not in ("dma", "vmem"):
        raise LayoutError(
            f"method={method!r}",
            rule="rows are fetched from HBM by indexed DMAs ('dma') or from a VMEM copy ('vmem')",
            chip=chip.name,
            fix="pass method='dma' (any table) or method='vmem' (small tables)",
        )
    if n % shards:
        raise LayoutError(
            f"{n} indices do not split over {shards} devices",
            rule="each device gathers the same number of rows",
            chip=chip.name,
            fix=f"pad the indices to a multiple of {shards}",
        )
    if n == 0:
        return jnp.zeros((0, cols), table.dtype)
    local_n = n // shards
    lanes = register_width(jnp.int32, chip)
    workers = sc_mesh.num_workers
    subcores = sc_mesh.num_subcores
    size = itemsize(table.dtype)
    by_index = method == "dma" and indexed(cols, table.dtype)
    if not by_index:
        group = lanes
    else:
        vmem = sc_mesh.spec.vmem_bytes_per_subcore
        group = group_rows(local_n, cols * size, lanes, workers, vmem)
    groups = -(-local_n // group)
    padded = groups * group
    staged = rows * cols * size if method == "vmem" else 0
    buffers = 2 * (group * cols * size + group * 4) + 64
    try:
        check_fits(
            staged + buffers,
            chip,
            "sparsecore_vmem",
            what=f"gather's two row buffers ({group} rows of {cols} {table.dtype} each)"
            + (f" and the staged table ({rows} rows, method='vmem')" if staged else ""),
        )
    except CapacityError as e:
        if not staged:
            raise
        most = max(0, (sc_mesh.spec.vmem_bytes_per_subcore - buffers) // (cols * size))
        raise CapacityError(
            e.what,
            rule=e.rule,
            chip=e.chip,
            fix="pass method='dma' (the default): it fetches the rows from HBM by DMA and keeps "
            f"only two groups of rows in VMEM, for a table of any size; method='vmem' takes at "
            f"most {most} rows of {cols} {table.dtype} on {chip.name}",
        ) from e

    def body(
        idx_hbm: Any, t_hbm: Any, o_hbm: Any, idx_v: Any, buf: Any, sem: Any, *tab_v: Any
    ) -> None:
        w = jax.lax.axis_index(sc_mesh.core_axis) * subcores + jax.lax.axis_index(
            sc_mesh.subcore_axis
        )
        start, count = core_share(groups, workers, w)
        if tab_v:
            vmem_body(idx_hbm, t_hbm, o_hbm, idx_v, buf, tab_v[0], start, count)
            return

        def rows_of(slot: Any, *, started: bool = False) -> list[Any]:
            """The DMAs bringing the rows named in ``idx_v[slot]`` into ``buf[slot]``: one
            indexed DMA, or one per row, each reading its index from a register (a wait for
            those needs only their sizes, not the indices again)."""
            if by_index:
                return [pltpu.make_async_copy(t_hbm.at[idx_v.at[slot]], buf.at[slot], sem.at[slot])]
            vec = None if started else idx_v[slot]
            return [
                pltpu.make_async_copy(
                    t_hbm.at[pl.ds(0 if vec is None else vec[k], 1)],
                    buf.at[slot, pl.ds(k, 1)],
                    sem.at[slot],
                )
                for k in range(group)
            ]

        def fetch(i: Any, slot: Any) -> None:
            pltpu.sync_copy(idx_hbm.at[pl.ds((start + i) * group, group)], idx_v.at[slot])
            for copy in rows_of(slot):
                copy.start()

        @pl.when(count > 0)
        def _first() -> None:
            fetch(0, 0)

        # Double-buffered: group i+1's rows are in flight while group i is written out. Its
        # index slot is reused only after the DMA reading it has been waited for.
        @pl.loop(0, count)
        def _group(i: Any) -> None:
            slot = i % 2
            for copy in rows_of(slot, started=True):
                copy.wait()

            @pl.when(i + 1 < count)
            def _next() -> None:
                fetch(i + 1, 1 - slot)

            pltpu.sync_copy(buf.at[slot], o_hbm.at[pl.ds((start + i) * group, group)])

    def vmem_body(
        idx_hbm: Any,
        t_hbm: Any,
        o_hbm: Any,
        idx_v: Any,
        buf: Any,
        tab_v: Any,
        start: Any,
        count: Any,
    ) -> None:
        from jax.experimental.pallas import tpu_sc as plsc

        pltpu.sync_copy(t_hbm, tab_v)
        lane = jax.lax.iota(jnp.int32, lanes)

        @pl.loop(0, count)
        def _group(i: Any) -> None:
            g = (start + i) * lanes
            pltpu.sync_copy(idx_hbm.at[pl.ds(g, lanes)], idx_v.at[0])
            vec = idx_v[0]

            @pl.loop(0, tab_v.shape[1])
            def _column(j: Any) -> None:
                col = jnp.full((lanes,), j, jnp.int32)
                plsc.store_scatter(buf.at[0], [lane, col], plsc.load_gather(tab_v, [vec, col]))

            pltpu.sync_copy(buf.at[0], o_hbm.at[pl.ds(g, lanes)])

    moved = padded * cols * size
    cost = CostEstimate(flops=0, bytes_accessed=2 * moved + padded * 4)

    def per_device(idx_local: jax.Array, tab_in: jax.Array) -> jax.Array:
        idx = idx_local.astype(jnp.int32)
        tab = _as_words(tab_in)
        safe = jnp.clip(idx, 0, rows - 1)
        if padded != local_n:
            safe = jnp.pad(safe, (0, padded - local_n))
        kern = kernel(
            body,
            out_type=jax.ShapeDtypeStruct((padded, tab.shape[1]), tab.dtype),
            mesh=sc_mesh,
            scratch=[
                pltpu.VMEM((2, group), jnp.int32),
                pltpu.VMEM((2, group, tab.shape[1]), tab.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                *([pltpu.VMEM(tab.shape, tab.dtype)] if method == "vmem" else []),
            ],
            cost_estimate=cost,
            name="coremesh_sc_gather",
        )
        out = _from_words(kern(safe, tab), tab_in.dtype)
        if padded != local_n:
            out = out[:local_n]
        if mode == "fill":
            valid = (idx >= 0) & (idx < rows)
            fill = fill_value_for(tab_in.dtype) if fill_value is None else fill_value
            out = jnp.where(valid[:, None], out, jnp.asarray(fill, tab_in.dtype))
        return out

    return on_devices(
        per_device, in_specs=(P("device"), P(None, None)), out_specs=P("device", None)
    )(indices, table)


def minimum_bytes(n: int, cols: int, dtype: Any) -> int:
    """Bytes any gather of ``n`` rows must move: read the indices and rows, write the rows."""
    return int(n * 4 + 2 * n * cols * itemsize(dtype))


__all__ = ["fill_value_for", "gather", "gather_reference", "minimum_bytes"]
