"""``gather_blocks``: blocks of rows chosen by a scalar-prefetched index vector.

The core_map guide's dynamic block index pattern: the indices are copied into SMEM before the
pipeline starts and the input's index map reads them, so each step DMAs exactly the block it
needs. Output blocks are split across cores (PARALLEL on the index axis).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
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
from coremesh.core.sharding import device_shards, on_devices
from coremesh.tensorcore.blocks import choose_block
from coremesh.tensorcore.kernel import kernel
from coremesh.tensorcore.mesh import TensorCoreMesh
from coremesh.tensorcore.mesh import mesh as target_mesh
from coremesh.tensorcore.pipeline import pipeline
from coremesh.tensorcore.validate import check_2d, check_tiled


def gather_blocks(
    x: jax.Array,
    indices: jax.Array,
    *,
    block_rows: int | None = None,
    mesh: TensorCoreMesh | None = None,
) -> jax.Array:
    """Rows ``x[indices[i] * block_rows : (indices[i] + 1) * block_rows]`` for every ``i``.

    Equal to ``x.reshape(-1, block_rows, C)[indices].reshape(-1, C)``. Concrete indices out of
    range raise; traced ones are clamped to the last block, as ``jnp.take(..., mode="clip")``.
    ``block_rows`` defaults to the dtype's sublane tile. ``x`` is replicated on every device and
    the indices are split over the devices.
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
    idx_shape = tuple(getattr(indices, "shape", ()))
    if len(idx_shape) != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise LayoutError(
            f"indices must be a 1-D integer vector, got {indices.dtype}{list(idx_shape)}",
            rule="one block index per output block",
            chip=chip.name,
            fix="pass a 1-D int32 array",
        )
    n = idx_shape[0]
    if n % shards:
        raise LayoutError(
            f"{n} indices do not split over {shards} devices",
            rule="each device gathers the same number of blocks",
            chip=chip.name,
            fix=f"pad the indices to a multiple of {shards}",
        )
    local_n = n // shards
    check_fits(local_n * 4, chip, "smem", what="the prefetched index vector")
    if not isinstance(indices, jax.core.Tracer):
        host = np.asarray(indices)
        bad = np.flatnonzero((host < 0) | (host >= nblocks))
        if bad.size:
            raise LayoutError(
                f"indices[{bad[0]}] = {host[bad[0]]} is outside 0..{nblocks - 1}",
                rule=f"x has {nblocks} blocks of {br} rows",
                chip=chip.name,
                fix="fix the indices; an out-of-range block index would read another block",
            )
    _, bc = choose_block(br, cols, x.dtype, chip=chip, operands=2)

    def body(idx_hbm: Any, x_hbm: Any, o_hbm: Any, idx_smem: Any) -> None:
        pltpu.sync_copy(idx_hbm, idx_smem)

        def copy_block(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...]

        pipeline(
            copy_block,
            grid=(local_n, cols // bc),
            in_specs=[pl.BlockSpec((br, bc), lambda i, j: (idx_smem[i], j))],
            out_specs=[pl.BlockSpec((br, bc), lambda i, j: (i, j))],
            split=Parallel("core", 0),
        )(x_hbm, o_hbm)

    moved = local_n * br * cols * x.dtype.itemsize
    cost = CostEstimate(flops=0, bytes_accessed=2 * moved + local_n * 4)

    def per_device(idx_local: jax.Array, x_full: jax.Array) -> jax.Array:
        clipped = jnp.clip(idx_local.astype(jnp.int32), 0, nblocks - 1)
        kern = kernel(
            body,
            mesh=core_mesh,
            out_type=jax.ShapeDtypeStruct((local_n * br, cols), x.dtype),
            scratch=[pltpu.SMEM((local_n,), jnp.int32)],
            name="coremesh_gather_blocks",
            cost_estimate=cost,
        )
        return kern(clipped, x_full)

    return on_devices(
        per_device, in_specs=(P("device"), P(None, None)), out_specs=P("device", None)
    )(indices, x)
