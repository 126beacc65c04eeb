"""Patch ``kernel_semaphores`` on every supported jax line: a copy started in one kernel and waited
for in the next (semaphores as kernel results and operands), on one device and between devices,
in both DMA modes, against numpy; stock interpret mode's failure; what stays refused."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim import NotSimulatedError, UnfinishedKernelError, simulate

pytestmark = pytest.mark.sim

X = np.arange(2 * 8 * 128, dtype=np.float32).reshape(2, 8, 128)
ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)


def copy_start(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Start copying each half of ``x`` into the result, one semaphore each, and return them."""

    def kernel(x_hbm: Any, o_hbm: Any, sems: Any) -> None:
        for k in range(2):
            pltpu.make_async_copy(x_hbm.at[k], o_hbm.at[k], sems.at[k]).start()

    return pl.pallas_call(  # type: ignore[no-any-return]
        kernel,
        in_specs=[ANY],
        out_specs=(ANY, SEM),
        out_shape=(jax.ShapeDtypeStruct.like(x), pltpu.SemaphoreType.DMA((2,))),
    )(x)


def waiting(kernel: Any, x: jax.Array, out: jax.Array, sems: jax.Array) -> jax.Array:
    """``kernel(x_hbm, out_in, sems, out_hbm)`` on ``(x, out, sems)``, ``out`` aliased to its
    result: the kernel that waits for copies into ``out`` an earlier kernel started."""
    return pl.pallas_call(
        kernel,
        in_specs=[ANY, ANY, SEM],
        out_specs=ANY,
        out_shape=jax.ShapeDtypeStruct.like(x),
        input_output_aliases={1: 0},
    )(x, out, sems)


def copy_done(x: jax.Array, out: jax.Array, sems: jax.Array, *, wait: bool = True) -> jax.Array:
    """Wait for the copies ``copy_start`` began; ``out`` is the result they land in."""

    def kernel(x_hbm: Any, o_in: Any, sems: Any, o_hbm: Any) -> None:
        del o_in
        if wait:
            for k in range(2):
                pltpu.make_async_copy(x_hbm.at[k], o_hbm.at[k], sems.at[k]).wait()

    return waiting(kernel, x, out, sems)


@jax.jit
def two_kernels(x: jax.Array) -> jax.Array:
    out, sems = copy_start(x)
    y = x * 2  # the caller works while the copies run
    return copy_done(x, out, sems) + y


@pytest.mark.parametrize("dma", ["on_wait", "eager"])
def test_a_copy_started_in_one_kernel_is_waited_for_in_the_next(dma: Any) -> None:
    with simulate("v5e", 1, dma_execution_mode=dma) as sim:
        got = sim.run(two_kernels, X)
    np.testing.assert_array_equal(np.asarray(got), X * 3)


def test_stock_interpret_mode_cannot_run_a_semaphore_result() -> None:
    # Outside the simulator, as a user of stock interpret mode runs it (every supported line).
    with pltpu.force_tpu_interpret_mode(), pytest.raises(Exception, match="dma_sem") as err:
        jax.block_until_ready(two_kernels(jnp.asarray(X)))
    assert not isinstance(err.value, UnsupportedOnChipError)


def test_without_the_patch_the_simulator_refuses_it() -> None:
    with (
        simulate("v5e", 1, disable_patches=["kernel_semaphores"]),
        pytest.raises(UnsupportedOnChipError, match="semaphores"),
    ):
        two_kernels(jnp.asarray(X))


def test_a_semaphore_taken_and_not_waited_for_ends_the_kernel_in_error() -> None:
    @jax.jit
    def forgets(x: jax.Array) -> jax.Array:
        out, sems = copy_start(x)
        return copy_done(x, out, sems, wait=False)

    with (
        simulate("v5e", 1) as sim,
        pytest.raises(UnfinishedKernelError, match="ends at count"),
    ):
        sim.run(forgets, X)


def test_a_semaphore_operand_over_several_grid_steps_is_refused() -> None:
    def kernel(x_hbm: Any, sems: Any, o_ref: Any) -> None:
        o_ref[...] = jnp.zeros_like(o_ref)

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        out, sems = copy_start(x)
        done = copy_done(x, out, sems)
        return pl.pallas_call(
            kernel,
            grid=(2,),
            in_specs=[ANY, SEM],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        )(done, sems)

    with simulate("v5e", 1), pytest.raises(NotSimulatedError, match="over 2 grid steps"):
        f(jnp.asarray(X))


def remote_start(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each device starts copying its block to the next device (a ring), keeping both ends'
    semaphores for a later kernel."""

    def kernel(x_hbm: Any, o_hbm: Any, send: Any, recv: Any) -> None:
        me = jax.lax.axis_index("device")
        right = jax.lax.rem(me + 1, jax.lax.axis_size("device"))
        pltpu.make_async_remote_copy(
            x_hbm, o_hbm, send, recv, device_id=(right,), device_id_type=pl.DeviceIdType.MESH
        ).start()

    return pl.pallas_call(  # type: ignore[no-any-return]
        kernel,
        in_specs=[ANY],
        out_specs=(ANY, SEM, SEM),
        out_shape=(
            jax.ShapeDtypeStruct.like(x),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
        ),
    )(x)


def remote_done(x: jax.Array, out: jax.Array, send: jax.Array, recv: jax.Array) -> jax.Array:
    def kernel(x_hbm: Any, o_in: Any, send: Any, recv: Any, o_hbm: Any) -> None:
        del o_in
        copy = pltpu.make_async_remote_copy(
            x_hbm, o_hbm, send, recv, device_id=(0,), device_id_type=pl.DeviceIdType.MESH
        )
        copy.wait_send()
        copy.wait_recv()

    return pl.pallas_call(
        kernel,
        in_specs=[ANY, ANY, SEM, SEM],
        out_specs=ANY,
        out_shape=jax.ShapeDtypeStruct.like(x),
        input_output_aliases={1: 0},
    )(x, out, send, recv)


@pytest.mark.parametrize(
    ("dma", "races"), [("on_wait", False), ("eager", False), ("on_wait", True)]
)
def test_a_copy_between_devices_is_waited_for_in_the_next_kernel(dma: Any, races: bool) -> None:
    # With the race detector on, the first kernel's end reads its results after the copies it
    # left in flight landed: ordered, no race (it reported one, as a raw BrokenBarrierError).
    x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4 * 8, 128)
    with simulate("v5e", 4, dma_execution_mode=dma, races=races) as sim:
        mesh = sim.mesh()
        spec = jax.P("device", None)

        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
        def ring(block: jax.Array) -> jax.Array:
            out, send, recv = remote_start(block)
            return remote_done(block, out, send, recv)

        got = sim.run(ring, jax.device_put(x, jax.NamedSharding(mesh, spec)))
    np.testing.assert_array_equal(np.asarray(got), np.roll(x, 8, axis=0))


def test_a_mesh_kernel_returning_a_semaphore_may_ask_its_core_index() -> None:
    def start(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        core = jax.lax.axis_index("core")  # the kernel is traced again around the hand-off
        pltpu.make_async_copy(x_hbm.at[core], o_hbm.at[core], sem).start()

    def done(x_hbm: Any, o_in: Any, sem: Any, o_hbm: Any) -> None:
        del o_in
        pltpu.make_async_copy(x_hbm.at[0], o_hbm.at[0], sem).wait()

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        mesh = jax_compat.tensorcore_mesh("core", num_cores=1)
        out_type = (jax.ShapeDtypeStruct.like(x), pltpu.SemaphoreType.DMA(()))
        out, sem = pl.kernel(start, out_type=out_type, mesh=mesh)(x)
        return waiting(done, x, out, sem)

    with simulate("v5e", 1) as sim:
        got = np.asarray(sim.run(f, X))
    np.testing.assert_array_equal(got[0], X[0])


def megacore_copies(cores: int) -> Any:
    """Two kernels over ``cores`` TensorCores: the first starts, on each core, the copies of its
    rows (each half of a row on its own semaphore, both made outside the kernels, as JAX's
    ``test_smem_async_copy_megacore`` makes its one); the second waits for them, in the other
    order."""

    mesh = jax_compat.tensorcore_mesh("core", num_cores=cores)

    def run(body: Any) -> None:
        pl.kernel(body, out_type=(), mesh=mesh)()

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        x_ref = jax.new_ref(x, memory_space=pltpu.HBM)
        o_ref = pl.empty_ref_like(pltpu.HBM(x.shape, x.dtype))
        sems = [pl.empty_ref_like(pltpu.SemaphoreType.DMA(())) for _ in range(2)]

        def copies() -> list[Any]:
            out = []
            for row in range(x.shape[0] // cores):
                r = jax.lax.axis_index("core") * (x.shape[0] // cores) + row
                out += [
                    pltpu.make_async_copy(x_ref.at[r, k], o_ref.at[r, k], sems[k]) for k in (0, 1)
                ]
            return out

        run(lambda: [c.start() for c in copies()] and None)
        run(lambda: [c.wait() for c in reversed(copies())] and None)
        return o_ref[...]

    return f


@pytest.mark.parametrize("dma", ["on_wait", "eager"])
@pytest.mark.parametrize("cores", [1, 2])
def test_each_semaphore_made_outside_the_kernels_keeps_its_own_count(cores: int, dma: Any) -> None:
    # Both semaphores start as zero bits: until each got a handle of its own, the second
    # kernel's wait on one deadlocked, its count handed to the other (one core too).
    x = np.arange(4 * 2 * 8 * 128, dtype=np.float32).reshape(4, 2, 8, 128)
    with simulate("v5p", 1, dma_execution_mode=dma) as sim:
        got = sim.run(megacore_copies(cores), x)
    np.testing.assert_array_equal(np.asarray(got), x)


@pytest.mark.parametrize("dma", ["on_wait", "eager"])
def test_each_core_of_each_device_hands_its_semaphores_to_the_same_core(dma: Any) -> None:
    """A ring between 4 devices, each of v5p's two TensorCores sending its half on semaphores
    the first kernel returns (new handles, the same on every core) and waiting in the next."""
    x = np.arange(4 * 2 * 8 * 128, dtype=np.float32).reshape(4 * 2, 8, 128)
    with simulate("v5p", 4, dma_execution_mode=dma) as sim:
        mesh = sim.mesh()
        cores = jax_compat.tensorcore_mesh("core", num_cores=2)
        spec = jax.P("device", None, None)

        def start(x_hbm: Any, o_hbm: Any, send: Any, recv: Any) -> None:
            me = jax.lax.axis_index("device")
            core = jax.lax.axis_index("core")
            right = jax.lax.rem(me + 1, jax.lax.axis_size("device"))
            pltpu.make_async_remote_copy(
                x_hbm.at[core],
                o_hbm.at[core],
                send,
                recv,
                device_id=(right,),
                device_id_type=pl.DeviceIdType.MESH,
            ).start()

        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
        def ring(block: jax.Array) -> jax.Array:
            sem = pltpu.SemaphoreType.DMA(())
            out_type = (jax.ShapeDtypeStruct.like(block), sem, sem)
            out, send, recv = pl.kernel(start, out_type=out_type, mesh=cores)(block)
            x_ref = jax.new_ref(block, memory_space=pltpu.HBM)
            o_ref = jax.new_ref(out, memory_space=pltpu.HBM)
            s_ref = jax.new_ref(send, memory_space=pltpu.SEMAPHORE)
            r_ref = jax.new_ref(recv, memory_space=pltpu.SEMAPHORE)

            def done() -> None:
                core = jax.lax.axis_index("core")
                copy = pltpu.make_async_remote_copy(
                    x_ref.at[core],
                    o_ref.at[core],
                    s_ref,
                    r_ref,
                    device_id=(0,),
                    device_id_type=pl.DeviceIdType.MESH,
                )
                copy.wait_send()
                copy.wait_recv()

            pl.kernel(done, out_type=(), mesh=cores)()
            return o_ref[...]

        got = sim.run(ring, jax.device_put(x, jax.NamedSharding(mesh, spec)))
    np.testing.assert_array_equal(np.asarray(got), np.roll(x, 2, axis=0))
