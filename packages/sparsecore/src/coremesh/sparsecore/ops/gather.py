"""``gather``: embedding lookup, ``table[indices]``, on SparseCore vector subcores.

Each device gathers its shard of the indices from a table replicated on every device. The
index vector is cut into groups of one register row (``lanes`` int32 indices, 8 on v5p/v6e, 16 on
TPU7x); the groups are split over every vector subcore of the device (cores x subcores, the
first ``groups % workers`` subcores take one more). For each group a subcore loads the indices
as one register, starts one row DMA per lane from HBM into a ``(lanes, D)`` VMEM buffer, waits
for them all and writes the buffer to its output rows with one DMA. The table never has to fit
in VMEM; the buffer does.

Row DMAs are issued per lane with scalar offsets (not one indexed DMA ``table.at[idx_ref]``), so
the same kernel runs on the CPU simulator and compiles for every SparseCore chip.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from coremesh.core import CostEstimate, LayoutError, check_fits, current_target
from coremesh.core.dtypes import itemsize
from coremesh.core.sharding import device_shards, on_devices
from coremesh.sparsecore.mesh import SparseCoreMesh
from coremesh.sparsecore.mesh import mesh as target_mesh
from coremesh.sparsecore.ops._checks import (
    GATHER_MODES,
    check_indices,
    check_mode,
    check_range,
    check_table,
)
from coremesh.sparsecore.registers import MOVE_DTYPES, check_dtype, register_width, split


def fill_value_for(dtype: Any) -> Any:
    """``jnp.take(..., mode='fill')``'s default: NaN for floats, the minimum for integers."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.nan
    return int(jnp.iinfo(dtype).min)


def _as_words(table: jax.Array) -> jax.Array:
    """16-bit rows as 32-bit words (pairs of elements): a one-row DMA of a 16-bit array would
    cut a (16, 128) tile of the packed layout, which Mosaic refuses."""
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

    ``method="dma"`` (default) fetches each row from HBM with its own DMA, for tables of any
    size. ``method="vmem"`` copies the whole table into every vector subcore's VMEM once and
    gathers from there with ``plsc.load_gather`` (no per-row DMA): for small tables only, a
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
            rule="rows are fetched per row from HBM ('dma') or from a VMEM copy ('vmem')",
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
    groups = -(-local_n // lanes)
    padded = groups * lanes
    workers = sc_mesh.num_workers
    subcores = sc_mesh.num_subcores
    size = itemsize(table.dtype)
    staged = rows * cols * size if method == "vmem" else 0
    check_fits(
        staged + 2 * (lanes * cols * size + lanes * 4) + 64,
        chip,
        "sparsecore_vmem",
        what=f"gather's two row buffers ({lanes} rows of {cols} {table.dtype} each)"
        + (f" and the staged table ({rows} rows, method='vmem')" if staged else ""),
    )

    def body(
        idx_hbm: Any, t_hbm: Any, o_hbm: Any, idx_v: Any, buf: Any, sem: Any, *tab_v: Any
    ) -> None:
        w = jax.lax.axis_index(sc_mesh.core_axis) * subcores + jax.lax.axis_index(
            sc_mesh.subcore_axis
        )
        start, count = split(groups, workers, w)
        if tab_v:
            vmem_body(idx_hbm, t_hbm, o_hbm, idx_v, buf, tab_v[0], start, count)
            return

        def fetch(i: Any, slot: Any) -> None:
            """Start the row DMAs of this subcore's group ``i`` into buffer ``slot``."""
            pltpu.sync_copy(idx_hbm.at[pl.ds((start + i) * lanes, lanes)], idx_v.at[slot])
            vec = idx_v[slot]
            for k in range(lanes):
                pltpu.async_copy(
                    t_hbm.at[pl.ds(vec[k], 1)], buf.at[slot, pl.ds(k, 1)], sem.at[slot]
                )

        def wait(slot: Any) -> None:
            for k in range(lanes):
                pltpu.make_async_copy(
                    t_hbm.at[pl.ds(0, 1)], buf.at[slot, pl.ds(k, 1)], sem.at[slot]
                ).wait()

        @pl.when(count > 0)
        def _first() -> None:
            fetch(0, 0)

        # Double-buffered: group i+1's rows are in flight while group i is written out.
        @pl.loop(0, count)
        def _group(i: Any) -> None:
            slot = i % 2
            wait(slot)

            @pl.when(i + 1 < count)
            def _next() -> None:
                fetch(i + 1, 1 - slot)

            pltpu.sync_copy(buf.at[slot], o_hbm.at[pl.ds((start + i) * lanes, lanes)])

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
        kern = pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((padded, tab.shape[1]), tab.dtype),
            mesh=sc_mesh.pallas_mesh(),
            scratch_types=[
                pltpu.VMEM((2, lanes), jnp.int32),
                pltpu.VMEM((2, lanes, tab.shape[1]), tab.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                *([pltpu.VMEM(tab.shape, tab.dtype)] if method == "vmem" else []),
            ],
            cost_estimate=cost.to_pallas(),
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
