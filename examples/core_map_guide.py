"""The Pallas core_map guide, run on a CPU as a v5p slice of 4 devices x 2 TensorCores.

This is the guide's code as written, with its own assertions. Two things differ: it runs inside
``coremesh.testing.simulate(...)``, which puts Pallas in TPU interpret mode with the simulator's
fixes, and jax 0.10.2 spells ``pl.kernel``'s ``out_shape``/``scratch_shapes`` as
``out_type``/``scratch_types``.

    python examples/core_map_guide.py

``simulate()`` sets the host CPU device count itself, so nothing else is needed as long as no JAX
operation runs before it is entered.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc
from jax.sharding import NamedSharding

import coremesh.testing

with coremesh.testing.simulate(chip="v5p", devices=4):
    num_devices = jax.local_device_count()
    assert num_devices > 1, "Please run this notebook with more than one device."

    tpu_info = pltpu.get_tpu_info()  # This notebook only runs on TPU.
    print(f"Running on {num_devices} TPU {tpu_info.chip_version} devices.")

    # The device mesh.
    mesh = jax.make_mesh((jax.device_count(),), ("device",))
    print(mesh)

    # The mesh of cores inside a JAX device. The guide writes pltpu.create_tensorcore_mesh("core")
    # and len(tc_mesh.devices), jax 0.10's spelling; jax 0.11 replaced both with TensorCoreMesh.
    if hasattr(pltpu, "TensorCoreMesh"):
        tc_mesh = pltpu.TensorCoreMesh(axis_name="core")
    else:
        tc_mesh = pltpu.create_tensorcore_mesh("core")
    print(tc_mesh)

    num_devices = mesh.size
    num_cores = tc_mesh.shape["core"]
    print(f"There are {num_devices} devices, and {num_cores} cores each.")

    # ---- A simple per-core kernel ------------------------------------------------------------

    # This function runs on every core.
    def swap_cores_kernel(
        in_hbm, out_hbm, in_vmem, scratch_vmem, out_vmem, sem, send_sem, recv_sem
    ):
        core_index = jax.lax.axis_index("core")
        num_cores = jax.lax.axis_size("core")
        slc_size = in_hbm.shape[-1] // num_cores
        slc = pl.ds(core_index * slc_size, slc_size)

        # Copy this core's slice of the input.
        pltpu.async_copy(in_hbm.at[:, slc], in_vmem, sem).wait()

        # Barrier, so that every core has entered run_scoped.
        # Not needed without inter-core communication.
        dst_core = (core_index + 1) % num_cores
        sem0 = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(sem0, 1, device_id={"core": dst_core})
        pl.semaphore_wait(sem0, 1)

        # Swap data between core 0 and core 1.
        the_copy = pltpu.make_async_remote_copy(
            in_vmem,
            scratch_vmem,
            send_sem,
            recv_sem,
            device_id={"core": dst_core},
        )
        the_copy.start()
        the_copy.wait()

        # Core-local compute.
        out_vmem[...] = scratch_vmem[...] * 2

        # Copy the output.
        pltpu.async_copy(out_vmem, out_hbm.at[:, slc], sem).wait()

    input_shape = (32, 256)
    local_vmem_shape = (32 // num_devices, 256 // num_cores)
    in_spec = jax.P("device", None)
    sharding = NamedSharding(mesh, in_spec)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=in_spec, out_specs=in_spec, check_vma=False)
    def swap_cores(x):
        # Buffers for the input and the output.
        x_hbm_ref = jax.new_ref(x)
        o_hbm_ref = jax.new_ref(jax.lax.empty(x.shape, x.dtype))

        @pl.core_map(tc_mesh, compiler_params=pltpu.CompilerParams(collective_id=0))
        def _():
            pl.run_scoped(
                partial(swap_cores_kernel, x_hbm_ref, o_hbm_ref),
                *([pltpu.VMEM(local_vmem_shape, x.dtype)] * 3),  # VMEM allocations
                *([pltpu.SemaphoreType.DMA] * 3),  # semaphores
            )

        return o_hbm_ref[...]

    x = jax.random.normal(jax.random.key(0), input_shape, jnp.float32)
    x = jax.device_put(x, sharding)
    y = swap_cores(x)

    np.testing.assert_array_equal(y[:, 128:], x[:, :128] * 2)
    np.testing.assert_array_equal(y[:, :128], x[:, 128:] * 2)
    print("swap_cores (core_map + run_scoped): OK")

    # ---- Less boilerplate: pl.kernel ---------------------------------------------------------

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=in_spec, out_specs=in_spec, check_vma=False)
    def swap_cores(x):
        scratch_shapes = [pltpu.VMEM(local_vmem_shape, x.dtype)] * 3 + [pltpu.SemaphoreType.DMA] * 3
        return pl.kernel(
            swap_cores_kernel,
            out_type=x,
            mesh=tc_mesh,
            scratch_types=scratch_shapes,
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(x)

    y = swap_cores(x)
    np.testing.assert_array_equal(y[:, 128:], x[:, :128] * 2)
    np.testing.assert_array_equal(y[:, :128], x[:, 128:] * 2)
    print("swap_cores (pl.kernel): OK")

    # ---- Pipelining inside core_map: a PARALLEL split across cores ---------------------------

    def add_one_body(in_vmem, out_vmem):
        out_vmem[...] = in_vmem[...] + 1

    input_shape = (1024, 1024)
    in_spec = jax.P("device", None)

    def add_one_kernel(x_hbm_ref, o_hbm_ref):
        in_shape = x_hbm_ref.shape
        pltpu.emit_pipeline(
            add_one_body,
            grid=(in_shape[0] // 8, in_shape[1] // 128),
            in_specs=[pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i, j))],
            out_specs=[pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i, j))],
            core_axis_name="core",
            dimension_semantics=(pltpu.PARALLEL, pltpu.ARBITRARY),
        )(x_hbm_ref, o_hbm_ref)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=in_spec, out_specs=in_spec, check_vma=False)
    def add_one(x):
        return pl.kernel(add_one_kernel, out_type=x, mesh=tc_mesh, scratch_types=[])(x)

    x = jax.random.normal(jax.random.key(0), input_shape, jnp.float32)
    x = jax.device_put(x, NamedSharding(mesh, in_spec))
    y = add_one(x)

    np.testing.assert_array_equal(y, x + 1)
    print("add_one (emit_pipeline, PARALLEL core split): OK")

    # ---- Scalar prefetch, and a manual split of the work between cores ----------------------

    input_shape = (1024, 1024)
    in_spec = jax.P("device", None)
    output_shape = (1024, 512)

    def indexed_add_one_kernel(in_refs, out_refs, i_smem_ref):
        (x_hbm_ref, i_hbm_ref), o_hbm_ref = in_refs, out_refs
        in_shape = x_hbm_ref.shape
        pltpu.sync_copy(i_hbm_ref, i_smem_ref)

        core_idx = jax.lax.axis_index("core")
        core_slc_size = in_shape[0] // num_cores
        i_map = lambda i: core_idx * core_slc_size // 8 + i  # noqa: E731  split across cores
        j_map = lambda j: i_smem_ref[0] // 128 + j  # noqa: E731  use the prefetched offset

        pltpu.emit_pipeline(
            add_one_body,
            grid=(core_slc_size // 8, output_shape[1] // 128),
            in_specs=[
                pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i_map(i), j_map(j)))
            ],
            out_specs=[pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i_map(i), j))],
        )(x_hbm_ref, o_hbm_ref)

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(in_spec, jax.P()),
        out_specs=in_spec,
        check_vma=False,
    )
    def indexed_add_one(x, index):
        out_shape = jax.ShapeDtypeStruct((x.shape[0], x.shape[1] // 2), x.dtype)
        return pl.kernel(
            indexed_add_one_kernel,
            out_type=out_shape,
            mesh=tc_mesh,
            scratch_types=[pltpu.SMEM((1,), jnp.int32)],
        )((x, index))

    xs = jax.random.normal(jax.random.key(0), input_shape, jnp.float32)
    xs = jax.device_put(xs, NamedSharding(mesh, in_spec))
    idx = 256
    y = indexed_add_one(xs, jnp.array([idx]))

    np.testing.assert_array_equal(y, xs[:, idx : (idx + 512)] + 1)
    print("indexed_add_one (scalar prefetch, manual split): OK")

    # ---- Mapping over SparseCores ------------------------------------------------------------

    sc_info = pltpu.get_tpu_info().sparse_core
    assert sc_info is not None
    print(sc_info)

    sc_mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=sc_info.num_cores
    )
    sc_num_cores = sc_info.num_cores
    sc_num_subcores = sc_info.num_subcores

    input_shape = (4096, 128)
    SC_REG_OP_SHAPE = (4, 16)

    def sc_add_one_body(in_vmem, out_vmem):
        @pl.loop(0, in_vmem.shape[0], step=SC_REG_OP_SHAPE[0])
        def _reg_loop_0(c0):
            @pl.loop(0, in_vmem.shape[1], step=SC_REG_OP_SHAPE[1])
            def _reg_loop_1(c1):
                slc = (pl.ds(c0, SC_REG_OP_SHAPE[0]), pl.ds(c1, SC_REG_OP_SHAPE[1]))
                out_vmem[slc] = in_vmem[slc] + 1

    def sc_add_one_kernel(x_hbm_ref, o_hbm_ref):
        in_shape = x_hbm_ref.shape
        core_idx = jax.lax.axis_index("core")
        subcore_idx = jax.lax.axis_index("subcore")
        cm_idx = core_idx * sc_num_subcores + subcore_idx  # index on the core_map
        slc_size = in_shape[0] // (sc_num_subcores * sc_num_cores)
        index_map = lambda i, j: (  # noqa: E731
            pl.ds(pl.multiple_of(cm_idx * slc_size + i * 8, 8), 8),
            j,
        )

        pltpu.emit_pipeline(
            sc_add_one_body,
            grid=(slc_size // 8, in_shape[1] // 128),
            in_specs=[pl.BlockSpec(block_shape=(pl.BoundedSlice(8), 128), index_map=index_map)],
            out_specs=[pl.BlockSpec(block_shape=(pl.BoundedSlice(8), 128), index_map=index_map)],
        )(x_hbm_ref, o_hbm_ref)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=in_spec, out_specs=in_spec, check_vma=False)
    def sc_add_one(x):
        return pl.kernel(sc_add_one_kernel, out_type=x, mesh=sc_mesh, scratch_types=[])(x)

    x = jax.random.randint(jax.random.key(0), input_shape, 0, 64, jnp.int32)
    x = jax.device_put(x, NamedSharding(mesh, in_spec))
    y = sc_add_one(x)

    np.testing.assert_array_equal(y, x + 1)
    print("sc_add_one (4 SparseCores x 16 vector subcores): OK")

print("All of the guide's programs ran on the simulated v5p slice.")
