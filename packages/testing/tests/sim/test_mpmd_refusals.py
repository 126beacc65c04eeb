"""The simulator's refusals for an MPMD kernel (``pl.kernel`` over several meshes) against
libtpu's: its bodies are SparseCore ones (jax refuses a TensorCore mesh beside a SparseCore one,
and two TensorCore meshes), so a ``jnp.cumsum`` in the vector-subcore body, which Mosaic's
SparseCore lowering has a rule for, compiles for the chip and runs in the simulator, where the
TensorCore lowering's "Unimplemented primitive ... for tc" once refused it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core import jax_compat
from coremesh.core.chips import get_chip
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.aot import versions
from coremesh.testing.sim import simulate
from coremesh.testing.sim.errors import KernelCapacityError

pytestmark = pytest.mark.sim

SUBCORES = 2
#: libtpu's Mosaic with its layout passes on (libtpu 0.0.52, v5p and TPU7x): the SparseCore
#: scan a cumsum lowers to is not supported by the infer-vector-layout pass.
LAYOUT_WORDS = "Set needs_layout_passes=False"


needs_libtpu = pytest.mark.skipif(
    versions.libtpu_version() is None, reason="libtpu is not installed"
)


def cumsum_kernel(*, layout_passes: bool = False, copy: bool = True) -> Any:
    """Each vector subcore writes the cumsum of ``x`` (one vector) to its row of the output; the
    scalar subcores do nothing. Without ``copy`` the vector subcores only take the cumsum of
    their scratch in place (no sync_copy, which the simulator refuses in a body from jax 0.11)."""
    info = plsc.get_sparse_core_info()
    cores, lanes = info.num_cores, info.num_lanes
    vector = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=cores, num_subcores=SUBCORES
    )
    scalar = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=cores)

    def on_vector(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
        c, s = jax.lax.axis_index("core"), jax.lax.axis_index("subcore")
        if copy:
            pltpu.sync_copy(x_hbm, buf)
        else:
            buf[...] = jnp.full(buf.shape, 1.5, jnp.float32)
        buf[...] = jnp.cumsum(buf[...])
        if copy:
            pltpu.sync_copy(buf, o_hbm.at[c, s])

    def on_scalar(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
        del x_hbm, o_hbm, buf

    return pl.kernel(
        body=[on_vector, on_scalar],
        mesh=[vector, scalar],
        out_type=jax.ShapeDtypeStruct((cores, SUBCORES, lanes), jnp.float32),
        scratch_types=[pltpu.VMEM((lanes,), jnp.float32) @ vector],
        compiler_params=None if layout_passes else pltpu.CompilerParams(needs_layout_passes=False),
    )


def libtpu_error(chip: str, kernel: Callable[[], Any]) -> str:
    """libtpu's compile for ``chip`` of ``kernel()``, taking one float32 vector: its error, one
    line, or "" when it compiles."""
    from coremesh.testing.aot.topology import CompileTarget

    target = CompileTarget.for_chip(chip, devices=get_chip(chip).devices_per_chip())
    with target.activate():
        lanes = plsc.get_sparse_core_info().num_lanes
        spec = jax.ShapeDtypeStruct((lanes,), jnp.float32, sharding=target.sharding(jax.P()))
        mapped = jax.shard_map(
            kernel(), mesh=target.mesh, in_specs=(jax.P(),), out_specs=jax.P(), check_vma=False
        )
        try:
            jax.jit(mapped).trace(spec).lower().compile()
        except Exception as err:  # the compiler's own error type
            return " ".join(str(err).split())
    return ""


def libtpu_verdict(chip: str, *, layout_passes: bool, copy: bool = True) -> str | None:
    """libtpu's compile of :func:`cumsum_kernel` for ``chip``: its error, one line, or None."""
    kernel = functools.partial(cumsum_kernel, layout_passes=layout_passes, copy=copy)
    return libtpu_error(chip, kernel) or None


@needs_libtpu
@pytest.mark.parametrize("chip", ["v5p", "TPU7x"])
def test_a_cumsum_in_the_vector_subcore_body_compiles_and_runs(chip: str) -> None:
    """libtpu compiles it (without the layout passes, which refuse the scan); the simulator runs
    it and every vector subcore's row is numpy's cumsum (on jax 0.10; later lines refuse the
    sync_copy by name, not the cumsum)."""
    verdict = libtpu_verdict(chip, layout_passes=False)
    assert verdict is None, verdict
    with simulate(chip, 1):
        info = plsc.get_sparse_core_info()
        x = np.arange(info.num_lanes, dtype=np.float32) * 1.5 - 4
        out = np.asarray(jax.jit(cumsum_kernel())(x))
    want = np.broadcast_to(np.cumsum(x), (info.num_cores, SUBCORES, info.num_lanes))
    np.testing.assert_allclose(out, want, rtol=1e-6)


@needs_libtpu
@pytest.mark.parametrize("chip", ["v5p", "TPU7x"])
def test_a_cumsum_in_place_in_the_vector_subcore_body_is_not_refused(chip: str) -> None:
    """The same cumsum without copies, on every jax line: libtpu compiles it, and the simulator
    runs it instead of refusing it as a TensorCore kernel's cumsum."""
    verdict = libtpu_verdict(chip, layout_passes=False, copy=False)
    assert verdict is None, verdict
    with simulate(chip, 1):
        lanes = plsc.get_sparse_core_info().num_lanes
        jax.block_until_ready(jax.jit(cumsum_kernel(copy=False))(np.zeros(lanes, np.float32)))


@needs_libtpu
@pytest.mark.parametrize("chip", ["v5p", "TPU7x"])
def test_the_cumsum_with_layout_passes_is_refused_as_libtpu_refuses_it(chip: str) -> None:
    """Why the kernels above turn the layout passes off: with them (the default) libtpu refuses
    the SparseCore scan, on v5p as on TPU7x, and the simulator refuses the vector-subcore body
    as it does a kernel over that mesh alone (sim/sc_ops.py)."""
    for copy in (True, False):
        verdict = libtpu_verdict(chip, layout_passes=True, copy=copy)
        assert verdict is not None and LAYOUT_WORDS in verdict, (chip, verdict)
    with simulate(chip, 1):
        x = np.zeros(plsc.get_sparse_core_info().num_lanes, np.float32)
        run = jax.jit(cumsum_kernel(layout_passes=True, copy=False))
        with pytest.raises(UnsupportedOnChipError, match=LAYOUT_WORDS):
            run(x)


def scratch_kernel(words: int) -> Any:
    """An MPMD kernel whose vector subcores each fill ``words`` float32 of VMEM scratch."""
    info = plsc.get_sparse_core_info()
    vector = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=info.num_cores
    )
    scalar = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=info.num_cores)

    def on_vector(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
        del x_hbm, o_hbm
        buf[pl.ds(0, info.num_lanes)] = jnp.full((info.num_lanes,), 1.5, jnp.float32)

    def on_scalar(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
        del x_hbm, o_hbm, buf

    return pl.kernel(
        body=[on_vector, on_scalar],
        mesh=[vector, scalar],
        out_type=jax.ShapeDtypeStruct((info.num_lanes,), jnp.float32),
        scratch_types=[pltpu.VMEM((words,), jnp.float32) @ vector],
        compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
    )


@needs_libtpu
@pytest.mark.parametrize("fraction", [0.97, 1.03])
def test_scratch_is_budgeted_against_a_vector_subcores_vmem(fraction: float) -> None:
    """libtpu allocates an MPMD kernel's vector scratch in each vector subcore's VMEM (v5p:
    512 KiB, "CompileTimeSparseCoreAllocationFailure" past it), not in a TensorCore's: the
    simulator refuses exactly the scratch libtpu refuses."""
    chip = get_chip("v5p")
    assert chip.sparsecore is not None
    words = int(chip.sparsecore.vmem_bytes_per_subcore * fraction) // 4 // 128 * 128
    verdict = libtpu_error("v5p", functools.partial(scratch_kernel, words))
    refused = "SparseCoreAllocationFailure" in verdict
    assert refused == (fraction > 1), verdict
    with simulate("v5p", 1):
        lanes = plsc.get_sparse_core_info().num_lanes
        run = jax.jit(scratch_kernel(words))
        if refused:
            with pytest.raises(KernelCapacityError, match="SparseCore VMEM"):
                run(np.zeros(lanes, np.float32))
        else:
            jax.block_until_ready(run(np.zeros(lanes, np.float32)))


#: jax's refusals of an MPMD kernel with a TensorCore body, by what the other body runs on.
TENSORCORE_BODY_REFUSALS = {
    "vector subcores": "Multiple meshes with different default memory spaces are not supported",
    "another TensorCore mesh": "You can't use two different TensorCoreMeshes",
}


@needs_libtpu
@pytest.mark.parametrize("beside", sorted(TENSORCORE_BODY_REFUSALS))
def test_a_tensorcore_body_is_refused_as_jax_refuses_it(beside: str) -> None:
    """No MPMD kernel has a TensorCore body next to a SparseCore one, or two TensorCore bodies:
    jax refuses it as it traces the kernel, for the chip and in the simulator alike, so the
    TensorCore lowering's refusals (a cumsum's among them) never apply to an MPMD kernel."""
    from coremesh.testing.aot.topology import CompileTarget

    def kernel() -> Any:
        if beside == "vector subcores":
            other = plsc.VectorSubcoreMesh(
                core_axis_name="core",
                subcore_axis_name="subcore",
                num_cores=plsc.get_sparse_core_info().num_cores,
            )
        else:
            other = jax_compat.tensorcore_mesh("y", num_cores=1)

        def on_other(x_hbm: Any, o_hbm: Any) -> None:
            del x_hbm, o_hbm

        def on_tensorcore(x_hbm: Any, o_hbm: Any) -> None:
            def body(buf: Any) -> None:
                pltpu.sync_copy(x_hbm, buf)
                buf[...] = jnp.cumsum(buf[...], axis=1)
                pltpu.sync_copy(buf, o_hbm)

            pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32))

        return pl.kernel(
            body=[on_other, on_tensorcore],
            mesh=[other, jax_compat.tensorcore_mesh("x", num_cores=1)],
            out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        )

    words = TENSORCORE_BODY_REFUSALS[beside]
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    with (
        CompileTarget.for_chip("v5p", devices=1).activate(),
        pytest.raises(ValueError, match=words),
    ):
        jax.jit(kernel()).trace(x)
    with simulate("v5p", 1), pytest.raises(ValueError, match=words):
        jax.jit(kernel())(np.zeros((8, 128), np.float32))


def int8_add_kernel() -> Any:
    """The vector subcores add int8 vectors in their scratch; the scalar subcores do nothing."""
    info = plsc.get_sparse_core_info()
    vector = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=info.num_cores
    )
    scalar = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=info.num_cores)
    n = 4 * info.num_lanes

    def on_vector(x_hbm: Any, buf: Any) -> None:
        del x_hbm
        buf[...] = jnp.full(buf.shape, 3, jnp.int8)
        buf[...] = buf[...] + buf[...]

    def on_scalar(x_hbm: Any, buf: Any) -> None:
        del x_hbm, buf

    return pl.kernel(
        body=[on_vector, on_scalar],
        mesh=[vector, scalar],
        out_type=(),
        scratch_types=[pltpu.VMEM((n,), jnp.int8) @ vector],
        compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
    )


@needs_libtpu
@pytest.mark.parametrize("chip", ["v5p", "TPU7x"])
def test_int8_vector_arithmetic_in_the_vector_subcore_body_is_not_refused(chip: str) -> None:
    """libtpu compiles an int8 vector add on the vector subcores, which a TensorCore kernel's
    Mosaic refuses ("Only vector<i16> and vector<i32>"); the simulator runs it."""
    from coremesh.testing.aot.topology import CompileTarget

    target = CompileTarget.for_chip(chip, devices=get_chip(chip).devices_per_chip())
    with target.activate():
        spec = jax.ShapeDtypeStruct((8,), jnp.int32, sharding=target.sharding(jax.P()))
        mapped = jax.shard_map(
            int8_add_kernel(),
            mesh=target.mesh,
            in_specs=(jax.P(),),
            out_specs=(),
            check_vma=False,
        )
        jax.jit(mapped).trace(spec).lower().compile()
    with simulate(chip, 1):
        jax.block_until_ready(jax.jit(int8_add_kernel())(np.zeros(8, np.int32)))
