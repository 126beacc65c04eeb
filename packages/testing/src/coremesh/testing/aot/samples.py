"""Small Pallas TPU programs: good ones, and reproducers for the compiler's error catalogue.

Each factory returns a ``FunctionProgram`` sharded over the ``"device"`` axis; the core mesh is
built inside ``build`` so it follows the chip being compiled for. ``BAD`` holds one reproducer per
rejection ``coremesh.testing.aot.diagnose`` explains (see research/AOT_COMPILE.md); run them with
``coremesh check coremesh.testing.aot.samples:BAD --no-validate`` to see each compiler message and
coremesh's reading of it, or without ``--no-validate`` to see coremesh refuse them first.

=======================  ========================================================================
reproducer               what the compiler says, and where
=======================  ========================================================================
vmem_48mib               E1001 scoped VMEM OOM (v5e, v5p: 16 MiB limit; v6e, TPU7x: 32 MiB);
                         v4: allocation would exceed its 16 MiB VMEM
vmem_100mib_limit120     allocation would exceed the physical VMEM (v5p, TPU7x: 64 MiB)
add_one_4x100            block offsets not aligned to the (8, 128) tiles (every chip)
add_one_8x64             DMA runs not a multiple of 512 bytes (v4, v5e); 4096-bit word
                         alignment (TPU7x); compiles on v5p and v6e
matmul_int8/_int4/...    E2001 unsupported matmul operand type (v4)
reads_memory_space       (not in BAD: jax 0.10 compiles it) ref.memory_space refused from
                         jax 0.11, every chip
sc_scratch_1024kib       E3000 SparseCore allocation failure (v5p, v6e, TPU7x)
=======================  ========================================================================
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core import jax_compat
from coremesh.testing.aot import Arg, FunctionProgram

P = jax.P
ROWS = P("device", None)


def _shard(mesh: Any, fn: Any, in_specs: Any = (ROWS,), out_specs: Any = ROWS) -> Any:
    return jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    )


def add_one(
    block: tuple[int, int] = (8, 128),
    rows: int = 1024,
    cols: int = 1024,
    dtype: Any = jnp.float32,
    name: str | None = None,
) -> FunctionProgram:
    """x + 1 through ``emit_pipeline``, grid rows split over the TensorCores (PARALLEL)."""

    def body(x_vmem: Any, o_vmem: Any) -> None:
        o_vmem[...] = x_vmem[...] + 1

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        spec = pl.BlockSpec(block_shape=block, index_map=lambda i, j: (i, j))
        pltpu.emit_pipeline(
            body,
            grid=(x_hbm.shape[0] // block[0], x_hbm.shape[1] // block[1]),
            in_specs=[spec],
            out_specs=[spec],
            core_axis_name="core",
            dimension_semantics=(pltpu.PARALLEL, pltpu.ARBITRARY),
        )(x_hbm, o_hbm)

    def build(mesh: Any) -> Any:
        tc_mesh = jax_compat.tensorcore_mesh("core")
        return _shard(mesh, lambda x: pl.kernel(kernel, out_type=x, mesh=tc_mesh)(x))

    return FunctionProgram(
        name=name or f"add_one_{block[0]}x{block[1]}",
        builder=build,
        args=lambda n: [Arg((rows * n, cols), dtype, ROWS)],
        xla_reference=xla_add_one(rows, cols, dtype),
    )


def xla_add_one(rows: int = 1024, cols: int = 1024, dtype: Any = jnp.float32) -> FunctionProgram:
    """The same computation in plain jax.numpy: what XLA makes of it."""
    return FunctionProgram(
        name="add_one_xla",
        builder=lambda mesh: _shard(mesh, lambda x: x + 1),
        args=lambda n: [Arg((rows * n, cols), dtype, ROWS)],
    )


def vmem_scratch(mib: int, vmem_limit_mib: int | None = None) -> FunctionProgram:
    """A kernel holding ``mib`` MiB of f32 VMEM scratch (8 rows copied in, +1, out)."""
    rows = mib * 1024 * 1024 // (4 * 1024)

    def kernel(x_hbm: Any, o_hbm: Any, big: Any, sem: Any) -> None:
        pltpu.async_copy(x_hbm.at[pl.ds(0, 8)], big.at[pl.ds(0, 8)], sem).wait()
        big[pl.ds(8, 8)] = big[pl.ds(0, 8)] + 1
        pltpu.async_copy(big.at[pl.ds(8, 8)], o_hbm.at[pl.ds(0, 8)], sem).wait()

    def build(mesh: Any) -> Any:
        tc_mesh = jax_compat.tensorcore_mesh("core")
        params = (
            pltpu.CompilerParams(vmem_limit_bytes=vmem_limit_mib * 1024 * 1024)
            if vmem_limit_mib
            else None
        )
        scratch = [pltpu.VMEM((rows, 1024), jnp.float32), pltpu.SemaphoreType.DMA]
        return _shard(
            mesh,
            lambda x: pl.kernel(
                kernel, out_type=x, mesh=tc_mesh, scratch_types=scratch, compiler_params=params
            )(x),
        )

    limit = f"_limit{vmem_limit_mib}" if vmem_limit_mib else ""
    return FunctionProgram(
        name=f"vmem_{mib}mib{limit}",
        builder=build,
        args=lambda n: [Arg((64 * n, 1024), jnp.float32, ROWS)],
    )


def copy(dtype: Any, rows: int = 32, cols: int = 256) -> FunctionProgram:
    """A kernel that only copies its ``dtype`` operand HBM to HBM."""

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        pltpu.sync_copy(x_hbm, o_hbm)

    def build(mesh: Any) -> Any:
        tc_mesh = jax_compat.tensorcore_mesh("core", num_cores=1)
        return _shard(mesh, lambda x: pl.kernel(kernel, out_type=x, mesh=tc_mesh)(x))

    return FunctionProgram(
        name=f"copy_{jnp.dtype(dtype).name}",
        builder=build,
        args=lambda n: [Arg((rows * n, cols), dtype, ROWS)],
    )


def reads_memory_space() -> FunctionProgram:
    """A copy kernel that asks its operand ref for ``.memory_space`` while tracing, as code written
    for jax 0.10 does (``getattr(ref, "memory_space", "")``); jax 0.11 and later refuse."""

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        if "vmem" in str(getattr(x_hbm, "memory_space", "")).lower():
            raise AssertionError("the operand is in HBM")  # pragma: no cover
        pltpu.sync_copy(x_hbm, o_hbm)

    def build(mesh: Any) -> Any:
        tc_mesh = jax_compat.tensorcore_mesh("core", num_cores=1)
        return _shard(mesh, lambda x: pl.kernel(kernel, out_type=x, mesh=tc_mesh)(x))

    return FunctionProgram(
        name="reads_memory_space",
        builder=build,
        args=lambda n: [Arg((32 * n, 256), jnp.float32, ROWS)],
    )


def matmul(dtype: Any, acc: Any = jnp.float32, size: int = 256) -> FunctionProgram:
    """A whole-array pallas_call matmul of ``dtype`` operands."""

    def kernel(a_ref: Any, b_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=acc)

    def build(mesh: Any) -> Any:
        def per_device(a: Any, b: Any) -> Any:
            out = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), acc)
            return pl.pallas_call(kernel, out_shape=out)(a, b)

        return _shard(mesh, per_device, in_specs=(ROWS, P()))

    return FunctionProgram(
        name=f"matmul_{jnp.dtype(dtype).name}",
        builder=build,
        args=lambda n: [Arg((size * n, size), dtype, ROWS), Arg((size, size), dtype, P())],
    )


def sc_add_one(reg_shape: tuple[int, int] = (4, 16), rows: int = 4096) -> FunctionProgram:
    """The guide's SparseCore x + 1: rows split over every vector subcore, register-sized ops."""

    def build(mesh: Any) -> Any:
        sc = pltpu.get_tpu_info().sparse_core
        sc_mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=sc.num_cores
        )

        def body(x_vmem: Any, o_vmem: Any) -> None:
            @pl.loop(0, x_vmem.shape[0], step=reg_shape[0])
            def _(r: Any) -> None:
                @pl.loop(0, x_vmem.shape[1], step=reg_shape[1])
                def _(c: Any) -> None:
                    s = (pl.ds(r, reg_shape[0]), pl.ds(c, reg_shape[1]))
                    o_vmem[s] = x_vmem[s] + 1

        def kernel(x_hbm: Any, o_hbm: Any) -> None:
            worker = jax.lax.axis_index("core") * sc.num_subcores + jax.lax.axis_index("subcore")
            share = x_hbm.shape[0] // (sc.num_cores * sc.num_subcores)

            def index_map(i: Any, j: Any) -> Any:
                return (pl.ds(pl.multiple_of(worker * share + i * 8, 8), 8), j)

            spec = pl.BlockSpec(block_shape=(pl.BoundedSlice(8), 128), index_map=index_map)
            pltpu.emit_pipeline(
                body, grid=(share // 8, x_hbm.shape[1] // 128), in_specs=[spec], out_specs=[spec]
            )(x_hbm, o_hbm)

        return _shard(mesh, lambda x: pl.kernel(kernel, out_type=x, mesh=sc_mesh)(x))

    return FunctionProgram(
        name=f"sc_add_one_{reg_shape[0]}x{reg_shape[1]}",
        builder=build,
        args=lambda n: [Arg((rows * n, 128), jnp.int32, ROWS)],
        uses_sparsecore=True,
    )


def sc_scratch(rows: int) -> FunctionProgram:
    """A SparseCore kernel with ``rows`` x 128 int32 of VMEM scratch per vector subcore."""

    def build(mesh: Any) -> Any:
        sc = pltpu.get_tpu_info().sparse_core
        sc_mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=sc.num_cores
        )

        def kernel(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
            worker = jax.lax.axis_index("core") * sc.num_subcores + jax.lax.axis_index("subcore")
            rows_of = pl.ds(pl.multiple_of(worker * 8, 8), 8)
            pltpu.sync_copy(x_hbm.at[rows_of], buf.at[pl.ds(0, 8)])

            @pl.loop(0, 128, step=16)
            def _(c: Any) -> None:
                buf[pl.ds(0, 4), pl.ds(c, 16)] = buf[pl.ds(0, 4), pl.ds(c, 16)] + 1

            pltpu.sync_copy(buf.at[pl.ds(0, 8)], o_hbm.at[rows_of])

        scratch = [pltpu.VMEM((rows, 128), jnp.int32)]
        return _shard(
            mesh, lambda x: pl.kernel(kernel, out_type=x, mesh=sc_mesh, scratch_types=scratch)(x)
        )

    def args(n: int) -> list[Arg]:
        # 8 rows for each of up to 4 SparseCores x 16 subcores per device.
        return [Arg((8 * 64 * n, 128), jnp.int32, ROWS)]

    return FunctionProgram(
        name=f"sc_scratch_{rows * 128 * 4 // 1024}kib",
        builder=build,
        args=args,
        uses_sparsecore=True,
    )


def sc_indexed_gather(dtype: Any = jnp.float32, cols: int = 128) -> FunctionProgram:
    """Every vector subcore gathers 8 rows of a replicated table by one indexed DMA
    (``table.at[idx_ref]``), the SparseCore's indirect stream."""

    def build(mesh: Any) -> Any:
        sc = pltpu.get_tpu_info().sparse_core
        sc_mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=sc.num_cores
        )

        def kernel(t_hbm: Any, i_hbm: Any, o_hbm: Any, idx: Any, rows: Any) -> None:
            worker = jax.lax.axis_index("core") * sc.num_subcores + jax.lax.axis_index("subcore")
            mine = pl.ds(pl.multiple_of(worker * 8, 8), 8)
            pltpu.sync_copy(i_hbm.at[mine], idx)
            pltpu.sync_copy(t_hbm.at[idx], rows)
            pltpu.sync_copy(rows, o_hbm.at[mine])

        def gather(t: Any, i: Any) -> Any:
            out = jax.ShapeDtypeStruct((i.shape[0], cols), dtype)
            scratch = [pltpu.VMEM((8,), jnp.int32), pltpu.VMEM((8, cols), dtype)]
            return pl.kernel(kernel, out_type=out, mesh=sc_mesh, scratch_types=scratch)(t, i)

        return _shard(mesh, gather, in_specs=(P(), P("device")))

    def args(n: int) -> list[Arg]:
        # 8 indices for each of up to 4 SparseCores x 16 subcores per device.
        return [Arg((1024, cols), dtype), Arg((8 * 64 * n,), jnp.int32, P("device"))]

    return FunctionProgram(
        name=f"sc_indexed_gather_{jnp.dtype(dtype).name}_{cols}",
        builder=build,
        args=args,
        uses_sparsecore=True,
    )


ADD_ONE = add_one()
ADD_ONE_BIG_BLOCKS = add_one(block=(256, 512))
SC_ADD_ONE = sc_add_one()
VMEM_48_MIB = vmem_scratch(48)

#: Programs that compile on every chip that has what they need.
GOOD = {p.name: p for p in (ADD_ONE, ADD_ONE_BIG_BLOCKS, SC_ADD_ONE, sc_indexed_gather())}

#: One reproducer per catalogued compiler rejection.
BAD = {
    p.name: p
    for p in (
        VMEM_48_MIB,
        vmem_scratch(100, vmem_limit_mib=120),
        add_one(block=(4, 100), cols=1000),
        add_one(block=(8, 64)),
        matmul(jnp.int8, jnp.int32),
        matmul(jnp.float8_e4m3fn),
        matmul(jnp.int4, jnp.int32),
        sc_scratch(2048),
        sc_indexed_gather(jnp.bfloat16, 256),
        sc_indexed_gather(jnp.float32, 64),
    )
}
