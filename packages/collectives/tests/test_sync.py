"""Why the rings synchronise as they do: the simulator catches the races the rules prevent.

A ring that reuses one DMA semaphore (and one receive slot) across steps without waiting for
the receiver lets a sender run ahead: two DMAs land on one semaphore, and in the simulator's
``on_wait`` DMA mode (pending DMAs run last-in first-out) a wait is satisfied by the later one,
so the data read has not arrived; the race detector flags the receive slot overwritten while
it is read. The same rings with a
semaphore per step, or two with the credit wait, are exact. A collective whose peers never
arrive fails with the simulator's deadlock error instead of hanging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import coremesh.tensorcore as tc
from coremesh.collectives import in_kernel, ring, sync
from coremesh.collectives.axes import resolve
from coremesh.testing.conformance.collectives import run_per_device
from coremesh.testing.plugin import SliceFactory
from coremesh.testing.sim import (
    SimulationDeadlock,
    SimulationRaceError,
    UninitializedReadError,
    simulate,
)
from coremesh.testing.sim.simulator import DmaMode

pytestmark = pytest.mark.sim

R, L = 8, 128


class ReusedScatter(ring.ReduceScatterRing):
    """The reduce-scatter ring with one receive slot for every step and no credit wait."""

    def slot(self, s: int) -> int:
        return 0

    def wait_credit(self, s: int) -> None:
        pass

    def give_credit(self, s: int) -> None:
        pass


def gather_kernel(cls: type[ring.AllGatherRing], mode: sync.Sync) -> Any:
    def per_device(x: Any) -> Any:
        ax = resolve("device")
        spec = ring.AllGatherRing.scratch_spec(ax.size, mode)

        def body(x_hbm: Any, o_hbm: Any, local: Any, *scr: Any) -> None:
            r = ax.rank()
            copy = pltpu.make_async_copy(x_hbm, o_hbm.at[r], local)
            copy.start()
            copy.wait()
            sync.handshake(ax, [ax.shift(r, 1), ax.shift(r, -1)])
            g = cls(ax, 1, mode, spec.bind(scr), dst=lambda k: o_hbm.at[k])
            ring.drive([g], ax.size - 1)

        return tc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((ax.size, R, L), x.dtype),
            scratch=[pltpu.SemaphoreType.DMA, *spec.types],
            collective_id="auto",
            name=f"test_gather_{cls.__name__}_{mode}",
        )(x)

    return per_device


def scatter_kernel(cls: type[ring.ReduceScatterRing], mode: sync.Sync) -> Any:
    def per_device(x: Any) -> Any:
        ax = resolve("device")
        spec = ring.ReduceScatterRing.scratch_spec(
            ax.size, (R, L), x.dtype, mode, src_in_vmem=False
        )

        def body(x_hbm: Any, o_hbm: Any, *scr: Any) -> None:
            r = ax.rank()
            sync.handshake(ax, [ax.shift(r, 1), ax.shift(r, -1)])
            g = cls(ax, 1, mode, spec.bind(scr), src=lambda k: x_hbm.at[k], out=o_hbm, op="sum")
            ring.drive([g], ax.size - 1)

        return tc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((R, L), x.dtype),
            scratch=spec.types,
            collective_id="auto",
            name=f"test_scatter_{cls.__name__}_{mode}",
        )(x)

    return per_device


GATHER_X = jnp.arange(4 * R * L, dtype=jnp.float32).reshape(4 * R, L)

GATHER_WANT = np.tile(np.asarray(GATHER_X).reshape(4, R, L), (4, 1, 1))


def two_in_flight(shared: bool) -> Any:
    """Each device sends both halves of its block to the next device, then tells it so; the
    receiver waits for the first half and copies it out before waiting for the second. With
    one receive semaphore for both DMAs (``shared``), the wait for the first can be satisfied
    by the second: exactly what a ring that reuses a semaphore without a credit risks."""

    def per_device(x: Any) -> Any:
        ax = resolve("device")

        def body(
            x_hbm: Any, o_hbm: Any, inbox: Any, seen: Any, recv: Any, send: Any, started: Any
        ) -> None:
            r = ax.rank()
            sync.handshake(ax, [ax.shift(r, 1), ax.shift(r, -1)])
            to = ax.device_id(ax.shift(r, 1))
            halves = [pl.ds(0, R // 2), pl.ds(R // 2, R // 2)]
            copies = []
            for i, h in enumerate(halves):
                sem = recv.at[0 if shared else i]
                copy = pltpu.make_async_remote_copy(
                    x_hbm.at[h], inbox.at[h], send.at[i], sem, device_id=to
                )
                copy.start()
                copies.append(copy)
            pl.semaphore_signal(started, 1, device_id=to)
            pl.semaphore_wait(started, 1)  # both DMAs of my sender are in flight now
            for i, h in enumerate(halves):
                copies[i].wait_recv()
                seen[h] = inbox[h]  # use each half as soon as its wait returns
            for copy in copies:
                copy.wait_send()
            pltpu.sync_copy(seen, o_hbm)

        return tc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((R, L), x.dtype),
            scratch=[
                pltpu.VMEM((R, L), x.dtype),
                pltpu.VMEM((R, L), x.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.REGULAR,
            ],
            collective_id="auto",
            name=f"test_two_in_flight_{shared}",
        )(x)

    return per_device


def test_one_semaphore_for_two_dmas_reads_data_that_has_not_arrived() -> None:
    x = jnp.arange(4 * R * L, dtype=jnp.float32).reshape(4 * R, L)
    want = np.roll(np.asarray(x).reshape(4, R, L), 1, axis=0)  # from the previous device
    # on_wait runs pending DMAs last-in first-out: the second half lands first and satisfies
    # the wait for the first, whose rows have not arrived when they are read. The result would
    # hold them unwritten (NaN); the simulator names the read instead.
    with (
        simulate(chip="v5e", devices=4, dma_execution_mode="on_wait") as sim,
        pytest.raises(UninitializedReadError) as info,
    ):
        run_per_device(sim, two_in_flight(shared=True), x)
    assert info.value.kernel == "test_two_in_flight_True"
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "seen[h] = inbox[h]" in text)
    assert f"test_sync.py:{line} " in str(info.value.location)
    assert f"range [0:{R // 2}, 0:{L}]" in str(info.value)
    with simulate(chip="v5e", devices=4, dma_execution_mode="on_wait") as sim:
        right = run_per_device(sim, two_in_flight(shared=False), x).reshape(4, R, L)
    np.testing.assert_array_equal(right, want)


@pytest.mark.parametrize("mode", ["per_step", "credit"])
@pytest.mark.parametrize("dma", ["on_wait", "eager"])
def test_gather_semaphores_per_step_or_credit_are_exact(
    mode: sync.Sync, dma: DmaMode, slice_target: SliceFactory
) -> None:
    with slice_target(chip="v5e", devices=4, dma_execution_mode=dma, races=True) as sim:
        got = run_per_device(sim, gather_kernel(ring.AllGatherRing, mode), GATHER_X)
    np.testing.assert_array_equal(got, GATHER_WANT)


SCATTER_X = jnp.asarray(np.random.default_rng(11).integers(-8, 8, (4 * 4, R, L)), jnp.float32)
SCATTER_WANT = np.asarray(SCATTER_X).reshape(4, 4, R, L).sum(0).reshape(4 * R, L)


@pytest.mark.parametrize("dma", ["on_wait", "eager"])
def test_reused_receive_slot_is_a_detected_race(dma: DmaMode) -> None:
    with (
        pytest.raises(SimulationRaceError, match="data race"),
        simulate(chip="v5e", devices=4, dma_execution_mode=dma, races=True) as sim,
    ):
        run_per_device(sim, scatter_kernel(ReusedScatter, "credit"), SCATTER_X)


@pytest.mark.parametrize("mode", ["per_step", "credit"])
def test_scatter_slots_per_step_or_credit_are_exact(
    mode: sync.Sync, slice_target: SliceFactory
) -> None:
    with slice_target(chip="v5e", devices=4, dma_execution_mode="on_wait", races=True) as sim:
        got = run_per_device(sim, scatter_kernel(ring.ReduceScatterRing, mode), SCATTER_X)
    np.testing.assert_array_equal(got, SCATTER_WANT)


def test_missing_peer_is_a_deadlock_not_a_hang() -> None:
    """Device 0 never joins the all-gather: its neighbours wait on the barrier semaphore.

    Device 0's barrier count at its end is left to the watchdog across devices (see
    ``sim.refusals``), so the error is the neighbours' deadlock.
    """

    def per_device(x: Any) -> Any:
        def body(x_hbm: Any, o_hbm: Any, src: Any, dst: Any) -> None:
            me = jax.lax.axis_index("device")

            @pl.when(me != 0)
            def _() -> None:
                pltpu.sync_copy(x_hbm, src)
                in_kernel.all_gather(src, dst, axis="device", algorithm="ring")
                pltpu.sync_copy(dst, o_hbm)

        return tc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((4, R, L), x.dtype),
            scratch=[pltpu.VMEM((R, L), x.dtype), pltpu.VMEM((4, R, L), x.dtype)],
            collective_id="auto",
            name="test_missing_peer",
        )(x)

    with (
        pytest.raises(SimulationDeadlock, match="barrier semaphore") as err,
        simulate(chip="v5e", devices=4, deadline=3) as sim,
    ):
        run_per_device(sim, per_device, GATHER_X)
    deadlock = err.value
    # The error names a waiting device and lists the others; device 0 never waits.
    assert deadlock.device in (1, 2, 3)
    waiting = [deadlock.device, *(int(b.split()[1].rstrip(",")) for b in deadlock.blocked)]
    assert 0 not in waiting
