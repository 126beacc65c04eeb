"""Patch ``pipeline_primitive`` on every supported jax line: with
``jax_use_emit_pipeline_primitive`` on, ``pltpu.emit_pipeline`` kernels (an accumulating matmul
whose body reads ``pl.program_id`` under ``pl.when``; a pipeline nested in another's step, on
its buffers' views) compute what numpy does. Stock interpret mode fails on jax 0.10.2 (no
interpreter rule for the primitive); on 0.11 and later, where the patch is off, it runs the
matmul and fails on the nested pipeline (upstream's rule, not coremesh's, runs there)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import config
from jax._src import core as jax_core
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core.dtypes import mxu_operand
from coremesh.testing.sim import NotSimulatedError, compat, simulate
from coremesh.testing.sim.patches import PATCHES

pytestmark = pytest.mark.sim

PATCH = next(p for p in PATCHES if p.name == "pipeline_primitive")
#: What jax 0.10.2's interpreter says when it binds the primitive on buffer ids.
STOCK_FAILURE = "corresponding jaxpr input|Cannot lower jaxpr with effects"


def matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    """x @ y through an emit_pipeline over (rows, cols, depth), accumulating in the output
    block, which the first depth step zeroes (``pl.program_id(2) == 0``)."""

    def kernel(x_hbm: Any, y_hbm: Any, o_hbm: Any) -> None:
        def body(x_ref: Any, y_ref: Any, o_ref: Any) -> None:
            @pl.when(pl.program_id(2) == 0)
            def _() -> None:
                o_ref[...] = jnp.zeros_like(o_ref)

            o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        pltpu.emit_pipeline(
            body,
            grid=(x.shape[0] // 16, y.shape[1] // 128, x.shape[1] // 128),
            in_specs=[
                pl.BlockSpec((16, 128), lambda i, j, k: (i, k)),
                pl.BlockSpec((128, 128), lambda i, j, k: (k, j)),
            ],
            out_specs=pl.BlockSpec((16, 128), lambda i, j, k: (i, j)),
        )(x_hbm, y_hbm, o_hbm)

    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32),
    )(x, y)


def nested(x: jax.Array) -> jax.Array:
    """x plus its column block's index: an outer pipeline over row blocks (double-buffered in
    VMEM, so each step's refs are views of its buffers) runs an inner one over each block's
    column blocks, whose body adds ``pl.program_id(0)``."""

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        def inner(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32)

        def outer(x_ref: Any, o_ref: Any) -> None:
            pltpu.emit_pipeline(
                inner,
                grid=(x.shape[1] // 128,),
                in_specs=[pl.BlockSpec((16, 128), lambda j: (0, j))],
                out_specs=pl.BlockSpec((16, 128), lambda j: (0, j)),
            )(x_ref, o_ref)

        pltpu.emit_pipeline(
            outer,
            grid=(x.shape[0] // 16,),
            in_specs=[pl.BlockSpec((16, x.shape[1]), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((16, x.shape[1]), lambda i: (i, 0)),
        )(x_hbm, o_hbm)

    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 256)).astype(np.float32)
    y = rng.standard_normal((256, 128)).astype(np.float32)
    return x, y


def check_matmul() -> None:
    x, y = inputs()
    got = np.asarray(jax.jit(matmul)(x, y))
    want = mxu_operand(x).astype(np.float64) @ mxu_operand(y)  # default precision: the MXU's
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def check_nested() -> None:
    x, _ = inputs()
    got = np.asarray(jax.jit(nested)(x))
    np.testing.assert_array_equal(got, x + np.repeat(np.arange(2, dtype=np.float32), 128))


def test_emit_pipeline_primitive_runs() -> None:
    with config.use_emit_pipeline_primitive(True), simulate("v5p", 1):
        check_matmul()


def test_nested_emit_pipeline_primitive_on_views() -> None:
    # jax 0.11 and 0.12.0.1's own rule puts the outer step's views in the interpreter's
    # environment, and the inner pipeline's DMAs copy views of views: patch nested_ref_views
    # (test_regressions.py shows the stock failure), on 0.10 coremesh's expansion.
    with config.use_emit_pipeline_primitive(True), simulate("v5p", 1):
        check_nested()


@pytest.mark.parametrize("check", [check_matmul, check_nested])
def test_stock_interpreter_fails_on_the_primitive_before_jax_0_11(check: Any) -> None:
    with (
        config.use_emit_pipeline_primitive(True),
        simulate("v5p", 1, disable_patches=["pipeline_primitive", "nested_ref_views"]),
    ):
        if PATCH.needed():
            with pytest.raises(Exception, match=STOCK_FAILURE):
                check()
        elif check is check_matmul:  # jax 0.11 and later expand the primitive themselves
            check()
        else:  # ... and fail on a nested one (above); jax 0.12.1 already as it unflattens it
            stock = (
                "TransformedRef cannot wrap a TransformedRef"
                if compat.transformed_ref_refuses_nesting()
                else "__jax_array__"
            )
            with pytest.raises(ValueError, match=stock):
                check()


def test_without_the_primitive_as_before() -> None:
    with config.use_emit_pipeline_primitive(False), simulate("v5p", 1):
        check_matmul()
        check_nested()


@pytest.mark.skipif(not PATCH.needed(), reason="the patch runs on jax 0.10 only")
def test_a_view_handed_to_an_unknown_primitive_is_refused() -> None:
    from coremesh.testing.sim import ref_views_eval

    opaque = jax_core.Primitive("opaque_ref_use")
    opaque.multiple_results = True
    opaque.def_abstract_eval(lambda ref: [])

    def body(ref: Any) -> None:
        opaque.bind(ref)

    block = pltpu.VMEM((16, 128), jnp.float32)
    jaxpr = jax.make_jaxpr(body)(block.get_ref_aval()).jaxpr

    def run(buffers: Any) -> None:
        ref_views_eval.eval_jaxpr(jaxpr, (), [buffers.at[1]])

    with pytest.raises(NotSimulatedError, match="'opaque_ref_use' inside an emit_pipeline"):
        jax.make_jaxpr(run)(pltpu.VMEM((2, 16, 128), jnp.float32).get_ref_aval())
