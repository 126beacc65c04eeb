"""A TensorCore kernel's load or store of HBM, ANY or an unset memory space is refused before
it runs, with Mosaic's words, where libtpu's lowering for v5p refuses it; its DMA runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import LoweringRefusalError, simulate

pytestmark = pytest.mark.sim

X = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def closed_over(direct: bool) -> Callable[[Any], Any]:
    """``pl.core_map`` over arrays it closes over (``jax.new_ref``: memory space unset)."""

    def fn(x: Any) -> Any:
        x_ref, o_ref = jax.new_ref(x), jax.new_ref(jnp.zeros_like(x))

        @pl.core_map(jax_compat.tensorcore_mesh("core"))
        def _() -> None:
            if direct:
                o_ref[...] = x_ref[...] + 1  # line of the refused load
            else:
                pltpu.sync_copy(x_ref, o_ref)

        return o_ref[...] + (0 if direct else 1)

    return fn


def in_specs_any(direct: bool) -> Callable[[Any], Any]:
    """A ``pallas_call`` operand in ``pl.ANY``, loaded directly or copied to VMEM scratch."""

    def kernel(x_hbm: Any, o_ref: Any, scratch: Any) -> None:
        if direct:
            o_ref[...] = x_hbm[...] + 1
        else:
            pltpu.sync_copy(x_hbm, scratch)
            o_ref[...] = scratch[...] + 1

    call: Callable[[Any], Any] = pl.pallas_call(
        kernel,
        out_shape=X,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM(X.shape, X.dtype)],
    )
    return call


def out_in_hbm(direct: bool) -> Callable[[Any], Any]:
    """A ``pl.kernel`` result in ``pltpu.HBM``, stored to directly or by DMA."""

    def kernel(x_ref: Any, o_hbm: Any, scratch: Any) -> None:
        scratch[...] = x_ref[...] + 1
        if direct:
            o_hbm[...] = scratch[...]
        else:
            pltpu.sync_copy(scratch, o_hbm)

    def fn(x: Any) -> Any:
        def body(x_hbm: Any, o_hbm: Any, x_vmem: Any, scratch: Any) -> None:
            pltpu.sync_copy(x_hbm, x_vmem)
            kernel(x_vmem, o_hbm, scratch)

        return pl.kernel(
            body,
            out_type=pltpu.HBM(X.shape, X.dtype),
            mesh=jax_compat.tensorcore_mesh("core", num_cores=1),
            scratch_types=[pltpu.VMEM(X.shape, X.dtype)] * 2,
        )(x)

    return fn


CASES = {"closed_over": closed_over, "in_specs_any": in_specs_any, "out_in_hbm": out_in_hbm}


def lowering_value_error(fn: Any) -> str | None:
    """libtpu's Mosaic lowering of ``fn`` for one v5p device: its ValueError, or None."""
    from coremesh.testing.aot.topology import CompileTarget

    with CompileTarget.for_chip("v5p", devices=1).activate():
        try:
            jax.jit(fn).trace(X).lower().compile()
        except ValueError as err:
            return " ".join(str(err).split())
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_a_direct_access_of_dma_only_memory_is_refused_as_mosaic_refuses_it(case: str) -> None:
    refused = lowering_value_error(CASES[case](True))
    assert refused is not None and "only allowed on VMEM and SMEM references" in refused
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    with simulate("v5p", 1), pytest.raises(LoweringRefusalError) as info:
        jax.jit(CASES[case](True))(x)
    assert isinstance(info.value, ValueError)  # what code written for the chip catches
    said = " ".join(str(info.value).split())
    words = "Loads are" if case != "out_in_hbm" else "Loads and stores are"
    assert f"{words} only allowed on VMEM and SMEM references" in said
    assert f"{words} only allowed on VMEM and SMEM references" in refused
    assert ("ANY memory space can only be accessed using async_copy" in said) == (
        "ANY memory space can only be accessed using async_copy" in refused
    )
    op = "get_p" if case != "out_in_hbm" else "swap_p"  # the interpreter's words, which
    interpreter = f"{op}: Buffers with a memory space of HBM or ANY cannot be referenced directly"
    assert interpreter in said  # JAX's test_referencing_hbm_raises matches
    assert "test_tc_accesses.py:" in said  # the kernel's line
    assert "pltpu.sync_copy" in said  # the fix


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_data_moved_by_dma_compiles_and_runs(case: str) -> None:
    """The guard against a false refusal: the DMA form compiles for v5p and runs."""
    assert lowering_value_error(CASES[case](False)) is None
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    with simulate("v5p", 1):
        got = np.asarray(jax.jit(CASES[case](False))(x))
    np.testing.assert_array_equal(got, x + 1)
