"""``scatter_add`` and ``segment_sum`` on SparseCore vector subcores, by row ownership.

Two subcores adding into one row at once would lose an update, so every table row has exactly
one owner. The rows are cut into ``chunks`` of ``C`` rows (C chosen so a chunk fits the
subcore's VMEM), dealt round-robin to the device's vector subcores. For each chunk its owner
loads the chunk into VMEM (or zeroes it), scans every index one register row at a time, and for
each index inside its chunk DMAs that update row into VMEM and adds it in register-width
pieces; then it writes the chunk back. Each update is added exactly once, by one subcore, in
index order, so duplicates are summed exactly once each and integer results are exact.

With more than one device, each device sums its shard of the updates into zeros, the partial
sums are combined with ``psum`` and added to the table.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from coremesh.core import CapacityError, CostEstimate, LayoutError, current_target
from coremesh.core.dtypes import itemsize
from coremesh.core.sharding import device_shards, on_devices
from coremesh.sparsecore.kernel import kernel
from coremesh.sparsecore.mesh import SparseCoreMesh, sparsecore_of
from coremesh.sparsecore.mesh import mesh as target_mesh
from coremesh.sparsecore.ops._checks import (
    SCATTER_MODES,
    check_indices,
    check_mode,
    check_range,
    check_table,
)
from coremesh.sparsecore.registers import ACCUMULATE_DTYPES, check_dtype, register_width

#: Indices copied to VMEM per scan step (a multiple of every chip's lane count).
INDEX_BLOCK = 256


def scatter_add_reference(table: Any, indices: Any, updates: Any, *, mode: str = "drop") -> Any:
    """The jax.numpy meaning of :func:`scatter_add` (negative indices are out of range)."""
    rows = table.shape[0]
    idx = jnp.asarray(indices, jnp.int32)
    idx = jnp.clip(idx, 0, rows - 1) if mode == "clip" else jnp.where(idx < 0, rows, idx)
    return table.at[idx].add(updates, mode="drop")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def plan(
    rows: int, cols: int, dtype: Any, workers: int, chip: Any, chunk_rows: int | None = None
) -> tuple[int, int]:
    """``(chunk_rows, passes)``: the table's rows in chunks that fit a subcore's VMEM, dealt
    round-robin, ``passes`` chunks per subcore; at most ``chunk_rows`` rows a chunk if given."""
    sc = sparsecore_of(chip)
    fixed = INDEX_BLOCK * 4 + cols * itemsize(dtype)  # index block + one update row
    row_bytes = cols * itemsize(dtype)
    budget = sc.vmem_bytes_per_subcore // 2 - fixed  # half: leave room for the compiler
    most = budget // row_bytes
    if chunk_rows is not None:
        if not _is_count(chunk_rows):
            raise LayoutError(
                f"chunk_rows={chunk_rows!r}",
                rule="a chunk is a positive whole number of table rows",
                chip=chip.name,
                fix="pass chunk_rows=None to size chunks from the subcore's VMEM",
            )
        if chunk_rows > most:
            raise CapacityError(
                f"chunk_rows={chunk_rows} rows of {cols} {dtype} need "
                f"{chunk_rows * row_bytes // 1024} KiB of VMEM per subcore; "
                f"at most {most} rows fit",
                rule=f"a chunk lives in one {chip.name} vector subcore's "
                f"{sc.vmem_bytes_per_subcore // 1024} KiB VMEM (half is left to the compiler)",
                chip=chip.name,
                fix=f"pass chunk_rows <= {most}, or None",
            )
        most = chunk_rows
    if most < 1:
        raise CapacityError(
            f"one row of {cols} {dtype} ({row_bytes} bytes) plus the index block does not fit "
            f"half of a {chip.name} vector subcore's {sc.vmem_bytes_per_subcore // 1024} KiB VMEM",
            rule="a subcore holds at least one table row and one update row in its VMEM",
            chip=chip.name,
            fix="split the feature dimension into several calls",
        )
    per_worker = -(-rows // workers)
    passes = -(-per_worker // most)
    chunk = -(-rows // (workers * passes))
    return chunk, passes


def _scatter(
    table: jax.Array | None,
    rows: int,
    indices: jax.Array,
    updates: jax.Array,
    *,
    mode: str,
    what: str,
    mesh: SparseCoreMesh | None,
    chunk_rows: int | None,
) -> jax.Array:
    t = current_target()
    chip = t.chip
    sc_mesh = mesh if mesh is not None else target_mesh()
    check_mode(mode, SCATTER_MODES, chip)
    check_dtype("updates", updates.dtype, chip, ACCUMULATE_DTYPES)
    _, cols = check_table("updates", updates, chip, empty_rows=True)
    n = check_indices(what, indices, chip)
    if updates.shape[0] != n:
        raise LayoutError(
            f"{n} {what} for {updates.shape[0]} update rows",
            rule=f"one row of updates per entry of {what}",
            chip=chip.name,
            fix=f"pass as many {what} as update rows",
        )
    if table is not None:
        check_dtype("table", table.dtype, chip, ACCUMULATE_DTYPES)
        check_table("table", table, chip)
        if table.dtype != updates.dtype or table.shape[1] != cols:
            raise LayoutError(
                f"table {table.dtype}{list(table.shape)} and updates "
                f"{updates.dtype}{list(updates.shape)} do not match",
                rule="updates are rows of the table's dtype and width",
                chip=chip.name,
                fix="cast or reshape the updates to the table's dtype and row width",
            )
    check_range(what, indices, rows, mode, chip, "'clip' or mode='drop'")
    shards = device_shards()
    if n % shards:
        raise LayoutError(
            f"{n} {what} do not split over {shards} devices",
            rule="each device adds the same number of update rows",
            chip=chip.name,
            fix=f"pad the {what} (with an out-of-range index and mode='drop') to a multiple of "
            f"{shards}",
        )
    if n == 0:
        return jnp.zeros((rows, cols), updates.dtype) if table is None else table
    local_n = n // shards
    dtype = updates.dtype
    workers = sc_mesh.num_workers
    subcores = sc_mesh.num_subcores
    lanes = register_width(jnp.int32, chip)
    width = register_width(dtype, chip)
    chunk, passes = plan(rows, cols, dtype, workers, chip, chunk_rows)
    padded_rows = chunk * workers * passes
    blocks = -(-local_n // INDEX_BLOCK)
    padded_n = blocks * INDEX_BLOCK
    in_kernel_init = table is not None and shards == 1

    def body(*refs: Any) -> None:
        if in_kernel_init:
            idx_hbm, upd_hbm, tab_hbm, o_hbm, idx_v, acc, row = refs
        else:
            idx_hbm, upd_hbm, o_hbm, idx_v, acc, row = refs
        w = jax.lax.axis_index(sc_mesh.core_axis) * subcores + jax.lax.axis_index(
            sc_mesh.subcore_axis
        )

        @pl.loop(0, passes)
        def _pass(p: Any) -> None:
            lo = (p * workers + w) * chunk
            if in_kernel_init:
                pltpu.sync_copy(tab_hbm.at[pl.ds(lo, chunk)], acc)
            else:

                @pl.loop(0, chunk)
                def _zero(r: Any) -> None:
                    for c in range(0, cols, width):
                        acc[r, pl.ds(c, width)] = jnp.zeros((width,), dtype)

            @pl.loop(0, blocks)
            def _block(b: Any) -> None:
                pltpu.sync_copy(idx_hbm.at[pl.ds(b * INDEX_BLOCK, INDEX_BLOCK)], idx_v)

                @pl.loop(0, INDEX_BLOCK, step=lanes)
                def _group(g: Any) -> None:
                    vec = idx_v[pl.ds(g, lanes)] - lo
                    for k in range(lanes):
                        local = vec[k]

                        @pl.when((local >= 0) & (local < chunk))
                        def _add(k: int = k, local: Any = local) -> None:
                            pltpu.sync_copy(upd_hbm.at[pl.ds(b * INDEX_BLOCK + g + k, 1)], row)
                            for c in range(0, cols, width):
                                acc[local, pl.ds(c, width)] = (
                                    acc[local, pl.ds(c, width)] + row[0, pl.ds(c, width)]
                                )

            pltpu.sync_copy(acc, o_hbm.at[pl.ds(lo, chunk)])

    size = itemsize(dtype)
    cost = CostEstimate(
        flops=local_n * cols,
        bytes_accessed=padded_rows * cols * size * (2 if in_kernel_init else 1)
        + local_n * cols * size
        + padded_n * 4 * workers * passes,
    )

    def per_device(idx_local: jax.Array, upd: jax.Array, *tab: jax.Array) -> jax.Array:
        idx = idx_local.astype(jnp.int32)
        if mode == "clip":
            idx = jnp.clip(idx, 0, rows - 1)
        else:  # out of range: an index no chunk owns
            idx = jnp.where((idx < 0) | (idx >= rows), padded_rows, idx)
        idx = jnp.pad(idx, (0, padded_n - local_n), constant_values=padded_rows)
        args: list[jax.Array] = [idx, upd]
        if in_kernel_init:
            (full,) = tab
            if padded_rows != rows:
                full = jnp.pad(full, ((0, padded_rows - rows), (0, 0)))
            args.append(full)
        kern = kernel(
            body,
            out_type=jax.ShapeDtypeStruct((padded_rows, cols), dtype),
            mesh=sc_mesh,
            scratch=[
                pltpu.VMEM((INDEX_BLOCK,), jnp.int32),
                pltpu.VMEM((chunk, cols), dtype),
                pltpu.VMEM((1, cols), dtype),
            ],
            cost_estimate=cost,
            name=f"coremesh_sc_{'scatter_add' if table is not None else 'segment_sum'}",
        )
        out = kern(*args)
        if padded_rows != rows:
            out = out[:rows]
        if shards > 1:
            out = jax.lax.psum(out, "device")
            if tab:
                out = tab[0] + out
        return out

    extra: tuple[jax.Array, ...] = (table,) if table is not None else ()
    in_specs = (P("device"), P("device", None)) + (P(None, None),) * len(extra)
    return on_devices(per_device, in_specs=in_specs, out_specs=P(None, None))(
        indices, updates, *extra
    )


def scatter_add(
    table: jax.Array,
    indices: jax.Array,
    updates: jax.Array,
    *,
    mode: str = "check",
    chunk_rows: int | None = None,
    mesh: SparseCoreMesh | None = None,
) -> jax.Array:
    """``table.at[indices].add(updates)`` on the SparseCores; duplicate indices each add once.

    ``table`` ``(rows, D)`` and ``updates`` ``(N, D)`` are int32 or float32 (SparseCores
    accumulate in 32 bits); ``indices`` ``(N,)``. Out-of-range indices (negative ones included):
    ``mode="check"`` (default) raises for concrete indices and refuses traced ones,
    ``mode="drop"`` skips the update (as ``.at[].add(mode="drop")``), ``mode="clip"`` adds it to
    the nearest row. ``chunk_rows`` caps the rows a subcore holds in VMEM at once (default: as
    many as fit). float32 sums are in index order on one device (as XLA on the CPU); with
    several devices the per-device sums are combined, so the rounding may differ.
    """
    check_table("table", table, current_target().chip)
    return _scatter(
        table,
        int(table.shape[0]),
        indices,
        updates,
        mode=mode,
        what="indices",
        mesh=mesh,
        chunk_rows=chunk_rows,
    )


def segment_sum(
    values: jax.Array,
    segment_ids: jax.Array,
    num_segments: int,
    *,
    mode: str = "drop",
    chunk_rows: int | None = None,
    mesh: SparseCoreMesh | None = None,
) -> jax.Array:
    """``jax.ops.segment_sum(values, segment_ids, num_segments)`` on the SparseCores.

    ``values`` ``(N, D)`` int32 or float32, ``segment_ids`` ``(N,)`` (need not be sorted). Ids
    outside ``[0, num_segments)`` are dropped (``mode="drop"``, as ``jax.ops.segment_sum``);
    ``mode="check"`` raises for them instead and ``mode="clip"`` clamps them.
    """
    chip = current_target().chip
    if not _is_count(num_segments):
        raise LayoutError(
            f"num_segments={num_segments!r}",
            rule="num_segments is a static positive int (the output's row count)",
            chip=chip.name,
            fix="pass num_segments as a Python int",
        )
    return _scatter(
        None,
        num_segments,
        segment_ids,
        values,
        mode=mode,
        what="segment_ids",
        mesh=mesh,
        chunk_rows=chunk_rows,
    )


def segment_sum_reference(values: Any, segment_ids: Any, num_segments: int) -> Any:
    return jax.ops.segment_sum(values, segment_ids, num_segments)


__all__ = [
    "INDEX_BLOCK",
    "scatter_add",
    "scatter_add_reference",
    "segment_sum",
    "segment_sum_reference",
]
