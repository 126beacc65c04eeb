"""A one-mesh SparseCore kernel's signal addressed by name to another of its SparseCores: libtpu
compiles it for v5p, and the simulator, which runs the mesh's cores one after the other, refuses
it by name at its line (it raised a MeshError saying the device has one core, or jax's own
NotImplementedError for two mesh axes). A mesh of one SparseCore naming itself runs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core import jax_versions
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.sim import NotSimulatedError, simulate

pytestmark = pytest.mark.sim

LANES = 16


def barrier(kind: str, cores: int | None = None) -> Any:
    """Each SparseCore signals every SparseCore's semaphore by name, then waits for all."""
    n = plsc.get_sparse_core_info().num_cores if cores is None else cores
    if kind == "scalar":
        mesh: Any = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=n)
    else:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=n, num_subcores=1
        )
    # a vector subcore names both axes (the simulator's device ids map one: the refusal comes
    # first), but in the one-SparseCore guard
    both = kind == "vector" and cores is None

    def to(c: int) -> dict[str, int]:
        return {"core": c, "subcore": 0} if both else {"core": c}

    def body(o_hbm: Any, sem: Any) -> None:
        for c in range(n):
            pl.semaphore_signal(sem, device_id=to(c))
        pl.semaphore_wait(sem, n)

        @pl.when(jax.lax.axis_index("core") == 0)
        def _() -> None:
            if kind == "scalar":  # SMEM holds scalars

                def write(buf: Any) -> None:
                    for i in range(8):
                        buf[i] = jnp.int32(n)
                    pltpu.sync_copy(buf, o_hbm)

                pl.run_scoped(write, pltpu.SMEM((8,), jnp.int32))
            else:

                def write(buf: Any) -> None:
                    buf[...] = jnp.full(buf.shape, n, jnp.int32)
                    pltpu.sync_copy(buf, o_hbm)

                pl.run_scoped(write, pltpu.VMEM((8,), jnp.int32))

    return pl.kernel(
        body,
        mesh=mesh,
        out_type=jax.ShapeDtypeStruct((8,), jnp.int32),
        scratch_types=[pltpu.SemaphoreType.REGULAR(())],
    )


def compiles_for_v5p(kind: str) -> bool:
    with CompileTarget.for_chip("v5p", devices=1).activate():
        jax.jit(barrier(kind)).trace().lower().compile()
    return True


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_a_signal_to_another_sparsecore_compiles_and_is_refused_by_name(kind: str) -> None:
    assert compiles_for_v5p(kind)
    with simulate("v5p", devices=1), pytest.raises(NotSimulatedError) as err:
        jax.jit(barrier(kind))()
    said = " ".join(str(err.value).split())
    assert "device_id names 'core' (4)" in said and err.value.chip == "v5p"
    assert "test_sc_targets.py:" in said  # the signal's line
    assert "one after the other" in said and "coremesh.testing.aot" in said


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_a_sparsecore_naming_itself_is_not_refused(kind: str) -> None:
    """The guard against refusing too much: a mesh of one SparseCore names only itself, and
    runs. From jax 0.12 the interpreter resolves a device_id's core axis itself and, as the
    simulator hands it the mesh's cores as grid steps, raised its own "Unrecognized axes in
    device_id"; an axis of one point is now taken out of the device_id first."""
    with CompileTarget.for_chip("v5p", devices=1).activate():
        jax.jit(barrier(kind, cores=1)).trace().lower().compile()
    with simulate("v5p", devices=1):
        out = np.asarray(jax.jit(barrier(kind, cores=1))())
    np.testing.assert_array_equal(out, np.full(8, 1, np.int32))


def ring_copy() -> Any:
    """Each SparseCore sends its row to the next SparseCore's VMEM by name
    (``async_remote_copy(..., device_id={"core": c + 1})``) and writes what it received."""
    n = plsc.get_sparse_core_info().num_cores
    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=n, num_subcores=1
    )

    def body(x_hbm: Any, o_hbm: Any, src: Any, dst: Any, send: Any, recv: Any) -> None:
        c = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[c], src)
        pltpu.async_remote_copy(src, dst, send, recv, device_id={"core": (c + 1) % n}).wait()
        pltpu.sync_copy(dst, o_hbm.at[c])

    kernel = pl.kernel(
        body,
        mesh=mesh,
        out_type=jax.ShapeDtypeStruct((n, LANES), jnp.int32),
        scratch_types=[pltpu.VMEM((LANES,), jnp.int32)] * 2 + [pltpu.SemaphoreType.DMA] * 2,
    )
    return kernel, jax.ShapeDtypeStruct((n, LANES), jnp.int32)


def test_a_dma_to_another_sparsecore_is_refused_by_name() -> None:
    """From jax 0.12 Mosaic compiles it and the interpreter raised its own "Unrecognized axes
    in device_id"; before, jax's lowering fails to verify it (the refusal says so) and the
    simulator raised a MeshError saying the device has one core."""
    with CompileTarget.for_chip("v5p", devices=1).activate():
        kernel, x = ring_copy()
        lowered = jax.jit(kernel).trace(x).lower
        if jax_versions.at_least("0.12.0"):
            lowered().compile()
        else:
            with pytest.raises(Exception, match=r"verif|DMA destination"):
                lowered().compile()
    with simulate("v5p", devices=1):
        kernel, x = ring_copy()
        with pytest.raises(NotSimulatedError) as err:
            jax.jit(kernel)(jnp.zeros(x.shape, x.dtype))
    said = " ".join(str(err.value).split())
    assert "a dma_start addressed to another core" in said and err.value.chip == "v5p"
    assert "device_id names 'core' (4)" in said and "test_sc_targets.py:" in said
    assert ("from jax 0.12" in said) != jax_versions.at_least("0.12.0")
