"""DMA schedules (``simulate(schedule=...)``) and ``coremesh.testing.explore``: kernels right in
only one completion order are flagged with the schedule that reproduces them, JAX's shipped
all_gather is flagged at the wait it relies on, and the guide's programs, a collective and a
SparseCore op give one result under every schedule explored (small N here; 64 each in
``benchmarks/bench_explore.py``)."""

from __future__ import annotations

import inspect
from typing import Any

import jax
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import coremesh.testing as ct
from coremesh.core import jax_compat
from coremesh.core.errors import CoremeshError
from coremesh.testing.exploration import ScheduleDependenceError
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.sim import UninitializedReadError
from coremesh.testing.sim import schedule as sched
from coremesh.testing.sim.schedule import Schedule

pytestmark = pytest.mark.sim

X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)


def chained_body(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    """The second DMA reads the first one's destination before anyone waited for it."""
    first = pltpu.make_async_copy(x_hbm, buf, sems.at[0])
    first.start()
    second = pltpu.make_async_copy(buf, o_hbm, sems.at[1])
    second.start()
    first.wait()
    second.wait()


def shared_sem_body(x_hbm: Any, o_hbm: Any, bufs: Any, sem: Any) -> None:
    """Two equal DMAs on one semaphore; the first's data is used after one wait."""
    a = pltpu.make_async_copy(x_hbm, bufs.at[0], sem)
    a.start()
    b = pltpu.make_async_copy(x_hbm, bufs.at[1], sem)
    b.start()
    a.wait()  # satisfied by either DMA's bytes
    copy = pltpu.make_async_copy(bufs.at[0], o_hbm, sem)
    copy.start()
    copy.wait()
    b.wait()


def one_core(body: Any, scratch: list[Any]) -> Any:
    def fn(x: Any) -> Any:
        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=jax_compat.tensorcore_mesh("core", num_cores=1),
            scratch_types=scratch,
        )(x)

    return jax.jit(fn)


def chained() -> Any:
    return one_core(chained_body, [pltpu.VMEM(X.shape, X.dtype), pltpu.SemaphoreType.DMA((2,))])


def shared_sem() -> Any:
    return one_core(
        shared_sem_body, [pltpu.VMEM((2, *X.shape), X.dtype), pltpu.SemaphoreType.DMA(())]
    )


def line_of(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


# ------------------------------------------------------------------------ schedules


@pytest.mark.parametrize("policy", ["eager", "in_order", "on_wait"])
def test_the_fixed_orders_run_the_chained_kernel_right(policy: str) -> None:
    with ct.simulate("v5p", 1, schedule=Schedule(policy)) as sim:
        np.testing.assert_array_equal(np.asarray(sim.run(chained(), X)), X)


def test_explore_flags_a_kernel_right_only_in_issue_order_with_its_seed() -> None:
    # Without the uninitialized-read check the wrong order shows as NaN output (a difference);
    # with it (the default, below) the same schedule raises, naming the DMA that read too early.
    with ct.simulate("v5p", 1, check_uninitialized=False) as sim:
        report = ct.explore(chained(), X, schedules=12)
        again = ct.explore(chained(), X, schedules=12)
    found = report.divergence
    assert found is not None and found.schedule.policy == "random"
    assert again.divergence is not None and again.divergence.schedule == found.schedule
    diff = found.difference
    assert diff is not None and diff.output == "[0]"
    assert (diff.count, diff.size, diff.nans) == (X.size, X.size, X.size)  # unwritten VMEM
    # exploring stopped at the first divergence, after the schedules before it agreed
    assert report.schedules == sched.schedules(12)[: report.run]
    assert report.schedules[-1] == found.schedule
    assert f"schedule={found.schedule.spelled()}" in str(report)
    # The seed the report names reproduces the run, every time.
    for _ in range(2):
        with ct.simulate("v5p", 1, schedule=found.schedule, check_uninitialized=False) as sim:
            out = np.asarray(sim.run(chained(), X))
        assert np.isnan(out).all()
    with pytest.raises(ScheduleDependenceError, match="depends on the order its DMAs complete"):
        report.check()
    with ct.simulate("v5p", 1) as sim:
        checked = ct.explore(chained(), X, schedules=12)
    assert checked.divergence is not None and checked.divergence.schedule == found.schedule
    err = checked.divergence.error
    assert isinstance(err, UninitializedReadError)
    assert f"test_schedule.py:{line_of(chained_body, 'second.start()')} " in str(err)


def test_a_wait_satisfied_by_a_later_dma_is_named() -> None:
    with ct.simulate("v5p", 1):
        report = ct.explore(shared_sem(), X, schedules=4)
    found = report.divergence
    # issue order (the reference) and oldest-first are right; newest-first is not
    assert found is not None and found.schedule == Schedule("on_wait")
    assert [str(s) for s in report.schedules] == ["eager", "in_order", "on_wait"]
    # a.wait() took b's bytes, so the copy read bufs[0] while a was still in flight
    (wait,) = found.overtaken
    assert isinstance(found.error, UninitializedReadError)
    assert "a DMA whose source a DMA in flight has not written yet" in str(found.error)
    assert (wait.device, wait.core, wait.issuer) == (0, 0, (0, 0))
    here = __file__
    assert wait.wait_at == f"{here}:{line_of(shared_sem_body, 'a.wait()')} (shared_sem_body)"
    assert wait.started_at == f"{here}:{line_of(shared_sem_body, 'a.start()')} (shared_sem_body)"
    assert "the DMA wait on semaphore" in str(report)


def test_jax_all_gather_is_flagged_at_the_wait_it_relies_on() -> None:
    from jax.experimental.pallas.ops.tpu import all_gather

    from coremesh.testing.shipped import KERNELS

    kernel = KERNELS["all_gather"]
    inputs = kernel.inputs(kernel.devices)
    with ct.simulate("v5p", kernel.devices) as sim:
        report = ct.explore(kernel.kernel(sim.device_mesh()), *inputs, schedules=4)
    found = report.divergence
    assert found is not None and found.schedule == Schedule("on_wait")
    # the forwarded slot had not arrived: the uninitialized-read check names that DMA
    assert isinstance(found.error, UninitializedReadError)
    assert "all_gather.py" in str(found.error)
    source = inspect.getsourcefile(all_gather.ag_kernel)
    waits = {
        f"{source}:{line_of(all_gather.ag_kernel, f'{side}_dma.wait()')} (ag_kernel)"
        for side in ("right", "left")
    }
    assert found.overtaken and {w.wait_at for w in found.overtaken} <= waits
    assert all(w.issuer[0] != w.device for w in found.overtaken)  # a neighbour's DMA
    assert "all_gather.py" in str(report)


def test_a_deadlock_under_a_schedule_is_reported_not_waited_out() -> None:
    def never_signalled(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        pl.semaphore_wait(sem, 1)

    hang = one_core(never_signalled, [pltpu.SemaphoreType.REGULAR])
    with ct.simulate("v5p", 1, deadline=0.5):
        report = ct.explore(hang, X, schedules=4)
    found = report.divergence
    assert found is not None and found.schedule == Schedule("eager") and report.run == 1
    assert isinstance(found.error, ct.SimulationDeadlock)


def test_no_schedule_and_the_on_wait_schedule_are_the_interpreter_s_order() -> None:
    with ct.simulate("v5p", 1, check_uninitialized=False) as sim:
        assert sim.schedule is None
        stock = np.asarray(sim.run(shared_sem(), X))
    with ct.simulate("v5p", 1, schedule=Schedule("on_wait"), check_uninitialized=False) as sim:
        scheduled = np.asarray(sim.run(shared_sem(), X))
    np.testing.assert_array_equal(stock, scheduled)  # NaN in the same places
    assert np.isnan(stock).all()


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_guide_programs_pass_every_schedule(name: str) -> None:
    program = PROGRAMS[name]
    with ct.simulate("v5p", 1) as sim:
        mesh = sim.mesh()
        inputs = program.make_inputs(mesh)
        report = ct.explore(program.build(mesh), *inputs, schedules=6)
        assert report.ok, str(report)
        assert report.run == 6
        got = np.asarray(sim.run(program.build(mesh), *inputs))
        want = program.expected(*map(np.asarray, inputs), num_cores=sim.cores_per_device)
    np.testing.assert_array_equal(got, want)


def test_a_collective_and_a_sparsecore_op_pass_every_schedule() -> None:
    from coremesh.collectives import ops as collectives
    from coremesh.sparsecore import ops as sparsecore

    x = np.random.default_rng(1).standard_normal((4 * 32, 256), dtype=np.float32)
    table = np.random.default_rng(2).standard_normal((256, 128), dtype=np.float32)
    idx = np.random.default_rng(3).integers(0, 256, (64,)).astype(np.int32)
    with ct.simulate("v5p", 4) as sim:
        mesh = sim.device_mesh()

        @jax.jit
        def gathered(v: Any) -> Any:
            return jax.shard_map(
                lambda s: collectives.all_gather(
                    s, "device", algorithm="bidirectional", tiled=True
                ),
                mesh=mesh,
                in_specs=jax.P("device"),
                out_specs=jax.P(),
                check_vma=False,
            )(v)

        report = ct.explore(gathered, x, schedules=6)
        assert report.ok, str(report)
    with ct.simulate("v5p", 1) as sim:
        lookup = jax.jit(lambda t, i: sparsecore.gather(t, i, mode="clip"))
        report = ct.explore(lookup, table, idx, schedules=6)
        assert report.ok, str(report)
        np.testing.assert_array_equal(np.asarray(sim.run(lookup, table, idx)), table[idx])


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Schedule("lifo"), "Schedule\\(policy='lifo'\\)"),
        (lambda: Schedule("random", -1), "seed=-1"),
        (lambda: ct.simulate(schedule="random"), "schedule='random'"),
        (
            lambda: ct.simulate(schedule=Schedule("in_order"), dma_execution_mode="eager"),
            "dma_execution_mode='eager'",
        ),
        (
            lambda: ct.simulate(schedule=Schedule("in_order"), disable_patches=["dma_schedule"]),
            "dma_schedule patch disabled",
        ),
    ],
)
def test_bad_schedules_are_refused_with_the_fix(make: Any, match: str) -> None:
    with pytest.raises(CoremeshError, match=match) as info:
        make()
    assert info.value.rule and info.value.fix


def test_explore_runs_on_the_simulator_only_and_a_bounded_number_of_schedules() -> None:
    with pytest.raises(CoremeshError, match="explore\\(\\) runs on the simulator"):
        ct.explore(chained(), X)
    eager = ct.simulate("v5p", 1, dma_execution_mode="eager")
    with eager, pytest.raises(CoremeshError, match="dma_execution_mode='eager'"):
        ct.explore(chained(), X)
    with ct.simulate("v5p", 1), pytest.raises(CoremeshError, match="schedules=0"):
        ct.explore(chained(), X, schedules=0)


def test_schedules_start_with_the_fixed_orders_then_consecutive_seeds() -> None:
    got = sched.schedules(6, seed=10)
    assert got == (
        Schedule("eager"),
        Schedule("in_order"),
        Schedule("on_wait"),
        Schedule.random(10),
        Schedule.random(11),
        Schedule.random(12),
    )
    assert sched.schedules(2) == got[:2]
