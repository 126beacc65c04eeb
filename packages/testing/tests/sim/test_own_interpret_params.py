"""A kernel's own ``interpret=pltpu.InterpretParams(...)`` inside the simulator: the fields it sets
are kept (stock interpret mode honours them), the rest come from the simulator (patch
``own_interpret_params``); without the patch the simulator's forced mode replaced them."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import call_params, simulate

pytestmark = pytest.mark.sim

OFF = ["own_interpret_params"]


def fresh_jit(fn: Any) -> Any:
    """A jit of its own: jax's trace cache keys on the simulator's (equal) parameters."""
    return jax.jit(functools.partial(fn))


def hbm_scratch_kernel(x: jax.Array) -> jax.Array:
    """x + 1 through an HBM buffer allocated in run_scoped (the call allows it)."""

    def body(x_hbm: jax.Array, o_hbm: jax.Array) -> None:
        def inner(tmp_hbm: jax.Array, v: jax.Array) -> None:
            pltpu.sync_copy(x_hbm, tmp_hbm)
            pltpu.sync_copy(tmp_hbm, v)
            v[...] = v[...] + 1
            pltpu.sync_copy(v, o_hbm)

        pl.run_scoped(inner, pltpu.HBM(x.shape, x.dtype), pltpu.VMEM(x.shape, x.dtype))

    return pl.kernel(
        body,
        out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        mesh=jax_compat.tensorcore_mesh("core", num_cores=1),
        interpret=pltpu.InterpretParams(allow_hbm_allocation_in_run_scoped=True),
    )(x)


def test_a_kernels_own_params_are_kept() -> None:
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    with simulate("v5p", 1, disable_patches=OFF), pytest.raises(Exception, match="run_scoped"):
        jax.block_until_ready(fresh_jit(hbm_scratch_kernel)(x))
    with simulate("v5p", 1) as sim:
        got = sim.run(fresh_jit(hbm_scratch_kernel), x)
    np.testing.assert_array_equal(np.asarray(got), x + 1)


def race_kernel(x: jax.Array) -> jax.Array:
    """Both grid steps write one VMEM scratch: a race when two cores share the grid."""

    def kernel(x_ref: jax.Array, o_ref: jax.Array, vmem_ref: jax.Array) -> None:
        vmem_ref[...] = x_ref[...]
        o_ref[...] = x_ref[...] + vmem_ref[...]

    return pl.pallas_call(
        kernel,
        grid=(2,),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pltpu.InterpretParams(num_cores_or_threads=2, detect_races=True),
    )(x)


def races_found(disable: list[str]) -> bool:
    """Run race_kernel, which asks for 2 cores and race detection, on a 1-core simulator."""
    x = np.ones((8, 128), np.float32)
    with simulate("v5p", 1, cores_per_device=1, disable_patches=disable) as sim:
        try:
            got = sim.run(fresh_jit(race_kernel), x)
        except Exception as err:  # jax >= 0.12 raises at the race
            return "RACE DETECTED" in str(err)
        np.testing.assert_array_equal(np.asarray(got), 2 * x)
        return bool(sim.race_reports)


def test_a_calls_race_detection_and_cores_are_kept() -> None:
    assert not races_found(OFF)  # the simulator's one core, no detection
    assert races_found([])


def test_merge_keeps_set_fields_and_the_simulators_chip() -> None:
    with simulate("v5p", 1, dma_execution_mode="eager") as sim:  # 2 cores per device
        own = pltpu.InterpretParams(out_of_bounds_reads="uninitialized", num_cores_or_threads=1)
        merged = call_params.effective(sim.interpret_params, sim.interpret_params, own)
        plain = call_params.effective(sim.interpret_params, sim.interpret_params, True)
    assert merged.out_of_bounds_reads == "uninitialized"
    assert merged.num_cores_or_threads == 1  # passed (the default value), so kept
    assert merged.dma_execution_mode == "eager"  # not passed: the simulator's
    assert merged.chip == sim.simulated_chip
    assert plain is sim.interpret_params
