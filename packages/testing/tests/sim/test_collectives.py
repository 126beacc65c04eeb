"""Ring all-gather and reduce-scatter over the device axis with remote DMAs, one ring per device
and one ring per core of each device, checked against numpy."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.plugin import SliceFactory
from coremesh.testing.sim import Simulator

pytestmark = pytest.mark.sim

N = 4  # devices
R, C = 8, 256  # rows per chunk, columns


def to_right(me: Any) -> dict[str, Any]:
    return {"device": lax.rem(me + 1, N)}


def barrier_with_neighbours(me: Any) -> None:
    b = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(b, 1, device_id={"device": lax.rem(me + N - 1, N)})
    pl.semaphore_signal(b, 1, device_id=to_right(me))
    pl.semaphore_wait(b, 2)


def all_gather_body(x_ref: Any, o_ref: Any, send: Any, recv: Any, local: Any) -> None:
    """Each core gathers its own column slice around the device ring (1 or 2 rings/device)."""
    me = lax.axis_index("device")
    width = C // lax.axis_size("core")
    cols = pl.ds(lax.axis_index("core") * width, width)
    x_ref, o_ref = x_ref.at[:, cols], o_ref.at[:, cols]
    pltpu.async_copy(x_ref, o_ref.at[pl.ds(me * R, R)], local).wait()
    barrier_with_neighbours(me)
    for step in range(N - 1):  # forward the chunk received last step; a semaphore per step
        slot = pl.ds(lax.rem(me + N - step, N) * R, R)
        copy = pltpu.make_async_remote_copy(
            o_ref.at[slot], o_ref.at[slot], send.at[step], recv.at[step], device_id=to_right(me)
        )
        copy.start()
        copy.wait()


def reduce_scatter_body(
    x_ref: Any, o_ref: Any, acc: Any, inbox: Any, send: Any, recv: Any, local: Any
) -> None:
    """Device d ends with sum over devices of chunk d; each core reduces its column slice."""
    me = lax.axis_index("device")
    width = C // lax.axis_size("core")
    cols = pl.ds(lax.axis_index("core") * width, width)
    pltpu.async_copy(x_ref.at[:, :, cols], acc, local).wait()
    barrier_with_neighbours(me)
    for step in range(N - 1):
        send_chunk = lax.rem(me + 2 * N - step - 1, N)
        recv_chunk = lax.rem(me + 2 * N - step - 2, N)
        copy = pltpu.make_async_remote_copy(
            acc.at[send_chunk], inbox.at[step], send, recv.at[step], device_id=to_right(me)
        )
        copy.start()
        copy.wait()
        acc[recv_chunk] = acc[recv_chunk] + inbox[step]
    pltpu.async_copy(acc.at[me], o_ref.at[:, cols], local).wait()


def all_gather(mesh: jax.sharding.Mesh) -> Any:
    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=jax.P("device", None),
        out_specs=jax.P("device", None),
        check_vma=False,
    )
    def f(x: Any) -> Any:
        return pl.kernel(
            all_gather_body,
            out_type=jax.ShapeDtypeStruct((N * R, C), x.dtype),
            mesh=jax_compat.tensorcore_mesh("core"),
            scratch_types=[
                pltpu.SemaphoreType.DMA((N - 1,)),
                pltpu.SemaphoreType.DMA((N - 1,)),
                pltpu.SemaphoreType.DMA,
            ],
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(x)

    return f


def reduce_scatter(mesh: jax.sharding.Mesh, cores: int) -> Any:
    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=jax.P("device", None, None),
        out_specs=jax.P("device", None),
        check_vma=False,
    )
    def f(x: Any) -> Any:
        width = C // cores
        return pl.kernel(
            reduce_scatter_body,
            out_type=jax.ShapeDtypeStruct((R, C), x.dtype),
            mesh=jax_compat.tensorcore_mesh("core"),
            scratch_types=[
                pltpu.VMEM((N, R, width), x.dtype),
                pltpu.VMEM((N - 1, R, width), x.dtype),
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.DMA((N - 1,)),
                pltpu.SemaphoreType.DMA,
            ],
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(x)

    return f


CONFIGS = [
    pytest.param({"chip": "v5e"}, id="1 core, one ring"),
    pytest.param({"chip": "v5p"}, id="2 cores, a ring each"),
    pytest.param({"chip": "v5p", "dma_execution_mode": "eager"}, id="2 cores, eager DMAs"),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_ring_all_gather(config: dict[str, Any], slice_target: SliceFactory) -> None:
    with slice_target(devices=N, **config) as sim:
        mesh = sim.mesh()
        x = np.random.default_rng(0).standard_normal((N * R, C)).astype(np.float32)
        xs = jax.device_put(jnp.asarray(x), jax.NamedSharding(mesh, jax.P("device", None)))
        got = np.asarray(sim.run(all_gather(mesh), xs))
        # Every device holds the full array: N copies stacked by the device out_spec.
        np.testing.assert_array_equal(got, np.tile(x, (N, 1)))
        # ... which is what jax.lax.all_gather computes.
        ref = jax.jit(
            jax.shard_map(
                lambda v: lax.all_gather(v, "device", tiled=True),
                mesh=mesh,
                in_specs=jax.P("device", None),
                out_specs=jax.P("device", None),
                check_vma=False,
            )
        )(xs)
        np.testing.assert_array_equal(got, np.asarray(ref))


@pytest.mark.parametrize("config", CONFIGS)
def test_ring_reduce_scatter(config: dict[str, Any], slice_target: SliceFactory) -> None:
    with slice_target(devices=N, **config) as sim:
        mesh = sim.mesh()
        # Device d holds N chunks x[d*N:(d+1)*N]; small integers keep float sums exact.
        x = np.random.default_rng(1).integers(-8, 8, (N * N, R, C)).astype(np.float32)
        xs = jax.device_put(jnp.asarray(x), jax.NamedSharding(mesh, jax.P("device", None, None)))
        got = np.asarray(sim.run(reduce_scatter(mesh, sim.cores_per_device), xs))
        want = x.reshape(N, N, R, C).sum(0).reshape(N * R, C)
        np.testing.assert_array_equal(got, want)


def test_simulator_fixture_defaults(sim: Simulator) -> None:
    """The plugin's fixture: v5p x 4 devices, 2 cores each, entered."""
    assert (sim.chip.name, sim.num_devices, sim.cores_per_device) == ("v5p", 4, 2)
    assert jax.device_count() == 4
