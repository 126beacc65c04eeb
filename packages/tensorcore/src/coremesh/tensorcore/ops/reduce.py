"""``reduce``: sum / max / min along rows or columns, split across cores.

Along columns (``axis=1``) every core owns whole rows, so its results are final. Along rows
(``axis=0``) each core folds its share of rows into a VMEM partial; every core then sends its
partial to every other core's VMEM by DMA (not a second pass through HBM) and folds in the ones
it receives, and core 0 writes the result. Across devices the per-device results are combined
with the matching ``jax.lax`` collective.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from coremesh.core import Chip, CostEstimate, LayoutError, Manual, Parallel, current_target
from coremesh.core.dtypes import itemsize
from coremesh.core.sharding import device_shards, on_devices
from coremesh.tensorcore import exchange
from coremesh.tensorcore.block_sizes import choose_block
from coremesh.tensorcore.kernel import kernel
from coremesh.tensorcore.mesh import TensorCoreMesh
from coremesh.tensorcore.mesh import mesh as target_mesh
from coremesh.tensorcore.ops import nan_order
from coremesh.tensorcore.pipeline import pipeline, sub_blocks
from coremesh.tensorcore.validate import check_2d, check_tiled

Op = Literal["sum", "max", "min"]


def _acc_dtype(dtype: Any) -> Any:
    return jnp.float32 if jnp.issubdtype(dtype, jnp.floating) else jnp.int32


#: Least bytes per DMA when a block is fetched as several at once, and the most DMAs per block
#: along rows and along columns.
STREAM_BYTES, MAX_STREAMS, MAX_STREAMS_COLUMNS = 256 << 10, 4, 8


def _streams(br: int, bc: int, dtype: Any, *, lanes: bool) -> int:
    """How many DMAs (row sub-blocks of at least 256 KiB) fetch one block.

    One DMA per block leaves HBM idle while it is issued and drained; several in flight keep it
    busy, and libtpu's static estimates (which do not cap their sum at the HBM bandwidth) fall
    by 1.6-2.5x with 2-4 of them. Along rows more than 4 gain nothing (v5p and TPU7x lose);
    along columns, where each sub-block keeps 128 rows (they become output lanes), 8 beat 4 by
    8-26% (TPU7x 4529 -> 4165 cycles for 16 MiB; 16 give 4401). Row sub-blocks keep 32 rows,
    any dtype's sublane tile.
    """
    unit, most = (128, MAX_STREAMS_COLUMNS) if lanes else (32, MAX_STREAMS)
    block = br * bc * itemsize(dtype)
    for n in range(min(most, block // STREAM_BYTES), 1, -1):
        if br % (n * unit) == 0:
            return n
    return 1


def _identity(op: str, dtype: Any) -> Any:
    if op == "sum":
        return 0
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if op == "max" else jnp.inf
    info = jnp.iinfo(dtype)
    return info.min if op == "max" else info.max


def _grow_rows(br: int, bc: int, rows: int, item: int, cores: int, chip: Chip) -> int:
    """Block rows doubled up to a quarter of the scoped VMEM per block, keeping the row split.

    A reduction reads each byte once and does one op on it, so only the pipeline's per-step
    overhead is left to cut: libtpu's static estimates charge about 500 cycles a step, and 4-8
    MiB blocks beat choose_block's 1-2 MiB by 10-25% on v5e, v5p and v6e, and on TPU7x by 13%
    along rows and 40% along columns (with operands pinned to HBM; see TensorCoreKernel).
    """
    per_core = rows // cores if rows % (cores * br) == 0 else rows
    budget = chip.scoped_vmem_default_bytes // 4
    while 2 * br * bc * item <= budget and per_core % (2 * br) == 0:
        br *= 2
    return br


def reduce(
    x: jax.Array, axis: int, op: Op = "sum", *, mesh: TensorCoreMesh | None = None
) -> jax.Array:
    """``jnp.sum/max/min(x, axis=axis)`` for a 2-D ``x``, accumulated in float32 (int32 for
    integers) and returned in ``x.dtype``.

    A max or min over a slice holding a NaN is NaN, as in numpy and ``jnp``'s semantics, on
    every target: the kernel carries NaN itself (``nan_order``), because XLA:CPU's reductions,
    which the simulator runs, drop it.
    """
    t = current_target()
    core_mesh = mesh if mesh is not None else target_mesh()
    chip = t.chip
    shards = device_shards()
    if op not in nan_order.OPS:
        raise LayoutError(
            f"unknown reduction {op!r}",
            rule="reduce supports 'sum', 'max' and 'min'",
            chip=chip.name,
            fix="pass op='sum', 'max' or 'min'",
        )
    if axis not in (0, 1, -1, -2):
        raise LayoutError(
            f"axis={axis} for a 2-D array",
            rule="reduce along rows (axis=0) or columns (axis=1)",
            chip=chip.name,
            fix="pass axis=0 or axis=1",
        )
    rows, cols = check_2d("x", x, chip)
    check_tiled("x", (rows, cols), x.dtype, chip, rows_over=shards)
    local_rows = rows // shards
    acc_dtype = _acc_dtype(x.dtype)
    # Along columns each row's result becomes a lane of the output: row blocks of 128.
    br, bc = choose_block(
        local_rows,
        cols,
        x.dtype,
        chip=chip,
        operands=2,
        cores=core_mesh.cores,
        row_align=128 if axis in (1, -1) else 1,
    )
    columns = axis in (1, -1)
    br = _grow_rows(br, bc, local_rows, itemsize(x.dtype), core_mesh.cores, chip)
    streams = _streams(br, bc, x.dtype, lanes=columns)
    cost = CostEstimate(
        flops=local_rows * cols, bytes_accessed=local_rows * cols * x.dtype.itemsize
    )
    if columns:
        per_device = _along_columns(
            core_mesh, local_rows, cols, br, bc, streams, op, acc_dtype, cost
        )
        out_spec = P("device")
    else:
        per_device = _along_rows(core_mesh, local_rows, cols, br, bc, streams, op, acc_dtype, cost)
        out_spec = P()
        if shards > 1:  # the op shard_maps itself: combine the devices' results here

            def combined(x_local: jax.Array, inner: Callable[..., Any] = per_device) -> jax.Array:
                return nan_order.across(op, inner(x_local), "device")

            per_device = combined
    result = on_devices(per_device, in_specs=(P("device", None),), out_specs=out_spec)(x)
    return result.astype(x.dtype)


def reduce_reference(x: jax.Array, axis: int, op: Op = "sum") -> jax.Array:
    """The XLA meaning of :func:`reduce`: ``jnp.sum/max/min`` accumulated in float32 (int32 for
    integers), returned in ``x.dtype``, a max or min with a NaN being NaN (``jnp.max`` itself
    drops NaN on XLA:CPU; see ``nan_order``)."""
    return nan_order.reference_fold(op, x.astype(_acc_dtype(x.dtype)), axis).astype(x.dtype)


def _along_columns(
    core_mesh: TensorCoreMesh,
    rows: int,
    cols: int,
    br: int,
    bc: int,
    streams: int,
    op: str,
    acc_dtype: Any,
    cost: CostEstimate,
) -> Callable[[jax.Array], jax.Array]:
    combine, fold = partial(nan_order.combine, op), partial(nan_order.fold, op)
    gather = core_mesh.chip.generation >= 5

    sb = br // streams

    def fold_rows(x_ref: Any) -> Any:
        # Fold each row across lanes into a lane-dense (1, sb) row: a (rows, 1) output would be
        # padded to 128 lanes per row in HBM (128x the bytes). Reshaping the 1-D fold costs 5-10%
        # less in libtpu's estimates than transposing a broadcast (sb, 1) column, but needs a
        # sublane gather, which v4 lacks.
        x = x_ref[...].astype(acc_dtype)
        if gather:
            return fold(x, axis=1).reshape(1, sb)
        column = fold(x, axis=1, keepdims=True)
        return jnp.transpose(jnp.broadcast_to(column, (sb, 128)))[0:1, :]

    def block_body(*refs: Any) -> None:
        o_ref = refs[-1]
        for s, x_ref in enumerate(refs[:-1]):
            part = fold_rows(x_ref)
            window = (slice(None), slice(s * sb, (s + 1) * sb))

            @pl.when(pl.program_id(1) == 0)
            def _first(part: Any = part, window: Any = window) -> None:
                o_ref[window] = part

            @pl.when(pl.program_id(1) > 0)
            def _rest(part: Any = part, window: Any = window) -> None:
                o_ref[window] = combine(o_ref[window], part)

    def body(x_hbm: Any, o_hbm: Any) -> None:
        pipeline(
            block_body,
            grid=(rows // br, cols // bc),
            in_specs=sub_blocks(pl.BlockSpec((br, bc), lambda i, j: (i, j)), streams),
            out_specs=[pl.BlockSpec((1, br), lambda i, j: (0, i))],
            split=Parallel(core_mesh.axis_name, 0),
        )(*[x_hbm] * streams, o_hbm)

    def run(x_local: jax.Array) -> jax.Array:
        kern = kernel(
            body,
            mesh=core_mesh,
            out_type=jax.ShapeDtypeStruct((1, rows), acc_dtype),
            name=f"coremesh_reduce_{op}_columns",
            cost_estimate=cost,
        )
        return kern(x_local).reshape(rows)

    return run


def _along_rows(
    core_mesh: TensorCoreMesh,
    rows: int,
    cols: int,
    br: int,
    bc: int,
    streams: int,
    op: str,
    acc_dtype: Any,
    cost: CostEstimate,
) -> Callable[[jax.Array], jax.Array]:
    combine, fold = partial(nan_order.combine, op), partial(nan_order.fold, op)
    sub = 8  # partials are kept as (8, cols) 32-bit sublane tiles
    sb = br // streams
    axis = core_mesh.axis_name

    def body(x_hbm: Any, o_hbm: Any, acc: Any, recv: Any, send_sem: Any, recv_sem: Any) -> None:
        core = jax.lax.axis_index(axis)
        cores = jax.lax.axis_size(axis)
        acc[...] = jnp.full(acc.shape, _identity(op, acc_dtype), acc_dtype)

        def block_body(*x_refs: Any) -> None:
            part = None
            for x_ref in x_refs:
                folded = fold(x_ref[...].astype(acc_dtype).reshape(sb // sub, sub, bc), axis=0)
                part = folded if part is None else combine(part, folded)
            window = (slice(None), pl.ds(pl.program_id(1) * bc, bc))
            acc[window] = combine(acc[window], part)

        pipeline(
            block_body,
            grid=(rows // br, cols // bc),
            in_specs=sub_blocks(pl.BlockSpec((br, bc), lambda i, j: (i, j)), streams),
            out_specs=[],
            split=Manual(axis, 0),
        )(*[x_hbm] * streams)

        if cores > 1:
            # Every core reaches this point before any partial is sent (every recv exists).
            peers = [{axis: jax.lax.rem(core + k, cores)} for k in range(1, cores)]
            exchange.handshake(peers)
            # Symmetric: every core sends its partial to each other core (slot k holds the one
            # from k cores back) and waits on the same semaphores, so each core's program pairs
            # its waits with its own DMA starts (libtpu's static profiler needs that) and no core
            # leaves before its partial has landed and every peer's partial has arrived.
            copies = [
                pltpu.make_async_remote_copy(
                    acc, recv.at[k], send_sem.at[k], recv_sem.at[k], device_id=peers[k - 1]
                )
                for k in range(1, cores)
            ]
            exchange.start(copies)
            exchange.finish(copies)  # acc is still being read until every send is done
            for k in range(1, cores):
                acc[...] = combine(acc[...], recv[k])

        @pl.when(core == 0)
        def _write() -> None:
            acc[0:1, :] = fold(acc[...], axis=0, keepdims=True)
            pltpu.sync_copy(acc.at[0:1], o_hbm)

    def run(x_local: jax.Array) -> jax.Array:
        cores = core_mesh.cores
        kern = kernel(
            body,
            mesh=core_mesh,
            out_type=jax.ShapeDtypeStruct((1, cols), acc_dtype),
            scratch=[
                pltpu.VMEM((sub, cols), acc_dtype),
                pltpu.VMEM((cores, sub, cols), acc_dtype),
                pltpu.SemaphoreType.DMA((cores,)),
                pltpu.SemaphoreType.DMA((cores,)),
            ],
            name=f"coremesh_reduce_{op}_rows",
            collective_id="auto" if cores > 1 else None,
            cost_estimate=cost,
        )
        return kern(x_local).reshape(cols)

    return run
