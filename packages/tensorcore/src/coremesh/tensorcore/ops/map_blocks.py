"""``map_blocks``: an elementwise/blockwise function applied tile by tile, split across cores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from coremesh.core import CostEstimate, LayoutError, Parallel, current_target
from coremesh.core.sharding import device_shards, on_devices
from coremesh.tensorcore.block_sizes import choose_block
from coremesh.tensorcore.kernel import kernel
from coremesh.tensorcore.mesh import TensorCoreMesh
from coremesh.tensorcore.mesh import mesh as target_mesh
from coremesh.tensorcore.pipeline import pipeline
from coremesh.tensorcore.validate import check_2d, check_same, check_tiled


def map_blocks(
    f: Callable[..., jax.Array],
    *arrays: jax.Array,
    block: tuple[int, int] | None = None,
    mesh: TensorCoreMesh | None = None,
) -> jax.Array:
    """``f(*arrays)`` computed block by block on the TensorCores.

    ``f`` must be blockwise: applied to same-shaped blocks it gives a block of the same shape
    (elementwise functions always are). Rows are split over the devices of the target and, inside
    a device, over its TensorCores (PARALLEL on the row axis of the pipeline).
    """
    if not arrays:
        raise LayoutError("map_blocks needs at least one array", rule="f takes >= 1 operand")
    t = current_target()
    core_mesh = mesh if mesh is not None else target_mesh()
    chip = t.chip
    shards = device_shards()
    names = [f"arrays[{i}]" for i in range(len(arrays))]
    rows, cols = check_2d(names[0], arrays[0], chip)
    check_same(names, arrays, chip)
    dtype = arrays[0].dtype
    check_tiled(names[0], (rows, cols), dtype, chip, rows_over=shards)
    local_rows = rows // shards
    br, bc = block or choose_block(
        local_rows, cols, dtype, chip=chip, operands=len(arrays) + 1, cores=core_mesh.cores
    )
    if local_rows % br or cols % bc:
        raise LayoutError(
            f"block ({br}, {bc}) does not divide the per-device array ({local_rows}, {cols})",
            rule="every per-device dim is a whole number of blocks",
            chip=chip.name,
            fix="pick a block that divides it, or leave block=None to choose one",
        )
    out_dtype = _check_blockwise(f, len(arrays), (br, bc), dtype, chip.name)
    spec = pl.BlockSpec((br, bc), lambda i, j: (i, j))

    def block_body(*refs: Any) -> None:
        *ins, out = refs
        out[...] = f(*[r[...] for r in ins]).astype(out.dtype)

    def body(*refs: Any) -> None:
        pipeline(
            block_body,
            grid=(local_rows // br, cols // bc),
            in_specs=[spec] * len(arrays),
            out_specs=[spec],
            split=Parallel(core_mesh.axis_name, 0),
        )(*refs)

    size = local_rows * cols
    cost = CostEstimate(
        flops=size,
        bytes_accessed=size * (dtype.itemsize * len(arrays) + out_dtype.itemsize),
    )

    def per_device(*xs: jax.Array) -> jax.Array:
        k = kernel(
            body,
            mesh=core_mesh,
            out_type=jax.ShapeDtypeStruct((local_rows, cols), out_dtype),
            name="coremesh_map_blocks",
            cost_estimate=cost,
        )
        return k(*xs)

    spec_rows = P("device", None)
    return on_devices(per_device, in_specs=(spec_rows,) * len(arrays), out_specs=spec_rows)(*arrays)


_RULE = "map_blocks needs a blockwise f: a block of any shape in, a block of that shape out"
_FIX = (
    "use an elementwise f (no transposes, reductions or reshapes); transpose or reshape the "
    "arrays outside map_blocks"
)


def _check_blockwise(
    f: Callable[..., jax.Array], n: int, block: tuple[int, int], dtype: Any, chip: str
) -> Any:
    """The dtype of ``f``'s blocks, after tracing ``f`` on the block and on a wider probe.

    A square block hides a transpose (``(128, 128)`` in, ``(128, 128)`` out), so ``f`` is also
    traced (shapes only) on ``(br, br + bc)``, which no transpose maps to itself. An ``f`` that
    cannot be traced on the probe depends on the block's shape and is taken on the block alone.
    """

    def traced(shape: tuple[int, int]) -> Any:
        return jax.eval_shape(f, *[jax.ShapeDtypeStruct(shape, dtype)] * n)

    out = traced(block)
    if out.shape != block:
        raise LayoutError(f"f maps {block} blocks to {out.shape}", rule=_RULE, chip=chip, fix=_FIX)
    probe = (block[0], block[0] + block[1])
    try:
        wide = traced(probe)
    except Exception:  # f is written for the block's shape: the block's trace is all there is
        return out.dtype
    if wide.shape != probe:
        raise LayoutError(
            f"f maps a {probe} array to {wide.shape}: it is not blockwise, and keeps the shape "
            f"of the {block} block only because that block is square",
            rule=_RULE,
            chip=chip,
            fix=_FIX,
        )
    return out.dtype


def map_blocks_reference(f: Callable[..., jax.Array], *arrays: jax.Array) -> jax.Array:
    """The XLA meaning of :func:`map_blocks`: ``f`` on the whole arrays (a blockwise ``f`` gives
    the same result on the whole as block by block)."""
    return f(*arrays)
