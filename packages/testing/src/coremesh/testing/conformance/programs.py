"""Small per-core programs the TensorCore suites run and compile, each with a numpy reference.

Every builder takes the backend's pieces (a mesh factory, a pipeline factory) and the device mesh,
and returns a jitted function over arrays; the reference is computed independently in numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import coremesh.core as cc

MeshFactory = Callable[[], cc.CoreMesh]
PipelineFactory = Callable[..., Callable[..., None]]

ROWS_PER_CORE = 8
LANES = 128


def _per_device(fn: Callable[..., Any], device_mesh: Any, n_in: int) -> Callable[..., Any]:
    spec = P("device", None)
    jitted: Callable[..., Any] = jax.jit(
        jax.shard_map(
            fn, mesh=device_mesh, in_specs=(spec,) * n_in, out_specs=spec, check_vma=False
        )
    )
    return jitted


def core_ids(make_mesh: MeshFactory, device_mesh: Any) -> Callable[[jax.Array], jax.Array]:
    """Each core writes ``core index + 1`` into its own 8-row block of the output."""

    def body(_x_hbm: Any, o_hbm: Any, buf: Any) -> None:
        core = jax.lax.axis_index("core")
        buf[...] = jnp.full(buf.shape, core + 1, jnp.int32)
        pltpu.sync_copy(buf, o_hbm.at[pl.ds(core * ROWS_PER_CORE, ROWS_PER_CORE)])

    def local(x: jax.Array) -> jax.Array:
        m = make_mesh()
        k = cc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, jnp.int32),
            mesh=m,
            scratch=[pltpu.VMEM((ROWS_PER_CORE, LANES), jnp.int32)],
        )
        return k(x)

    return _per_device(local, device_mesh, 1)


def core_ids_expected(num_devices: int, cores: int) -> np.ndarray:
    one = np.repeat(np.arange(1, cores + 1, dtype=np.int32), ROWS_PER_CORE)
    return np.tile(np.broadcast_to(one[:, None], (cores * ROWS_PER_CORE, LANES)), (num_devices, 1))


def scratch_kernel(make_mesh: MeshFactory, device_mesh: Any) -> Callable[[jax.Array], jax.Array]:
    """HBM -> VMEM by DMA and semaphore, a scalar through SMEM, VMEM -> HBM: ``x * 3 + core``."""

    def body(x_hbm: Any, o_hbm: Any, vmem: Any, smem: Any, sem: Any) -> None:
        core = jax.lax.axis_index("core")
        rows = pl.ds(core * ROWS_PER_CORE, ROWS_PER_CORE)
        pltpu.async_copy(x_hbm.at[rows], vmem, sem).wait()
        smem[0] = core
        vmem[...] = vmem[...] * 3 + smem[0].astype(vmem.dtype)
        pltpu.async_copy(vmem, o_hbm.at[rows], sem).wait()

    def local(x: jax.Array) -> jax.Array:
        k = cc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=make_mesh(),
            scratch=[
                pltpu.VMEM((ROWS_PER_CORE, x.shape[1]), x.dtype),
                pltpu.SMEM((1,), jnp.int32),
                pltpu.SemaphoreType.DMA,
            ],
        )
        return k(x)

    return _per_device(local, device_mesh, 1)


def scratch_expected(x: np.ndarray, num_devices: int, cores: int) -> np.ndarray:
    core = np.repeat(np.arange(cores), ROWS_PER_CORE)
    return np.asarray(x * 3 + np.tile(core, num_devices)[:, None].astype(x.dtype))


def swap(make_mesh: MeshFactory, device_mesh: Any, collective_id: int) -> Callable[..., Any]:
    """The core_map guide's swap: each core doubles its column slice and sends it to the next."""

    def body(
        in_hbm: Any,
        out_hbm: Any,
        in_vmem: Any,
        scratch: Any,
        out_vmem: Any,
        sem: Any,
        send_sem: Any,
        recv_sem: Any,
    ) -> None:
        core = jax.lax.axis_index("core")
        cores = jax.lax.axis_size("core")
        width = in_hbm.shape[-1] // cores
        cols = pl.ds(core * width, width)
        pltpu.async_copy(in_hbm.at[:, cols], in_vmem, sem).wait()
        dst = (core + 1) % cores
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id={"core": dst})
        pl.semaphore_wait(barrier, 1)
        copy = pltpu.make_async_remote_copy(
            in_vmem, scratch, send_sem, recv_sem, device_id={"core": dst}
        )
        copy.start()
        copy.wait()
        out_vmem[...] = scratch[...] * 2
        pltpu.async_copy(out_vmem, out_hbm.at[:, cols], sem).wait()

    def local(x: jax.Array) -> jax.Array:
        m = make_mesh()
        cores = cc.num_cores(m)
        block = pltpu.VMEM((x.shape[0], x.shape[1] // cores), x.dtype)
        k = cc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=m,
            scratch=[block, block, block, *([pltpu.SemaphoreType.DMA] * 3)],
            collective_id=collective_id,
        )
        return k(x)

    return _per_device(local, device_mesh, 1)


def swap_expected(x: np.ndarray, cores: int) -> np.ndarray:
    out = np.empty_like(x)
    width = x.shape[1] // cores
    for c in range(cores):
        src = (c - 1) % cores
        out[:, c * width : (c + 1) * width] = x[:, src * width : (src + 1) * width] * 2
    return out


def block_owner(
    make_mesh: MeshFactory,
    make_pipeline: PipelineFactory,
    device_mesh: Any,
    split: cc.Parallel | cc.Manual,
    grid_rows: int,
) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
    """``x + 1`` through a pipeline, plus which core computed each (8, 128) block."""
    spec = pl.BlockSpec((ROWS_PER_CORE, LANES), lambda i, j: (i, j))

    def block(x_ref: Any, y_ref: Any, owner_ref: Any) -> None:
        y_ref[...] = x_ref[...] + 1
        owner_ref[...] = jnp.full(owner_ref.shape, jax.lax.axis_index("core"), jnp.int32)

    def body(x_hbm: Any, y_hbm: Any, owner_hbm: Any) -> None:
        make_pipeline(
            block,
            grid=(grid_rows, x_hbm.shape[1] // LANES),
            in_specs=[spec],
            out_specs=[spec, spec],
            split=split,
        )(x_hbm, y_hbm, owner_hbm)

    def local(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        k = cc.kernel(
            body,
            out_type=(
                jax.ShapeDtypeStruct(x.shape, x.dtype),
                jax.ShapeDtypeStruct(x.shape, jnp.int32),
            ),
            mesh=make_mesh(),
        )
        y, owner = k(x)
        return y, owner

    spec_rows = P("device", None)
    jitted: Callable[[jax.Array], tuple[jax.Array, jax.Array]] = jax.jit(
        jax.shard_map(
            local,
            mesh=device_mesh,
            in_specs=(spec_rows,),
            out_specs=(spec_rows, spec_rows),
            check_vma=False,
        )
    )
    return jitted


def prefetched_window(
    make_mesh: MeshFactory, make_pipeline: PipelineFactory, device_mesh: Any, out_cols: int
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The guide's scalar prefetch: an SMEM offset chosen at run time picks the input columns."""
    spec_out = pl.BlockSpec((ROWS_PER_CORE, LANES), lambda i, j: (i, j))

    def body(in_refs: Any, o_hbm: Any, off_smem: Any) -> None:
        x_hbm, off_hbm = in_refs
        pltpu.sync_copy(off_hbm, off_smem)
        spec_in = pl.BlockSpec((ROWS_PER_CORE, LANES), lambda i, j: (i, off_smem[0] // LANES + j))

        def add_one(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...] + 1

        make_pipeline(
            add_one,
            grid=(x_hbm.shape[0] // ROWS_PER_CORE, out_cols // LANES),
            in_specs=[spec_in],
            out_specs=[spec_out],
            split=cc.Parallel("core", 0),
        )(x_hbm, o_hbm)

    def local(x: jax.Array, off: jax.Array) -> jax.Array:
        k = cc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((x.shape[0], out_cols), x.dtype),
            mesh=make_mesh(),
            scratch=[pltpu.SMEM((1,), jnp.int32)],
        )
        return k((x, off))

    jitted: Callable[[jax.Array, jax.Array], jax.Array] = jax.jit(
        jax.shard_map(
            local,
            mesh=device_mesh,
            in_specs=(P("device", None), P()),
            out_specs=P("device", None),
            check_vma=False,
        )
    )
    return jitted
