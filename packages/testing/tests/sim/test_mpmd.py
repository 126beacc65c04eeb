"""Patch ``mpmd_kernels`` on every supported jax line: a ``pl.kernel`` over a vector-subcore and
a scalar-subcore mesh runs, its bodies at once on the same operands, each mesh-tied semaphore one
per core of its mesh and addressed by ``device_id``; results against numpy. Stock interpret mode
refuses to lower it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.sim import NotSimulatedError, SimulationDeadlock, simulate

pytestmark = pytest.mark.sim

SUBCORES = 2
LANES = 8


def meshes() -> tuple[Any, Any]:
    cores = plsc.get_sparse_core_info().num_cores
    vector = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=cores, num_subcores=SUBCORES
    )
    return vector, plsc.ScalarSubcoreMesh(axis_name="core", num_cores=cores)


def halves(x: jax.Array) -> jax.Array:
    """The vector subcores write 3x into the first half, the scalar subcores 4x into the second
    (upstream's test_parallel_subkernels, without shared scratch)."""
    vector, scalar = meshes()

    def on_vector(x_hbm: Any, o_hbm: Any) -> None:
        def body(buf: Any) -> None:
            pltpu.sync_copy(x_hbm, buf)
            buf[...] += 2 * buf[...]
            pltpu.sync_copy(buf, o_hbm.at[: x.size])

        pl.run_scoped(body, pltpu.VMEM(x.shape, x.dtype))

    def on_scalar(x_hbm: Any, o_hbm: Any) -> None:
        def body(buf: Any) -> None:
            pltpu.sync_copy(x_hbm, buf)

            @pl.loop(0, x.size)
            def _(i: Any) -> None:
                buf[i] += 3 * buf[i]

            pltpu.sync_copy(buf, o_hbm.at[x.size :])

        pl.run_scoped(body, pltpu.SMEM(x.shape, x.dtype))

    return pl.kernel(
        body=[on_vector, on_scalar],
        mesh=[vector, scalar],
        out_type=jax.ShapeDtypeStruct((2 * x.size,), x.dtype),
    )(x)


def handoff(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each scalar subcore stages its SparseCore's row of ``x`` and signals that core's vector
    subcores (by name), which copy it to their own row of the output and signal back; the
    scalar subcore waits for all of them. Needs both bodies at once."""
    vector, scalar = meshes()

    def on_vector(x_hbm: Any, stage: Any, out: Any, tec: Any, scs: Any) -> None:
        del x_hbm
        c, s = jax.lax.axis_index("core"), jax.lax.axis_index("subcore")
        pl.semaphore_wait(tec, 1)

        def body(buf: Any) -> None:
            pltpu.sync_copy(stage.at[c], buf)
            pltpu.sync_copy(buf, out.at[c, s])

        pl.run_scoped(body, pltpu.VMEM((LANES,), jnp.int32))
        pl.semaphore_signal(scs, 1, device_id={"core": c})

    def on_scalar(x_hbm: Any, stage: Any, out: Any, tec: Any, scs: Any) -> None:
        del out
        c = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[c], stage.at[c])
        for s in range(SUBCORES):
            pl.semaphore_signal(tec, 1, device_id={"core": c, "subcore": s})
        pl.semaphore_wait(scs, SUBCORES)

    cores = x.shape[0]
    out: tuple[jax.Array, jax.Array] = pl.kernel(
        body=[on_vector, on_scalar],
        mesh=[vector, scalar],
        out_type=(
            jax.ShapeDtypeStruct((cores, LANES), jnp.int32),
            jax.ShapeDtypeStruct((cores, SUBCORES, LANES), jnp.int32),
        ),
        scratch_types=[
            pltpu.SemaphoreType.REGULAR(()) @ vector,
            pltpu.SemaphoreType.REGULAR(()) @ scalar,
        ],
    )(x)
    return out


def ping(*, only_subcore_0: bool = False) -> jax.Array:
    """Each scalar subcore signals its SparseCore's vector subcores by name and waits for one
    signal back from each; semaphores only."""
    vector, scalar = meshes()

    def on_vector(_: Any, tec: Any, scs: Any) -> None:
        pl.semaphore_wait(tec, 1)
        pl.semaphore_signal(scs, 1, device_id={"core": jax.lax.axis_index("core")})

    def on_scalar(_: Any, tec: Any, scs: Any) -> None:
        c = jax.lax.axis_index("core")
        for s in range(1 if only_subcore_0 else SUBCORES):
            pl.semaphore_signal(tec, 1, device_id={"core": c, "subcore": s})
        pl.semaphore_wait(scs, SUBCORES)

    return pl.kernel(
        body=[on_vector, on_scalar],
        mesh=[vector, scalar],
        out_type=jax.ShapeDtypeStruct((LANES,), jnp.int32),
        scratch_types=[
            pltpu.SemaphoreType.REGULAR(()) @ vector,
            pltpu.SemaphoreType.REGULAR(()) @ scalar,
        ],
    )()


def barrier_then_copy(
    x: jax.Array, *, copy: bool = True, subcores: int = 1
) -> tuple[jax.Array, jax.Array]:
    """Every core and subcore of both meshes signals every one, then waits for all of them
    (JAX's test_mpmd_reduce_scatter's barrier with one vector subcore a core, its
    test_copy_with_cross_core_signaling's with more); after it each copies its SparseCore's
    row of ``x`` to its own output (``copy``: a sync_copy)."""
    cores = x.shape[0]
    vector = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=cores, num_subcores=subcores
    )
    scalar = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=cores)

    def barrier(mine: Any, scs: Any, tec: Any) -> None:
        for c in range(cores):
            pl.semaphore_signal(scs, device_id={"core": c})
            for s in range(subcores):
                pl.semaphore_signal(tec, device_id={"core": c, "subcore": s})
        pl.semaphore_wait(mine, cores * (1 + subcores))

    def on(mesh: int) -> Any:
        """Mesh 0 (vector) or 1 (scalar): wait on its semaphore, write its output."""

        def body(x_hbm: Any, o_v: Any, o_s: Any, scs: Any, tec: Any) -> None:
            barrier((tec, scs)[mesh], scs, tec)
            if copy:
                c = jax.lax.axis_index("core")
                pltpu.sync_copy(x_hbm.at[c], (o_v, o_s)[mesh].at[c])

        return body

    out: tuple[jax.Array, jax.Array] = pl.kernel(
        body=[on(0), on(1)],
        mesh=[vector, scalar],
        out_type=(jax.ShapeDtypeStruct(x.shape, x.dtype),) * 2,
        scratch_types=[
            pltpu.SemaphoreType.REGULAR(()) @ scalar,
            pltpu.SemaphoreType.REGULAR(()) @ vector,
        ],
    )(x)
    return out


def test_the_cores_of_every_mesh_meet_at_a_barrier() -> None:
    """Each SparseCore's cores run at once: with a body's cores one after the other, core 0
    waited for signals cores 1-3 had not yet sent (a false deadlock, 2 of 8)."""
    with simulate("v5p", devices=1, deadline=20.0):
        cores = plsc.get_sparse_core_info().num_cores
        x = jnp.arange(cores * LANES, dtype=jnp.int32).reshape(cores, LANES) * 3 + 1
        jax.block_until_ready(jax.jit(lambda x: barrier_then_copy(x, copy=False))(x))
        o_v, o_s = jax.jit(barrier_then_copy)(x)
    np.testing.assert_array_equal(np.asarray(o_v), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(o_s), np.asarray(x))


def test_subcores_that_signal_one_another_run_at_once() -> None:
    """A vector subcore's signal to another subcore makes the subcores run at once too (they
    took turns, and subcore 0 waited for subcore 1: a false deadlock); a mesh of more threads
    than XLA:CPU runs blocked at once is refused by name (JAX's
    test_copy_with_cross_core_signaling, 2 bodies x 4 SparseCores x 16 subcores)."""
    with simulate("v5p", devices=1, deadline=20.0):
        cores = plsc.get_sparse_core_info().num_cores
        x = jnp.arange(cores * LANES, dtype=jnp.int32).reshape(cores, LANES) - 5
        barrier = jax.jit(lambda x: barrier_then_copy(x, copy=False, subcores=SUBCORES))
        jax.block_until_ready(barrier(x))
        o_v, o_s = jax.jit(lambda x: barrier_then_copy(x, subcores=SUBCORES))(x)
        np.testing.assert_array_equal(np.asarray(o_v), np.asarray(x))
        np.testing.assert_array_equal(np.asarray(o_s), np.asarray(x))
        every = plsc.get_sparse_core_info().num_subcores
        with pytest.raises(NotSimulatedError, match=rf"{2 * cores * every} threads") as err:
            jax.jit(lambda x: barrier_then_copy(x, copy=False, subcores=every))(x)
        assert "fewer cores or subcores" in str(err.value)


def test_a_barrier_across_devices_runs_on_two_and_is_refused_on_four() -> None:
    """Per device, 2 bodies x 4 SparseCores are 8 threads that may each block in a host
    callback: 2 devices run; 4 (4 x 9 blocked callbacks) would stall XLA:CPU and are refused."""

    def sharded(sim: Any, x: jax.Array) -> Any:
        spec = jax.P("device")
        f = jax.jit(
            jax.shard_map(
                lambda xs: barrier_then_copy(xs[0])[1][None],
                mesh=sim.mesh(),
                in_specs=spec,
                out_specs=spec,
                check_vma=False,
            )
        )
        return sim.run(f, jax.device_put(x, jax.NamedSharding(sim.mesh(), spec)))

    with simulate("v5p", devices=2, deadline=20.0) as sim:
        cores = plsc.get_sparse_core_info().num_cores
        x = jnp.arange(2 * cores * LANES, dtype=jnp.int32).reshape(2, cores, LANES)
        y = np.asarray(sharded(sim, x))  # a deadlock if the cores took turns
        np.testing.assert_array_equal(y, np.asarray(x))
    with simulate("v5p", devices=4) as sim:
        x = jnp.zeros((4, cores, LANES), jnp.int32)
        with pytest.raises(NotSimulatedError, match=r"8 threads run on 4 device\(s\)") as err:
            sharded(sim, x)
        assert "at most 3 device(s)" in str(err.value) and err.value.chip == "v5p"


def test_stock_cannot_lower_an_mpmd_kernel() -> None:
    x = jnp.arange(LANES, dtype=jnp.int32)
    with (
        simulate("v5p", devices=1, disable_patches=["mpmd_kernels"]),
        pytest.raises(NotImplementedError, match="Lowering multiple mesh/function pairs"),
    ):
        jax.block_until_ready(halves(x))


def test_bodies_share_their_operands_and_output() -> None:
    x = jnp.arange(LANES, dtype=jnp.int32) - 3
    with simulate("v5p", devices=1):
        out = np.asarray(jax.jit(halves)(x))
    want = np.asarray(x)
    np.testing.assert_array_equal(out, np.concatenate([3 * want, 4 * want]))


def test_bodies_run_at_once_and_address_each_core_semaphore() -> None:
    with simulate("v5p", devices=1):
        jax.block_until_ready(jax.jit(ping)())  # a deadlock if the bodies took turns
        cores = plsc.get_sparse_core_info().num_cores
        x = jnp.arange(cores * LANES, dtype=jnp.int32).reshape(cores, LANES) * 7
        stage, out = jax.jit(handoff)(x)
        want = np.asarray(x)
        np.testing.assert_array_equal(np.asarray(stage), want)
        np.testing.assert_array_equal(
            np.asarray(out), np.broadcast_to(want[:, None], (cores, SUBCORES, LANES))
        )


def test_a_subcore_nobody_signals_is_a_named_deadlock() -> None:
    with simulate("v5p", devices=1, deadline=2.0), pytest.raises(SimulationDeadlock) as err:
        jax.block_until_ready(jax.jit(lambda: ping(only_subcore_0=True))())
    # one interpreter core (thread) per body and SparseCore
    cores = 4  # v5p's SparseCores
    assert err.value.device == 0 and 0 <= err.value.core < 2 * cores
    assert "semaphore" in str(err.value.semaphore)


def test_addressing_vector_subcores_needs_the_subcore_axis() -> None:
    """Mosaic's check (lowering.py _device_id_to_logical), made at trace time here too."""
    with simulate("v5p", devices=1):
        vector, scalar = meshes()

        def on_vector(_: Any, tec: Any) -> None:
            pl.semaphore_wait(tec, 1)

        def on_scalar(_: Any, tec: Any) -> None:
            pl.semaphore_signal(tec, device_id={"core": jax.lax.axis_index("core")})

        k = pl.kernel(
            body=[on_vector, on_scalar],
            mesh=[vector, scalar],
            out_type=jax.ShapeDtypeStruct((LANES,), jnp.int32),
            scratch_types=[pltpu.SemaphoreType.REGULAR(()) @ vector],
        )
        with pytest.raises(ValueError, match=r"missing from the mesh: \{'subcore'\}"):
            jax.jit(k)()


def shared_stage(x: jax.Array) -> jax.Array:
    """Each scalar subcore stages its SparseCore's row of ``x`` in the kernel's VMEM_SHARED
    scratch and signals that core's vector subcores, which copy what they find there to their
    own row of the output (JAX's test_mpmd_reduce_scatter hands data between its bodies so)."""
    vector, scalar = meshes()

    def on_vector(x_hbm: Any, out: Any, shared: Any, tec: Any) -> None:
        del x_hbm
        c, s = jax.lax.axis_index("core"), jax.lax.axis_index("subcore")
        pl.semaphore_wait(tec, 1)

        def body(buf: Any) -> None:
            pltpu.sync_copy(shared, buf)
            pltpu.sync_copy(buf, out.at[c, s])

        pl.run_scoped(body, pltpu.VMEM((LANES,), x.dtype))

    def on_scalar(x_hbm: Any, out: Any, shared: Any, tec: Any) -> None:
        del out
        c = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[c], shared)
        for s in range(SUBCORES):
            pl.semaphore_signal(tec, 1, device_id={"core": c, "subcore": s})

    out: jax.Array = pl.kernel(
        body=[on_vector, on_scalar],
        mesh=[vector, scalar],
        out_type=jax.ShapeDtypeStruct((x.shape[0], SUBCORES, LANES), x.dtype),
        scratch_types=[
            pltpu.VMEM_SHARED((LANES,), x.dtype),
            pltpu.SemaphoreType.REGULAR(()) @ vector,
        ],
    )(x)
    return out


def test_the_bodies_of_a_sparsecore_share_its_vmem_shared() -> None:
    """Each SparseCore's vector subcores read what its scalar subcore wrote to VMEM_SHARED, and
    no other SparseCore's (the interpreter keeps one per thread; a body's threads read
    uninitialised memory then). libtpu compiles the kernel for v5p on every line."""
    with CompileTarget.for_chip("v5p", devices=1).activate():
        cores = plsc.get_sparse_core_info().num_cores
        spec = jax.ShapeDtypeStruct((cores, LANES), jnp.int32)
        jax.jit(shared_stage).trace(spec).lower().compile()
    with simulate("v5p", devices=1):
        cores = plsc.get_sparse_core_info().num_cores
        x = jnp.arange(cores * LANES, dtype=jnp.int32).reshape(cores, LANES) * 5 - 7
        out = np.asarray(jax.jit(shared_stage)(x))
    want = np.broadcast_to(np.asarray(x)[:, None], (cores, SUBCORES, LANES))
    np.testing.assert_array_equal(out, want)


def test_vmem_shared_allocated_in_a_body_is_refused() -> None:
    with simulate("v5p", devices=1):
        vector, scalar = meshes()

        def on_vector(x_hbm: Any, o_hbm: Any) -> None:
            pl.run_scoped(
                lambda buf: pltpu.sync_copy(x_hbm, buf), pltpu.VMEM_SHARED((LANES,), jnp.int32)
            )

        def on_scalar(x_hbm: Any, o_hbm: Any) -> None:
            del x_hbm, o_hbm

        k = pl.kernel(
            body=[on_vector, on_scalar],
            mesh=[vector, scalar],
            out_type=jax.ShapeDtypeStruct((LANES,), jnp.int32),
        )
        with pytest.raises(NotSimulatedError, match="VMEM_SHARED allocated in a body"):
            jax.jit(k)(jnp.zeros(LANES, jnp.int32))


def prefetch_into_tensorcore_vmem(x: jax.Array) -> Any:
    """A scalar-subcore kernel that starts a copy of ``x`` into a TensorCore's VMEM and hands on
    the DMA semaphore a later TensorCore kernel would wait on (JAX's
    ``test_async_sc_tc_prefetch_vmem``, its first kernel): its results are tied to a mesh it
    does not run on."""
    from coremesh.core import jax_compat

    tc_mesh = jax_compat.tensorcore_mesh("tc", num_cores=1)
    scalar = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)

    def body(x_ref: Any, out_tc_vmem: Any, tc_sem: Any, sem: Any) -> None:
        pltpu.async_remote_copy(x_ref, out_tc_vmem, sem, tc_sem, device_id={"tc": 0}).wait_send()

    out, _ = pl.kernel(
        mesh=scalar,
        out_type=(
            pltpu.VMEM(x.shape, x.dtype) @ tc_mesh,
            pltpu.SemaphoreType.DMA(()) @ tc_mesh,
        ),
        scratch_types=[pltpu.SemaphoreType.DMA(())],
    )(body)(jax.new_ref(x))
    return out


@pytest.mark.parametrize("patched", [True, False], ids=["simulator", "stock"])
def test_a_kernel_with_refs_on_an_external_mesh_is_refused_by_name(patched: bool) -> None:
    """Stock's CPU lowering raises NotImplementedError for one body too; the simulator names it."""
    x = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128)
    off = [] if patched else ["mpmd_kernels"]
    with simulate("v5p", devices=1, disable_patches=off):
        if patched:
            with pytest.raises(NotSimulatedError, match="tied to a mesh it does not run on") as e:
                jax.jit(prefetch_into_tensorcore_vmem)(x)
            assert e.value.chip == "v5p" and "external mesh" in str(e.value)
        else:
            with pytest.raises(NotImplementedError, match="External meshes are not currently"):
                jax.jit(prefetch_into_tensorcore_vmem)(x)
