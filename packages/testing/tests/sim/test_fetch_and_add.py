"""Patch ``fetch_and_add`` on every supported jax line: ``plsc.fetch_and_add`` adds to a scalar
in the SMEM of another vector subcore of the same SparseCore, atomically, and returns the old
value; results against hand counts. A ``subcore_id`` outside the SparseCore is a SimulationFault
at the user's line; stock (the patch off) the primitive is refused, and the interpreter alone
binds it with the ref's buffer id (an int16) and fails on its dtype."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.testing.sim import (
    NotSimulatedError,
    SimulationFault,
    Simulator,
    UninitializedReadError,
    simulate,
)

pytestmark = pytest.mark.sim


def neighbours(sim: Simulator, num_cores: int, shift: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """JAX's test_fetch_and_add on every SparseCore: each subcore sets its counter to its id
    (plus 100 per SparseCore), meets the others, adds 10 to the counter of the subcore
    ``shift`` on, meets them again and reads its own: (old values, new values), each
    (num_cores, subcores)."""
    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=num_cores
    )
    n, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes
    out = jax.ShapeDtypeStruct((num_cores, n, lanes), jnp.int32)

    @pl.kernel(
        out_type=(out, out),
        mesh=mesh,
        scratch_types=[
            pltpu.VMEM((lanes,), jnp.int32),
            pltpu.VMEM((lanes,), jnp.int32),
            pltpu.SMEM((1,), jnp.int32),
        ],
    )
    def kernel(old_hbm: Any, new_hbm: Any, old_v: Any, new_v: Any, smem: Any) -> None:
        c, s = lax.axis_index("core"), lax.axis_index("subcore")
        smem[0] = c * 100 + s
        plsc.subcore_barrier()
        old = plsc.fetch_and_add(smem.at[0], 10, subcore_id=(s + shift) % n)
        plsc.subcore_barrier()
        old_v[...] = jnp.full((lanes,), old, jnp.int32)
        new_v[...] = jnp.full((lanes,), smem[0], jnp.int32)
        pltpu.sync_copy(old_v, old_hbm.at[c, s])
        pltpu.sync_copy(new_v, new_hbm.at[c, s])

    old, new = sim.run(jax.jit(kernel))
    return np.asarray(old)[..., 0], np.asarray(new)[..., 0]


@pytest.mark.parametrize(("chip", "num_cores"), [("v5p", 1), ("TPU7x", 2)])
def test_each_subcore_adds_to_its_neighbours_counter(chip: str, num_cores: int) -> None:
    with simulate(chip, devices=1) as sim:
        old, new = neighbours(sim, num_cores)
    n = old.shape[1]
    base = np.arange(num_cores)[:, None] * 100
    ids = np.arange(n)[None, :]
    np.testing.assert_array_equal(old, base + (ids + 1) % n)  # the neighbour's id
    np.testing.assert_array_equal(new, base + ids + 10)  # its own id, plus the neighbour's 10


def test_a_subcore_adds_to_its_own_counter() -> None:
    with simulate("v5p", devices=1) as sim:
        old, new = neighbours(sim, 1, shift=0)
    ids = np.arange(old.shape[1])
    np.testing.assert_array_equal(old[0], ids)
    np.testing.assert_array_equal(new[0], ids + 10)


def test_a_kernel_without_a_barrier_runs_on_subcore_threads_too() -> None:
    """No barrier: each subcore adds 10 to its own counter, on 2 SparseCores (the simulator
    keeps them apart with a barrier of its own at the end of the body)."""
    with simulate("v5p", devices=1) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=2
        )
        n, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((2, n, lanes), jnp.int32),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.SMEM((1,), jnp.int32)],
        )
        def kernel(o_hbm: Any, vals: Any, smem: Any) -> None:
            c, s = lax.axis_index("core"), lax.axis_index("subcore")
            smem[0] = c * 100 + s
            old = plsc.fetch_and_add(smem.at[0], 10, subcore_id=s)
            lane = lax.broadcasted_iota(jnp.int32, (lanes,), 0)
            vals[...] = jnp.where(lane == 0, old, smem[0])
            pltpu.sync_copy(vals, o_hbm.at[c, s])

        got = np.asarray(sim.run(jax.jit(kernel)))
    ids = np.arange(2)[:, None] * 100 + np.arange(n)[None, :]
    np.testing.assert_array_equal(got[..., 0], ids)
    np.testing.assert_array_equal(got[..., 1], ids + 10)


def test_every_subcore_adds_to_one_counter_atomically() -> None:
    """All subcores add 1 to subcore 3's counter, ``rounds`` times each, at once: the count is
    exact, and the old values are 0 .. n*rounds-1, each once (a lost or torn update would
    repeat one). Subcore 3 reads the total after the last barrier."""
    rounds, target = 6, 3
    with simulate("v5p", devices=1) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        n, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes
        assert rounds < lanes

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((n, lanes), jnp.int32),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.SMEM((4,), jnp.int32)],
        )
        def kernel(o_hbm: Any, vals: Any, smem: Any) -> None:
            s = lax.axis_index("subcore")
            smem[2] = 0
            plsc.subcore_barrier()
            lane = lax.broadcasted_iota(jnp.int32, (lanes,), 0)
            got = jnp.full((lanes,), -1, jnp.int32)
            for r in range(rounds):
                old = plsc.fetch_and_add(smem.at[2], 1, subcore_id=target)
                got = jnp.where(lane == r, old, got)
            plsc.subcore_barrier()
            vals[...] = jnp.where(lane == rounds, smem[2], got)
            pltpu.sync_copy(vals, o_hbm.at[s])

        got = np.asarray(sim.run(jax.jit(kernel)))
    olds = got[:, :rounds]
    np.testing.assert_array_equal(np.sort(olds.ravel()), np.arange(n * rounds))
    for row in olds:  # each subcore's own adds come in its program order
        assert (np.diff(row) > 0).all(), row
    assert got[target, rounds] == n * rounds


def test_the_add_wraps_around_in_int32() -> None:
    with simulate("v5p", devices=1) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        n, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes
        big = np.iinfo(np.int32).max - 5

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((n, lanes), jnp.int32),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.SMEM((1,), jnp.int32)],
        )
        def kernel(o_hbm: Any, vals: Any, smem: Any) -> None:
            s = lax.axis_index("subcore")
            smem[0] = jnp.int32(big)
            plsc.subcore_barrier()
            plsc.fetch_and_add(smem.at[0], 10, subcore_id=s)
            vals[...] = jnp.full((lanes,), smem[0], jnp.int32)
            pltpu.sync_copy(vals, o_hbm.at[s])

        got = np.asarray(sim.run(jax.jit(kernel)))
    want = np.array(big, np.int64) + 10 - 2**32
    np.testing.assert_array_equal(got, np.full((n, lanes), want, np.int32))


def test_a_subcore_id_outside_the_sparsecore_is_a_fault_at_the_line() -> None:
    with simulate("v5p", devices=1) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        n = mesh.num_subcores

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((8,), jnp.int32),
            mesh=mesh,
            scratch_types=[pltpu.SMEM((1,), jnp.int32)],
        )
        def kernel(o_hbm: Any, smem: Any) -> None:
            s = lax.axis_index("subcore")
            smem[0] = 0
            plsc.subcore_barrier()
            plsc.fetch_and_add(smem.at[0], 1, subcore_id=s + n)  # the bad line

        with pytest.raises(SimulationFault) as info:
            sim.run(jax.jit(kernel))
    err = info.value
    bad = re.search(rf"subcore_id (\d+) is outside the SparseCore's {n} vector subcores", str(err))
    assert bad is not None and n <= int(bad.group(1)) < 2 * n, str(err)
    assert "test_fetch_and_add.py" in (err.location or ""), err.location


def one_add(sim: Simulator, *, store: bool, index: int) -> None:
    """Each subcore adds 1 to ``smem[index]`` of the next subcore (a counter of 2 elements),
    having stored 0 to ``smem[0]`` first, or nothing."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)
    n = mesh.num_subcores

    @pl.kernel(
        out_type=jax.ShapeDtypeStruct((8,), jnp.int32),
        mesh=mesh,
        scratch_types=[pltpu.SMEM((2,), jnp.int32)],
    )
    def kernel(o_hbm: Any, smem: Any) -> None:
        s = lax.axis_index("subcore")
        if store:
            smem[0] = 0
        plsc.subcore_barrier()
        plsc.fetch_and_add(smem.at[index + s * 0], 1, subcore_id=(s + 1) % n)
        plsc.subcore_barrier()

    sim.run(jax.jit(kernel))


def test_an_add_to_a_counter_nobody_wrote_is_an_uninitialized_read() -> None:
    with (
        simulate("v5p", devices=1) as sim,
        pytest.raises(UninitializedReadError, match=r"element \(0,\) of subcore \d+'s SMEM"),
    ):
        one_add(sim, store=False, index=0)


def test_an_index_outside_the_ref_is_a_fault() -> None:
    with (
        simulate("v5p", devices=1) as sim,
        pytest.raises(SimulationFault, match=r"index \(2,\) is outside the ref of shape \(2,\)"),
    ):
        one_add(sim, store=True, index=2)


def test_stock_refuses_fetch_and_add() -> None:
    # Without the patch the primitive is refused by name.
    with (
        simulate("v5p", devices=1, disable_patches=["fetch_and_add"]) as sim,
        pytest.raises(NotSimulatedError, match=r"plsc\.fetch_and_add is not simulated"),
    ):
        neighbours(sim, 1)


def test_stock_interpreter_binds_it_with_a_buffer_id() -> None:
    # Without the refusal either, the interpreter's fallback binds sc_fetch_and_add with the
    # ref's buffer id (an int16) where the ref belongs, and its abstract eval rejects that.
    with (
        simulate(
            "v5p", devices=1, disable_patches=["fetch_and_add", "sparsecore_primitives"]
        ) as sim,
        pytest.raises(NotImplementedError, match="Only int32 refs are supported, but got int16"),
    ):
        neighbours(sim, 1)
