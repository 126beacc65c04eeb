"""``matmul``: MXU matmul with f32 accumulation, output rows split across cores.

Two plans. When ``b`` fits in VMEM it is loaded once (several DMAs at once, overlapping the
first row fetch) and rows of ``a`` and of the result stream through a pipeline in sub-blocks,
each step contracting all of K: every operand crosses HBM once. Otherwise a blocked (M, N, K)
pipeline accumulates over K in float32.
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
    Manual,
    Parallel,
    check_matmul_dtypes,
    current_target,
)
from coremesh.core.sharding import device_shards, on_devices
from coremesh.tensorcore.block_sizes import ResidentPlan, choose_matmul_blocks, choose_resident_plan
from coremesh.tensorcore.kernel import kernel
from coremesh.tensorcore.mesh import TensorCoreMesh
from coremesh.tensorcore.mesh import mesh as target_mesh
from coremesh.tensorcore.pipeline import pipeline, sub_blocks
from coremesh.tensorcore.validate import check_2d, check_tiled


def matmul(
    a: jax.Array,
    b: jax.Array,
    *,
    out_dtype: Any = jnp.float32,
    blocks: tuple[int, int, int] | None = None,
    vmem_limit_bytes: int | None = None,
    mesh: TensorCoreMesh | None = None,
) -> jax.Array:
    """``a @ b`` accumulated in float32, equal to ``jnp.matmul(a, b,
    preferred_element_type=float32).astype(out_dtype)``.

    Rows of ``a`` (and of the result) are split over the target's devices and, inside a device,
    over its TensorCores (PARALLEL on the M axis); ``b`` is replicated. ``blocks=(bm, bk, bn)``
    forces the blocked plan with those blocks; by default ``b`` stays resident in VMEM when it
    fits (``choose_resident_plan``). ``vmem_limit_bytes`` overrides the kernel's scoped VMEM
    limit (by default raised only when the resident plan needs more than the chip's default).
    """
    t = current_target()
    core_mesh = mesh if mesh is not None else target_mesh()
    chip = t.chip
    shards = device_shards()
    m, k = check_2d("a", a, chip)
    k2, n = check_2d("b", b, chip)
    if k != k2:
        raise LayoutError(
            f"a is ({m}, {k}) and b is ({k2}, {n}): inner dims differ",
            rule="matmul needs a.shape[1] == b.shape[0]",
            chip=chip.name,
            fix="transpose or slice the operands so the contracting dims match",
        )
    check_matmul_dtypes(a.dtype, b.dtype, chip)
    check_tiled("a", (m, k), a.dtype, chip, rows_over=shards)
    check_tiled("b", (k, n), b.dtype, chip)
    local_m = m // shards
    plan = (
        None
        if blocks
        else choose_resident_plan(
            local_m, k, n, a.dtype, out_dtype, chip=chip, cores=core_mesh.cores
        )
    )
    if plan is not None:
        per_device = _resident(
            plan, core_mesh, local_m, k, n, a.dtype, b.dtype, out_dtype, vmem_limit_bytes
        )
    else:
        per_device = _blocked(
            blocks, core_mesh, local_m, k, n, a.dtype, b.dtype, out_dtype, vmem_limit_bytes
        )
    return on_devices(
        per_device, in_specs=(P("device", None), P(None, None)), out_specs=P("device", None)
    )(a, b)


def matmul_reference(a: jax.Array, b: jax.Array, *, out_dtype: Any = jnp.float32) -> jax.Array:
    """The XLA meaning of :func:`matmul`: ``a @ b`` accumulated in float32, cast to
    ``out_dtype``."""
    return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(out_dtype)


def _blocked(
    blocks: tuple[int, int, int] | None,
    core_mesh: TensorCoreMesh,
    local_m: int,
    k: int,
    n: int,
    a_dtype: Any,
    b_dtype: Any,
    out_dtype: Any,
    vmem_limit_bytes: int | None,
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Per-device kernel for the blocked plan: (M, N, K) blocks, float32 accumulation over K."""
    chip = core_mesh.chip
    bm, bk, bn = blocks or choose_matmul_blocks(
        local_m, k, n, a_dtype, chip=chip, cores=core_mesh.cores
    )
    if local_m % bm or k % bk or n % bn:
        raise LayoutError(
            f"blocks ({bm}, {bk}, {bn}) do not divide ({local_m}, {k}, {n})",
            rule="each of M (per device), K, N is a whole number of blocks",
            chip=chip.name,
            fix="pick blocks that divide the shapes, or leave blocks=None",
        )
    nk = k // bk

    # A float32 output block stays in VMEM across the k steps (its index does not change), so it
    # is its own accumulator; other output dtypes accumulate in a float32 scratch block. With a
    # single k step there is nothing to accumulate.
    direct = nk == 1 or jnp.dtype(out_dtype) == jnp.float32

    def block_body(a_ref: Any, b_ref: Any, o_ref: Any, *scratch: Any) -> None:
        product = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)
        if nk == 1:
            o_ref[...] = product.astype(o_ref.dtype)
            return
        acc_ref = o_ref if direct else scratch[0]
        kk = pl.program_id(2)

        @pl.when(kk == 0)
        def _first() -> None:
            acc_ref[...] = product

        @pl.when(kk > 0)
        def _accumulate() -> None:
            acc_ref[...] += product

        if not direct:

            @pl.when(kk == nk - 1)
            def _store() -> None:
                o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def body(a_hbm: Any, b_hbm: Any, o_hbm: Any, *scratch: Any) -> None:
        pipeline(
            lambda a_ref, b_ref, o_ref: block_body(a_ref, b_ref, o_ref, *scratch),
            grid=(local_m // bm, n // bn, nk),
            in_specs=[
                pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            ],
            out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))],
            split=Parallel(core_mesh.axis_name, 0),
        )(a_hbm, b_hbm, o_hbm)

    out_itemsize = jnp.dtype(out_dtype).itemsize
    cost = CostEstimate(
        flops=2 * local_m * k * n,
        bytes_accessed=local_m * k * jnp.dtype(a_dtype).itemsize
        + (local_m // bm) * k * n * jnp.dtype(b_dtype).itemsize
        + local_m * n * out_itemsize,
    )

    def per_device(a_local: jax.Array, b_full: jax.Array) -> jax.Array:
        kern = kernel(
            body,
            mesh=core_mesh,
            out_type=jax.ShapeDtypeStruct((local_m, n), out_dtype),
            scratch=[] if direct else [pltpu.VMEM((bm, bn), jnp.float32)],
            name="coremesh_matmul",
            cost_estimate=cost,
            compiler_options=(
                {"vmem_limit_bytes": vmem_limit_bytes} if vmem_limit_bytes is not None else {}
            ),
        )
        return kern(a_local, b_full)

    return per_device


def _resident(
    plan: ResidentPlan,
    core_mesh: TensorCoreMesh,
    m: int,
    k: int,
    n: int,
    a_dtype: Any,
    b_dtype: Any,
    out_dtype: Any,
    vmem_limit_bytes: int | None,
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Per-device kernel for ``plan``: ``b`` in VMEM, rows of ``a`` and the output streamed."""
    rows, streams, chunks = plan.rows, plan.streams, plan.rhs_chunks
    chunk = k // chunks

    def body(a_hbm: Any, b_hbm: Any, o_hbm: Any, b_vmem: Any, sems: Any) -> None:
        loads = [
            pltpu.make_async_copy(
                b_hbm.at[pl.ds(c * chunk, chunk)], b_vmem.at[pl.ds(c * chunk, chunk)], sems.at[c]
            )
            for c in range(chunks)
        ]
        for load in loads:
            load.start()

        def step(*refs: Any) -> None:
            # b is waited for inside this core's first step (program_id counts a core's own
            # steps under a Manual split), after that step's rows were fetched, so the two loads
            # overlap. Every core has at least one step: whole row blocks each.
            @pl.when(pl.program_id(0) == 0)
            def _b_ready() -> None:
                for load in loads:
                    load.wait()

            for a_ref, o_ref in zip(refs[:streams], refs[streams:], strict=True):
                o_ref[...] = jnp.dot(
                    a_ref[...], b_vmem[...], preferred_element_type=jnp.float32
                ).astype(o_ref.dtype)

        pipeline(
            step,
            grid=(m // rows,),
            in_specs=sub_blocks(pl.BlockSpec((rows, k), lambda i: (i, 0)), streams),
            out_specs=sub_blocks(pl.BlockSpec((rows, n), lambda i: (i, 0)), streams),
            split=Manual(core_mesh.axis_name, 0),
        )(*[a_hbm] * streams, *[o_hbm] * streams)

    cost = CostEstimate(
        flops=2 * m * k * n,
        bytes_accessed=m * k * jnp.dtype(a_dtype).itemsize
        + core_mesh.cores * k * n * jnp.dtype(b_dtype).itemsize
        + m * n * jnp.dtype(out_dtype).itemsize,
    )
    # Raise the scoped VMEM limit only when the plan needs it, leaving VMEM to XLA otherwise.
    # (Before operands were pinned to HBM, XLA copied them into VMEM too, and libtpu 0.0.52's
    # static profile failed this kernel on TPU7x with a 32 or 40 MiB limit.)
    chip = core_mesh.chip
    wanted = plan.vmem_bytes * 5 // 4
    options = (
        {"vmem_limit_bytes": min(chip.vmem_bytes_per_core, wanted)}
        if wanted > chip.scoped_vmem_default_bytes
        else {}
    )
    if vmem_limit_bytes is not None:
        options = {"vmem_limit_bytes": vmem_limit_bytes}

    def per_device(a_local: jax.Array, b_full: jax.Array) -> jax.Array:
        kern = kernel(
            body,
            mesh=core_mesh,
            out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
            scratch=[pltpu.VMEM((k, n), b_dtype), pltpu.SemaphoreType.DMA((chunks,))],
            name="coremesh_matmul_resident",
            cost_estimate=cost,
            compiler_options=options,
        )
        return kern(a_local, b_full)

    return per_device
