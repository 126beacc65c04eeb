"""``gather_blocks``: blocks of rows chosen by a scalar-prefetched index vector.

The core_map guide's scalar prefetch: the indices are copied into SMEM first and each block's
source row is read from them. A plain gather computes nothing on the rows, so every block is
copied HBM to HBM, skipping VMEM: each core takes a contiguous share of the output blocks
(``core_share``) and keeps a window of block DMAs in flight on a ring of DMA semaphores. With
``f`` the blocks pass through VMEM: the guide's dynamic block index pattern, an ``emit_pipeline``
whose input index map reads the SMEM indices, its steps split across the cores (PARALLEL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from coremesh.core import (
    CostEstimate,
    LayoutError,
    Parallel,
    check_fits,
    current_target,
    tile_shape,
)
from coremesh.core.indices import check_in_range, check_index_vector
from coremesh.core.partition import core_share
from coremesh.core.sharding import device_shards, on_devices
from coremesh.tensorcore.block_sizes import choose_block
from coremesh.tensorcore.kernel import kernel
from coremesh.tensorcore.mesh import TensorCoreMesh
from coremesh.tensorcore.mesh import mesh as target_mesh
from coremesh.tensorcore.pipeline import pipeline
from coremesh.tensorcore.validate import check_2d, check_tiled

#: Block DMAs a core keeps in flight: enough to hide a DMA's latency behind issuing the next ones.
IN_FLIGHT = 64


def gather_blocks(
    x: jax.Array,
    indices: jax.Array,
    *,
    block_rows: int | None = None,
    f: Callable[[jax.Array], jax.Array] | None = None,
    mesh: TensorCoreMesh | None = None,
) -> jax.Array:
    """Rows ``x[indices[i] * block_rows : (indices[i] + 1) * block_rows]`` for every ``i``.

    Equal to ``x.reshape(-1, block_rows, C)[indices].reshape(-1, C)``, or with ``f`` to ``f`` of
    that (applied in VMEM to tiles of ``block_rows`` rows; ``f`` must be elementwise or at least
    keep each tile's shape and not mix columns). Concrete indices out of range raise; traced ones
    are clamped to the last block, as ``jnp.take(..., mode="clip")``. ``block_rows`` defaults to
    the dtype's sublane tile. ``x`` is replicated on every device and the indices are split over
    the devices.
    """
    t = current_target()
    core_mesh = mesh if mesh is not None else target_mesh()
    chip = t.chip
    shards = device_shards()
    rows, cols = check_2d("x", x, chip)
    br = block_rows or tile_shape(x.dtype, chip)[0]
    check_tiled("x", (rows, cols), x.dtype, chip)
    if br % tile_shape(x.dtype, chip)[0] or rows % br:
        raise LayoutError(
            f"block_rows={br} does not tile x of {rows} rows",
            rule=f"block_rows is a multiple of {tile_shape(x.dtype, chip)[0]} dividing the rows",
            chip=chip.name,
            fix="pick block_rows that divides x.shape[0] in whole tiles",
        )
    nblocks = rows // br
    n = check_index_vector("indices", indices, chip, rule="one block index per output block")
    if n % shards:
        raise LayoutError(
            f"{n} indices do not split over {shards} devices",
            rule="each device gathers the same number of blocks",
            chip=chip.name,
            fix=f"pad the indices to a multiple of {shards}",
        )
    if n == 0:  # as jnp.take: no indices, no rows (and no kernel: its grid would be empty)
        return jnp.zeros((0, cols), x.dtype)
    local_n = n // shards
    check_fits(local_n * 4, chip, "smem", what="the prefetched index vector")
    check_in_range(
        "indices",
        indices,
        nblocks,
        chip,
        rule=f"x has {nblocks} blocks of {br} rows",
        fix="fix the indices; an out-of-range block index would read another block",
    )
    moved = local_n * br * cols * x.dtype.itemsize
    cost = CostEstimate(flops=0, bytes_accessed=2 * moved + local_n * 4)
    if f is not None:
        body = _mapped_body(f, nblocks, br, local_n, cols, x.dtype, core_mesh)
        scratch: list[Any] = [pltpu.SMEM((local_n,), jnp.int32)]
    else:
        window = max(1, min(IN_FLIGHT, local_n // core_mesh.cores))
        body = _body(nblocks, br, local_n, window, core_mesh)
        scratch = [pltpu.SMEM((local_n,), jnp.int32), pltpu.SemaphoreType.DMA((window,))]

    def per_device(idx_local: jax.Array, x_full: jax.Array) -> jax.Array:
        # int32 indices reach the kernel untouched (it clamps them itself): clamping here makes an
        # XLA fusion whose output may be placed in VMEM, and libtpu's static profiler rejects the
        # VMEM->SMEM DMA that then fetches it ("Unsupported DMA direction" on v5e).
        if idx_local.dtype != jnp.int32:
            idx_local = jnp.clip(idx_local, 0, nblocks - 1).astype(jnp.int32)
        kern = kernel(
            body,
            mesh=core_mesh,
            out_type=jax.ShapeDtypeStruct((local_n * br, cols), x.dtype),
            scratch=scratch,
            name="coremesh_gather_blocks" if f is None else "coremesh_gather_map_blocks",
            cost_estimate=cost,
        )
        return kern(idx_local, x_full)

    return on_devices(
        per_device, in_specs=(P("device"), P(None, None)), out_specs=P("device", None)
    )(indices, x)


def gather_blocks_reference(
    x: jax.Array,
    indices: jax.Array,
    *,
    block_rows: int | None = None,
    f: Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
    """The XLA meaning of :func:`gather_blocks`: ``jnp.take(..., mode="clip")`` of blocks of
    ``block_rows`` rows (default: the dtype's sublane tile on the active target's chip), then
    ``f`` on the whole result (the kernel applies it tile by tile; an elementwise ``f`` agrees)."""
    br = block_rows or tile_shape(x.dtype, current_target().chip)[0]
    cols = x.shape[1]
    blocks = jnp.take(x.reshape(-1, br, cols), jnp.asarray(indices), axis=0, mode="clip")
    out = blocks.reshape(-1, cols)
    return out if f is None else f(out)


def _clipped(index: Any, nblocks: int) -> Any:
    """A block index read from SMEM, clamped into range as ``jnp.take(..., mode="clip")`` does."""
    return jnp.minimum(jnp.maximum(index, 0), nblocks - 1)


def _body(nblocks: int, br: int, local_n: int, window: int, core_mesh: TensorCoreMesh) -> Any:
    """Kernel body: this core's share of blocks with ``window`` DMAs in flight, one slot each.

    Slot ``s`` carries blocks ``s, s + window, ...`` of the share, so each start first waits for
    the block ``window`` before it. Every wait names its slot with a Python int: libtpu's static
    profiler aborts on TPU7x ("No DMA issue node found for sync flag") when a loop waits on a slot
    computed from the loop index.
    """
    per = local_n // core_mesh.cores  # every core's static share; the first few get one more

    def body(idx_hbm: Any, x_hbm: Any, o_hbm: Any, idx_smem: Any, sems: Any) -> None:
        pltpu.sync_copy(idx_hbm, idx_smem)
        core = jax.lax.axis_index(core_mesh.axis_name)
        start, size = core_share(local_n, core_mesh.cores, core)

        def block(i: Any, slot: int) -> Any:
            src = _clipped(idx_smem[i], nblocks)
            return pltpu.make_async_copy(
                x_hbm.at[pl.ds(pl.multiple_of(src * br, br), br)],
                o_hbm.at[pl.ds(pl.multiple_of(i * br, br), br)],
                sems.at[slot],
            )

        def wait(slot: int) -> None:  # a wait needs only the slot and the block's size
            pltpu.make_async_copy(
                x_hbm.at[pl.ds(0, br)], o_hbm.at[pl.ds(0, br)], sems.at[slot]
            ).wait()

        live = min(window, per)
        for s in range(live):
            block(start + s, s).start()
        rounds, tail = divmod(per - live, window)

        def one_round(r: Any, carry: int) -> int:
            first = start + live + r * window
            for s in range(window):
                wait(s)
                block(first + s, s).start()
            return carry

        if rounds:
            jax.lax.fori_loop(0, rounds, one_round, 0)
        for s in range(tail):
            wait(s)
            block(start + per - tail + s, s).start()
        for s in range(live):
            wait(s)

        @pl.when(size > per)
        def _extra() -> None:  # local_n % cores leaves one more block on the first cores
            last = block(start + per, 0)
            last.start()
            last.wait()

    return body


def _mapped_body(
    f: Callable[[jax.Array], jax.Array],
    nblocks: int,
    br: int,
    local_n: int,
    cols: int,
    dtype: Any,
    core_mesh: TensorCoreMesh,
) -> Any:
    """Kernel body for ``f``: a pipeline whose input block index is read from the SMEM indices."""
    _, bc = choose_block(br, cols, dtype, chip=core_mesh.chip, operands=2)

    def body(idx_hbm: Any, x_hbm: Any, o_hbm: Any, idx_smem: Any) -> None:
        pltpu.sync_copy(idx_hbm, idx_smem)

        def source(i: Any, j: Any) -> tuple[Any, Any]:
            return _clipped(idx_smem[i], nblocks), j

        def apply(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = f(x_ref[...]).astype(o_ref.dtype)

        pipeline(
            apply,
            grid=(local_n, cols // bc),
            in_specs=[pl.BlockSpec((br, bc), source)],
            out_specs=[pl.BlockSpec((br, bc), lambda i, j: (i, j))],
            split=Parallel(core_mesh.axis_name, 0),
        )(x_hbm, o_hbm)

    return body
