"""Kernels over a TensorCore mesh on the compiled fast path: local DMAs run as copies, and every
case where the order of DMAs could show, or a check has something to say, is handed to the
interpreter in the same program, so both paths give the same result or the same error."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.sim import (
    SimulationDeadlock,
    SimulationFault,
    Simulator,
    UninitializedReadError,
    simulate,
)
from coremesh.testing.sim.errors import UnfinishedKernelError

pytestmark = pytest.mark.sim

ROWS = 8  # rows per core: v5p has two TensorCores
X = jax.ShapeDtypeStruct((2 * ROWS, 128), jnp.float32)
XS = np.random.default_rng(1).standard_normal((2 * ROWS, 128)).astype(np.float32)
SCRATCH = [pltpu.VMEM((ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA(())]
THEN_INTERPRETED = "compiled, then interpreted: "


def on_mesh(body: Callable[..., None], scratch: list[Any] | None = None) -> Callable[..., Any]:
    """``body`` over the chip's TensorCores (made inside ``simulate``, which sets the count)."""
    mesh = jax_compat.tensorcore_mesh("core")
    kernel: Callable[..., Any] = pl.kernel(
        body, out_type=X, mesh=mesh, scratch_types=scratch or SCRATCH
    )
    return kernel


def rows() -> Any:
    return pl.ds(jax.lax.axis_index("core") * ROWS, ROWS)


def add_one(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    pltpu.sync_copy(x_hbm.at[rows()], buf)
    buf[...] = buf[...] + 1
    pltpu.sync_copy(buf, o_hbm.at[rows()])


def read_before_wait(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm.at[rows()], buf, sem)
    copy.start()
    early = buf[...]  # the DMA may not have written it yet
    copy.wait()
    buf[...] = early + 1
    pltpu.sync_copy(buf, o_hbm.at[rows()])


def overwrite_source_in_flight(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    pltpu.sync_copy(x_hbm.at[rows()], buf)
    copy = pltpu.make_async_copy(buf, o_hbm.at[rows()], sem)
    copy.start()
    buf[...] = jnp.zeros_like(buf)  # the DMA may not have read it yet
    copy.wait()


def wait_without_start(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    add_one(x_hbm, o_hbm, buf, sem)
    pltpu.make_async_copy(x_hbm.at[rows()], buf, sem).wait()


def start_without_wait(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    add_one(x_hbm, o_hbm, buf, sem)
    pltpu.make_async_copy(x_hbm.at[rows()], buf, sem).start()


def out_of_bounds(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    start = jax.lax.axis_index("core") * ROWS + 4  # core 1 reads rows 12..19 of 16
    pltpu.sync_copy(x_hbm.at[pl.ds(start, ROWS)], buf)
    pltpu.sync_copy(buf, o_hbm.at[rows()])


def core_zero_only(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    @pl.when(jax.lax.axis_index("core") == 0)
    def _() -> None:
        add_one(x_hbm, o_hbm, buf, sem)


def double_buffered(x_hbm: Any, o_hbm: Any, bufs: Any, sems: Any) -> None:
    """Two blocks of 4 rows per core, the second fetched while the first is computed."""
    base = jax.lax.axis_index("core") * ROWS

    def fetch(i: int) -> Any:
        return pltpu.make_async_copy(x_hbm.at[pl.ds(base + 4 * i, 4)], bufs.at[i], sems.at[i])

    fetch(0).start()
    fetch(1).start()
    for i in range(2):
        fetch(i).wait()
        bufs[i] = bufs[i] * 2.0
        pltpu.sync_copy(bufs.at[i], o_hbm.at[pl.ds(base + 4 * i, 4)])


def run(body: Callable[..., None], *, fast: bool, scratch: list[Any] | None = None) -> Any:
    with simulate("v5p", 1, fast_path=fast) as sim:
        out = np.asarray(sim.run(on_mesh(body, scratch), XS))
    return out, sim


def only_path(sim: Simulator) -> str:
    (path,) = set(sim.paths.values())
    return path


def test_local_dmas_run_compiled_and_match_numpy_and_the_interpreter() -> None:
    fast, sim = run(add_one, fast=True)
    slow, _ = run(add_one, fast=False)
    assert only_path(sim) == "compiled"
    np.testing.assert_array_equal(fast, XS + 1)
    np.testing.assert_array_equal(fast, slow)


def test_two_dmas_in_flight_on_their_own_semaphores_run_compiled() -> None:
    scratch = [pltpu.VMEM((2, 4, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    fast, sim = run(double_buffered, fast=True, scratch=scratch)
    assert only_path(sim) == "compiled"
    np.testing.assert_array_equal(fast, XS * 2)


@pytest.mark.parametrize(
    ("body", "error", "words", "reason"),
    [
        (read_before_wait, UninitializedReadError, "unwritten", "a DMA in flight overlapped"),
        (wait_without_start, SimulationDeadlock, "sem", "a wait no DMA in flight"),
        (start_without_wait, UnfinishedKernelError, "never waited", "left when its scope ended"),
        (out_of_bounds, SimulationFault, "out of bounds", "an index outside its ref"),
    ],
)
def test_what_the_interpreter_reports_is_reported_the_same_on_the_fast_path(
    body: Callable[..., None], error: type[Exception], words: str, reason: str
) -> None:
    messages = []
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast, deadline=1.0) as sim:
            with pytest.raises(error, match=words) as info:
                sim.run(on_mesh(body), XS)
            # The cores run as threads in the interpreter: which reports first varies, and so
            # does whether the other core was blocked in a wait when the fault stopped the run.
            text = "\n".join(
                line for line in str(info.value).splitlines() if "left blocked" not in line
            )
            messages.append(re.sub(r"core \d", "core N", text))
            if fast:
                assert any(
                    p.startswith(THEN_INTERPRETED) and reason in p for p in sim.paths.values()
                ), sim.paths
    assert messages[0] == messages[1]


def int_scratch_read_unwritten(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any, idx: Any) -> None:
    pltpu.sync_copy(x_hbm.at[rows()], buf)
    buf[...] = buf[...] + idx[0].astype(jnp.float32)  # idx (SMEM int32) was never written
    pltpu.sync_copy(buf, o_hbm.at[rows()])


def int_scratch_written(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any, idx: Any) -> None:
    idx[0] = jax.lax.axis_index("core") + 1
    pltpu.sync_copy(x_hbm.at[rows()], buf)
    buf[...] = buf[...] + idx[0].astype(jnp.float32)
    pltpu.sync_copy(buf, o_hbm.at[rows()])


def test_integer_scratch_runs_compiled_and_an_unwritten_read_of_it_is_the_interpreters() -> None:
    scratch = [*SCRATCH, pltpu.SMEM((1,), jnp.int32)]
    fast, sim = run(int_scratch_written, fast=True, scratch=scratch)
    assert only_path(sim) == "compiled"
    np.testing.assert_array_equal(fast[:ROWS], XS[:ROWS] + 1)
    np.testing.assert_array_equal(fast[ROWS:], XS[ROWS:] + 2)
    messages = []
    for fast_path in (True, False):
        with simulate("v5p", 1, fast_path=fast_path) as sim:
            with pytest.raises(UninitializedReadError, match="unwritten") as info:
                sim.run(on_mesh(int_scratch_read_unwritten, scratch), XS)
            # The cores run as threads in the interpreter: which reports first, and whether the
            # other is still blocked then, varies.
            messages.append(re.sub(r"core \d", "core N", str(info.value).splitlines()[0]))
            if fast_path:
                assert only_path(sim) == (
                    THEN_INTERPRETED + "a load of unwritten integer or bool memory"
                )
    assert messages[0] == messages[1]


def test_a_source_overwritten_in_flight_gives_the_interpreters_result() -> None:
    fast, sim = run(overwrite_source_in_flight, fast=True)
    slow, _ = run(overwrite_source_in_flight, fast=False)
    np.testing.assert_array_equal(fast, slow)
    assert only_path(sim) == THEN_INTERPRETED + "a DMA in flight overlapped an access"


def test_rows_no_core_writes_hold_the_fill_on_both_paths() -> None:
    fast, sim = run(core_zero_only, fast=True)
    slow, _ = run(core_zero_only, fast=False)
    np.testing.assert_array_equal(fast[:ROWS], XS[:ROWS] + 1)
    assert np.isnan(fast[ROWS:]).all()
    np.testing.assert_array_equal(fast, slow)
    assert only_path(sim) == THEN_INTERPRETED + "the result holds unwritten memory"


@pytest.mark.parametrize("name", ["add_one"])
@pytest.mark.parametrize("devices", [1, 4])
def test_guide_programs_over_a_mesh_run_compiled_on_every_device(name: str, devices: int) -> None:
    program = PROGRAMS[name]
    results = []
    for fast in (True, False):
        with simulate("v5p", devices, fast_path=fast) as sim:
            mesh = sim.mesh()
            inputs = program.make_inputs(mesh, seed=5)
            results.append(np.asarray(sim.run(program.build(mesh), *inputs)))
            if fast:
                assert only_path(sim) == "compiled"
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], program.expected(*map(np.asarray, inputs)))
