"""A fault inside a simulated kernel is a SimulationFault raised from the call, saying where."""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.core.errors import CoremeshError
from coremesh.testing.sim import SimulationFault, simulate

pytestmark = pytest.mark.sim

ROWS = 16


def line_of(fn: Any, text: str) -> str:
    """``file:line`` of the line of ``fn`` that contains ``text``."""
    lines, start = inspect.getsourcelines(fn)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return f"{inspect.getsourcefile(fn)}:{start + offset}"


def one_device_kernel(body: Any, scratch: list[Any]) -> Any:
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    return jax.jit(
        pl.kernel(body, out_type=x, mesh=jax_compat.tensorcore_mesh("core"), scratch_types=scratch)
    )


def past_the_end(x_hbm: Any, o_hbm: Any, v: Any) -> None:
    start = jax.lax.axis_index("core") * 0 + 12  # traced: only the run can see it is too far
    pltpu.sync_copy(x_hbm, v.at[:8])
    rows = v[pl.ds(start, 8), :]  # the bad load
    pltpu.sync_copy(v.at[:8], o_hbm)
    del rows


def store_past_the_end(x_hbm: Any, o_hbm: Any, v: Any) -> None:
    start = jax.lax.axis_index("core") * 0 + 12
    v[pl.ds(start, 8), :] = jnp.ones((8, 128), jnp.float32)  # the bad store
    pltpu.sync_copy(v.at[:8], o_hbm)


def wrong_shape_copy(x_hbm: Any, o_hbm: Any, v: Any) -> None:
    pltpu.sync_copy(x_hbm, v)  # (8, 128) into (16, 128)


@pytest.mark.parametrize(
    ("body", "marker", "operation"),
    [
        (past_the_end, "the bad load", "a load from a ref out of bounds"),
        (store_past_the_end, "the bad store", "a store to a ref out of bounds"),
    ],
)
def test_an_out_of_bounds_ref_access_names_core_kernel_line_buffer_and_range(
    body: Any, marker: str, operation: str
) -> None:
    with simulate(devices=1) as sim:
        f = one_device_kernel(body, [pltpu.VMEM((ROWS, 128), jnp.float32)])
        with pytest.raises(SimulationFault) as info:
            f(jnp.zeros((8, 128), jnp.float32))
        err = info.value
        assert isinstance(err, CoremeshError)
        # Still what a failing call raises on TPU and in stock interpret mode, so code (and
        # JAX's own tests) catching that keeps working.
        assert isinstance(err, jax.errors.JaxRuntimeError)
        assert err.operation == operation
        assert (err.device, err.kernel) == (0, body.__name__)
        assert err.core in range(sim.cores_per_device)
        assert err.location is not None
        assert err.location.startswith(line_of(body, marker) + " ")
        assert err.buffer is not None and f"VMEM float32[{ROWS},128]" in err.buffer
        assert err.index == "[12:20, 0:128]"  # rows 12..19 of a 16-row buffer
        assert err.rule is not None and "inside the ref's shape" in err.rule
        assert err.fix is not None and "pl.ds" in err.fix
        # The interpreter's own exception (jax 0.10.2 fails a partly out-of-bounds store on an
        # assert), traceback included.
        assert isinstance(err.__cause__, IndexError | ValueError | AssertionError)
        assert err.__cause__.__traceback__ is not None
        # The process stays usable: the next kernel runs.
        ok = one_device_kernel(
            lambda x, o, v: pltpu.sync_copy(x, o), [pltpu.VMEM((8, 128), jnp.float32)]
        )
        x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
        np.testing.assert_array_equal(np.asarray(ok(x)), np.asarray(x))


def test_a_dma_between_refs_of_different_shapes() -> None:
    with simulate(devices=1) as sim:
        f = one_device_kernel(wrong_shape_copy, [pltpu.VMEM((ROWS, 128), jnp.float32)])
        with pytest.raises(SimulationFault) as info:
            f(jnp.zeros((8, 128), jnp.float32))
        err = info.value
        assert err.operation == "a DMA between refs of different shapes"
        assert err.kernel == "wrong_shape_copy"
        assert err.core in range(sim.cores_per_device)
        assert err.buffer is not None
        assert "HBM float32[8,128]" in err.buffer and f"VMEM float32[{ROWS},128]" in err.buffer
        assert err.location is not None and "wrong_shape_copy" in err.location
        assert isinstance(err.__cause__, ValueError)


def sharded(mesh: jax.sharding.Mesh, body: Any, scratch: list[Any]) -> Any:
    spec = jax.P("device", None)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    def f(x: Any) -> Any:
        return pl.kernel(
            body, out_type=x, mesh=jax_compat.tensorcore_mesh("core"), scratch_types=scratch
        )(x)

    return f


def to_device_7(x_hbm: Any, o_hbm: Any, send: Any, recv: Any) -> None:
    copy = pltpu.make_async_remote_copy(x_hbm, o_hbm, send, recv, device_id={"device": 7})
    copy.start()
    copy.wait()


def test_a_remote_dma_to_a_device_the_slice_does_not_have() -> None:
    with simulate(devices=4) as sim:
        mesh = sim.mesh()
        f = sharded(mesh, to_device_7, [pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
        x = jax.device_put(jnp.zeros((32, 128)), jax.NamedSharding(mesh, jax.P("device", None)))
        with pytest.raises(SimulationFault) as info:
            f(x)
        err = info.value
        assert err.operation == "a remote DMA to device 7"
        assert err.device in range(4)
        assert err.rule is not None and "(0..3)" in err.rule
        assert err.location is not None
        assert err.location.startswith(line_of(to_device_7, "copy.start()") + " ")
        assert err.fix is not None and "modulo" in err.fix


def fault_while_the_other_core_waits(x_hbm: Any, o_hbm: Any, v: Any, ready: Any, done: Any) -> None:
    core = jax.lax.axis_index("core")

    @pl.when(core == 0)
    def _() -> None:
        pl.semaphore_wait(ready, 1)  # core 1 is about to wait
        rows = v[pl.ds(core + 12, 8), :]  # out of bounds: core 0 never signals `done`
        del rows
        pl.semaphore_signal(done, 1, core_index=1)

    @pl.when(core == 1)
    def _() -> None:
        pl.semaphore_signal(ready, 1, core_index=0)
        pl.semaphore_wait(done, 1)  # the wait the fault leaves blocked


def test_a_fault_on_one_core_is_the_error_and_lists_the_wait_it_left_blocked() -> None:
    # A deadline far beyond the run: the fault must stop core 1's wait, not the watchdog.
    with simulate(devices=1, deadline=300) as sim:
        assert sim.cores_per_device == 2
        f = one_device_kernel(
            fault_while_the_other_core_waits,
            [pltpu.VMEM((ROWS, 128), jnp.float32)] + [pltpu.SemaphoreType.REGULAR] * 2,
        )
        with pytest.raises(SimulationFault) as info:
            f(jnp.zeros((8, 128), jnp.float32))
        err = info.value
        assert (err.device, err.core) == (0, 0)
        assert err.operation == "a load from a ref out of bounds"
        # Core 1 is listed whether the fault found it waiting or stopped it entering the wait.
        assert [b.split(":")[0] for b in err.blocked] == ["device 0, core 1"]
        assert "semaphore #1 of the kernel" in err.blocked[0] or "semaphore wait" in err.blocked[0]
        assert "left blocked: device 0, core 1" in str(err)


def fault_while_the_other_devices_wait(x_hbm: Any, o_hbm: Any, v: Any, done: Any) -> None:
    device = jax.lax.axis_index("device")

    @pl.when(device == 0)
    def _() -> None:
        rows = v[pl.ds(device + 12, 8), :]  # out of bounds: device 0 never signals `done`
        del rows
        for other in (1, 2, 3):
            pl.semaphore_signal(done, 1, device_id={"device": other})

    @pl.when(device != 0)
    def _() -> None:
        pl.semaphore_wait(done, 1)  # the waits the fault leaves blocked


def test_a_fault_on_a_chip_of_one_core_is_the_error_not_a_wait_it_stopped() -> None:
    # One core a device: the kernel runs in each device's own program, where the interpreter
    # holds a failing device until every device has stopped, and its shared memory (with its
    # record of the first failure) is gone when the errors are reported. The stopped waits
    # reported first named "a semaphore wait failed" on device 1, 2 or 3.
    with simulate("v5e", devices=4, deadline=300) as sim:
        mesh = sim.mesh()
        f = sharded(
            mesh,
            fault_while_the_other_devices_wait,
            [pltpu.VMEM((ROWS, 128), jnp.float32), pltpu.SemaphoreType.REGULAR],
        )
        x = jax.device_put(jnp.zeros((32, 128)), jax.NamedSharding(mesh, jax.P("device", None)))
        for _ in range(3):  # which device reports first varies from run to run
            with pytest.raises(SimulationFault) as info:
                f(x)
            err = info.value
            assert (err.device, err.core) == (0, 0)
            assert err.operation == "a load from a ref out of bounds"


def test_a_fault_is_recorded_before_the_interpreter_holds_its_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At the top level the interpreter's set_failed waits for every device to stop before the
    # error goes on: the user's call could end first, with XLA's raw error (JAX's
    # test_all_gather_1d_mesh did, on 4 v5e devices). The fault must be recorded by then.
    from jax._src.pallas.mosaic.interpret import shared_memory as memory

    from coremesh.testing.sim.deadlock import WATCHDOG

    seen: list[Exception | None] = []
    original = memory.SharedMemory.set_failed

    def spy(self: Any, exception: Exception, *args: Any, **kw: Any) -> Any:
        seen.append(WATCHDOG._failure)
        return original(self, exception, *args, **kw)

    monkeypatch.setattr(memory.SharedMemory, "set_failed", spy)
    with simulate("v5e", devices=1):
        f = one_device_kernel(past_the_end, [pltpu.VMEM((ROWS, 128), jnp.float32)])
        with pytest.raises(SimulationFault, match="out of bounds"):
            f(jnp.zeros((8, 128), jnp.float32))
    assert seen and isinstance(seen[0], SimulationFault)


def test_a_device_that_starts_after_the_fault_joins_the_failed_run() -> None:
    # 8 devices, each running its kernel in its own program (v5p's core 1 has no grid step):
    # device 0 faults before the last devices have started. A late device found the run's
    # memory failed and made a fresh one, and the failed devices then waited forever at the
    # old one's clean-up barrier (JAX's test_that_barrier_does_not_hang_after_exception).
    devices = 8

    def kernel(x_ref: Any, o_ref: Any) -> None:
        me = jax.lax.axis_index("x")

        @pl.when(me == 0)
        def _() -> None:
            o_ref[0, 0] = x_ref[pl.ds(me + 100, 1), 0][0]  # out of bounds, at once

        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, device_id={"x": jax.lax.rem(me + 1, devices)})
        pl.semaphore_wait(barrier, 1)

    with simulate("v5p", devices=devices, deadline=300) as sim:
        mesh = jax.make_mesh((devices,), ("x",), devices=sim.devices)
        spec = jax.P(None, "x")
        call = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            compiler_params=pltpu.CompilerParams(collective_id=7),
        )
        f = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
        x = jax.device_put(jnp.ones((8, 128 * devices)), jax.NamedSharding(mesh, spec))
        for _ in range(3):
            with pytest.raises(SimulationFault) as info:
                f(x)
            assert info.value.device == 0


def test_an_error_marked_stopped_is_never_the_fault() -> None:
    from coremesh.testing.sim import faults
    from coremesh.testing.sim.deadlock import WATCHDOG

    err = RuntimeError("Computation failed on (0, 0) with exception: ...")
    faults.mark_stopped(err)
    with simulate("v5e", devices=1):
        WATCHDOG.reset()
        faults._report("semaphore_wait", (42, 1, 0), {}, err)  # no shared memory: none is live
        assert WATCHDOG.take() is None


def test_stock_interpreter_reports_a_fault_as_a_callback_error() -> None:
    # The fault_report patch's regression: without it the same load is XLA's generic error.
    with simulate(devices=1, disable_patches=["fault_report"]):
        f = one_device_kernel(past_the_end, [pltpu.VMEM((ROWS, 128), jnp.float32)])
        with pytest.raises(jax.errors.JaxRuntimeError, match="CpuCallback error") as info:
            f(jnp.zeros((8, 128), jnp.float32))
        assert not isinstance(info.value, CoremeshError)
