"""Patches ``core_local_smem`` and ``mpmd_operand_spaces`` on every supported jax line: an SMEM
array made outside the kernels is one per TensorCore (JAX's ``test_smem_async_copy_megacore``,
as a user writes it), against numpy; what stays refused; stock behaviour."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import NotSimulatedError, SimulationFault, simulate
from coremesh.testing.sim.patches import PATCHES

pytestmark = pytest.mark.sim

N = 16


def runner(form: str, cores: int) -> Any:
    """Run a body on each core of a TensorCore mesh: ``pl.core_map`` or ``pl.kernel``."""
    mesh = jax_compat.tensorcore_mesh("core", num_cores=cores)
    if form == "core_map":
        return pl.core_map(mesh=mesh)
    return lambda body: pl.kernel(body, out_type=(), mesh=mesh)()


def per_core_smem(form: str, cores: int = 2) -> Any:
    """Each core writes its own values into one SMEM array made outside the kernels, adds one in
    a second kernel, starts copying it to its row of an HBM result in a third and waits for the
    copy in a fourth."""
    run = runner(form, cores)

    @jax.jit
    def f() -> jax.Array:
        y_ref = pl.empty_ref_like(pltpu.SMEM((1, N), jnp.int32))

        @run
        def _() -> None:
            core = jax.lax.axis_index("core")
            for i in range(N):
                y_ref[0, i] = i + core * N

        @run
        def _() -> None:
            for i in range(N):
                y_ref[0, i] = y_ref[0, i] + 1

        out = pl.empty_ref_like(pltpu.HBM((cores, 1, N), jnp.int32))
        sem = pl.empty_ref_like(pltpu.SemaphoreType.DMA(()))

        @run
        def _() -> None:
            core = jax.lax.axis_index("core")
            pltpu.make_async_copy(y_ref, out.at[core], sem).start()

        @run
        def _() -> None:
            core = jax.lax.axis_index("core")
            pltpu.make_async_copy(y_ref, out.at[core], sem).wait()

        return out[...]

    return f


def expected(cores: int) -> np.ndarray:
    return np.arange(cores * N, dtype=np.int32).reshape(cores, 1, N) + 1


@pytest.mark.parametrize("dma", ["on_wait", "eager"])
@pytest.mark.parametrize("form", ["core_map", "kernel"])
def test_each_core_keeps_its_own_smem_array_between_kernels(form: str, dma: Any) -> None:
    with simulate("v5p", 1, dma_execution_mode=dma) as sim:
        got = np.asarray(sim.run(per_core_smem(form)))
    np.testing.assert_array_equal(got, expected(2))


def test_the_race_detector_sees_the_cores_rows_and_the_copies_as_ordered() -> None:
    # Each core writes only its own row; the copies left in flight between kernels land before
    # the kernel that started them ends, ordered before its results are read.
    with simulate("v5p", 1, races=True) as sim:
        got = np.asarray(sim.run(per_core_smem("kernel")))
    np.testing.assert_array_equal(got, expected(2))


def test_one_core_uses_the_array_as_it_is() -> None:
    with simulate("v5p", 1) as sim:
        got = np.asarray(sim.run(per_core_smem("kernel", cores=1)))
    np.testing.assert_array_equal(got, expected(1))


def test_a_kernel_body_copies_its_cores_row_with_sync_copy() -> None:
    # pltpu.sync_copy is a run_scoped DMA: its body, traced again with the core's row, keeps
    # what it closes over as its consts (jax 0.11 and later attach them to the jaxpr).
    x = np.arange(N, dtype=np.int32).reshape(1, N)
    run = runner("kernel", 2)

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        x_ref = jax.new_ref(x, memory_space=pltpu.SMEM)
        out = pl.empty_ref_like(pltpu.HBM((2, *x.shape), x.dtype))

        @run
        def _() -> None:
            core = jax.lax.axis_index("core")
            x_ref[0, 0] = x_ref[0, 0] + 10 * (core + 1)
            pltpu.sync_copy(x_ref, out.at[core])

        return out[...]

    want = np.stack([x, x])
    want[:, 0, 0] += [10, 20]
    with simulate("v5p", 1) as sim:
        np.testing.assert_array_equal(np.asarray(sim.run(f, x)), want)


def test_an_smem_array_also_read_outside_the_kernels_stays_refused() -> None:
    # Which core's values a read outside the kernels would see is not the simulator's to pick.
    run = runner("kernel", 2)

    @jax.jit
    def f() -> jax.Array:
        y_ref = pl.empty_ref_like(pltpu.SMEM((1, N), jnp.int32))

        @run
        def _() -> None:
            y_ref[0, 0] = jax.lax.axis_index("core")

        return y_ref[...]

    with simulate("v5p", 1), pytest.raises(NotSimulatedError, match="kept in VMEM or SMEM"):
        f()


def test_without_the_patch_the_simulator_refuses_it() -> None:
    with (
        simulate("v5p", 1, disable_patches=["core_local_smem"]),
        pytest.raises(NotSimulatedError, match="kept in VMEM or SMEM"),
    ):
        per_core_smem("kernel")()


def one_core_smem() -> Any:
    """A ``pl.kernel`` on one core writing an SMEM array made outside it, copied to HBM."""
    run = runner("kernel", 1)

    @jax.jit
    def f() -> jax.Array:
        y_ref = pl.empty_ref_like(pltpu.SMEM((1, N), jnp.int32))
        out = pl.empty_ref_like(pltpu.HBM((1, N), jnp.int32))

        @run
        def _() -> None:
            for i in range(N):
                y_ref[0, i] = 3 * i
            pltpu.sync_copy(y_ref, out)

        return out[...]

    return f


def test_mpmd_operand_spaces() -> None:
    want = 3 * np.arange(N, dtype=np.int32)[None]
    spaces = next(p for p in PATCHES if p.name == "mpmd_operand_spaces")
    with simulate("v5p", 1, disable_patches=["mpmd_operand_spaces"]) as sim:
        if spaces.needed():  # jax 0.10: the SMEM ref's block is in ANY, allocated in HBM
            with pytest.raises(SimulationFault, match="KeyError: \\('smem'"):
                sim.run(one_core_smem())
        else:
            np.testing.assert_array_equal(np.asarray(sim.run(one_core_smem())), want)
    with simulate("v5p", 1) as sim:
        np.testing.assert_array_equal(np.asarray(sim.run(one_core_smem())), want)
