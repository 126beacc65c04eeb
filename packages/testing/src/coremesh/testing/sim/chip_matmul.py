"""Matrix products as a TPU computes them: ``dot_general`` on a simulated device.

A TPU multiplies on its MXU. A ``float32`` operand at the default precision (``precision=None``
or ``DEFAULT``, what ``jnp.dot``, ``@`` and ``einsum`` use unless told otherwise) is rounded to
``bfloat16`` first; the products of ``bfloat16`` values are exact in ``float32`` and are summed
in ``float32``. XLA:TPU does this outside kernels and Mosaic inside them, the same way, so a
kernel and its ``jnp`` reference agree on the chip. XLA:CPU multiplies ``float32`` operands as
they are and sums them in an order that depends on the shapes, so on the host a blocked kernel
and a whole-matrix reference differ in their last bits, and a kernel that rounds to ``bfloat16``
itself differs from a ``float32`` reference by about 1e-2. JAX's own TPU tests compare such
pairs at the chip's tolerances (``tpu_pallas_pipeline_test``'s matmuls at ``atol=5e-5`` on
values near 128, paged attention's ``bfloat16`` kernel against a ``float32`` reference at
``atol=1e-2``).

Inside :func:`coremesh.testing.simulate` the CPU lowering of ``dot_general`` with ``float32``
or ``bfloat16`` operands and result does to the operands what the MXU does, and sums the
contraction in passes of the chip's MXU width (128 on v4/v5e/v5p, 256 on v6e/TPU7x): each pass
summed without rounding (in ``float64``) and rounded to ``float32``, the passes added in order
to a ``float32`` accumulator (:func:`chunked`), then one rounding to the result type. So a kernel
that blocks K at the MXU's width equals its whole-matrix reference bit for bit, as JAX's tests
expect of a v5 (how the MXU sums inside a pass is not modelled: exactly, here). ``float32``
operands at the default precision are rounded to ``bfloat16`` as on the chip. ``HIGH`` and
``HIGHEST`` keep ``float32`` operands as they are, and so does a product XLA or Mosaic moves
to the vector unit, a matrix-vector or row-wise dot product (:func:`on_vector_unit`, summed
exactly). Integer, ``float16``, 8-bit float and ``float64`` products, and products given a
``DotAlgorithm``, lower as upstream.
``simulate(matmul="host")`` keeps XLA:CPU's own products.

The width is a jax configuration state in every jit cache key (0 outside the simulator), so a
function compiled outside the simulator, or for another chip, is compiled again.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

#: The jax configuration state holding the MXU width products are lowered for (:func:`sync`).
STATE_NAME = "coremesh_chip_matmul"

_ROUNDED = (np.dtype(np.float32),)
_MODELLED = (np.dtype(np.float32), np.dtype("bfloat16"))


@functools.cache
def state() -> Any:
    """The configuration state: the simulated chip's MXU width, 0 outside the simulator
    (registered once: jax refuses a second state of one name)."""
    from jax._src import config

    return config.int_state(
        STATE_NAME,
        0,
        help="the MXU width dot_general is lowered for on the CPU, 0: XLA:CPU's own (coremesh)",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def sync(on: bool) -> None:
    """Set the state to the innermost simulated chip's MXU width (``on``: the patch is in
    force), or 0 outside every simulator. The patches call it as a context opens and closes."""
    import jax

    from coremesh.testing.sim.chip import active_slice

    slice_ = active_slice()
    width = slice_.simulated_chip.chip.mxu_size if on and slice_ is not None else 0
    if state().value != width:
        jax.config.update(STATE_NAME, width)


def _rounds(precision: Any, index: int) -> bool:
    """Does ``precision`` (a ``dot_general`` parameter) leave operand ``index`` at the default?"""
    from jax import lax

    if precision is None:
        return True
    if isinstance(precision, tuple):
        precision = precision[index]
    return precision is None or precision == lax.Precision.DEFAULT


def _is_precision(precision: Any) -> bool:
    """Is ``precision`` absent or a ``Precision`` (not a ``DotAlgorithm`` or its preset)?"""
    from jax import lax

    parts = precision if isinstance(precision, tuple) else (precision,)
    return all(p is None or isinstance(p, lax.Precision) for p in parts)


def on_vector_unit(avals_in: Any, dimension_numbers: Any) -> bool:
    """Is this product computed on the VPU in ``float32`` (no ``bfloat16`` rounding)?

    XLA rewrites a ``dot`` into a multiply and a reduction when it contracts nothing or when
    an operand has only batch and contracting dimensions: a matrix-vector product, or a row-wise
    dot product such as ``einsum("hsd,hsd->hs", o, do)`` (its algebraic simplifier's dot
    strength reduction). Splash attention's backward pass computes its ``di`` that way and JAX's
    test checks the gradients against a reference that computes it as ``jnp.sum(o * do)``.
    Mosaic does the same for a ``(1, K)`` right operand contracted on its last dimension when
    the operands are not both ``float32`` (``lowering.py`` ``_dot_general_lowering_rule``), and
    JAX's ``test_sum_of_two_matmuls`` compares a kernel's matrix-vector product with a
    ``HIGHEST``-precision reference at ``atol=1e-5``."""
    lhs, rhs = avals_in
    (contracting, batch) = dimension_numbers
    if not len(contracting[0]) or any(
        aval.ndim == len(c) + len(b)
        for aval, c, b in zip(avals_in, contracting, batch, strict=True)
    ):
        return True
    return (
        tuple(contracting) == ((1,), (1,))
        and lhs.ndim == rhs.ndim == 2
        and rhs.shape[0] == 1
        and not (np.dtype(lhs.dtype) == np.dtype(rhs.dtype) == np.float32)
    )


def modelled(avals_in: Any, avals_out: Any, precision: Any) -> bool:
    """Does the chip model cover this ``dot_general`` (else it lowers as upstream)?"""
    dtypes = [np.dtype(a.dtype) for a in (*avals_in, *avals_out)]
    return all(d in _MODELLED for d in dtypes) and _is_precision(precision)


def to_bfloat16(x: Any) -> Any:
    """``float32`` ``x`` rounded to the nearest ``bfloat16`` (ties to even), still ``float32``.

    Integer arithmetic on the bits: XLA may keep excess precision through a ``float32 ->
    bfloat16 -> float32`` pair of conversions (``xla_allow_excess_precision``, on by default),
    and no pass skips integer operations. NaNs pass unchanged (the uninitialized-read taint is a
    NaN payload)."""
    import jax.numpy as jnp
    from jax import lax

    bits = lax.bitcast_convert_type(x, jnp.uint32)
    bias = jnp.uint32(0x7FFF) + ((bits >> 16) & jnp.uint32(1))
    rounded = lax.bitcast_convert_type((bits + bias) & jnp.uint32(0xFFFF0000), jnp.float32)
    return jnp.where(jnp.isnan(x), x, rounded)


def chunked(
    lhs: Any,
    rhs: Any,
    *,
    dimension_numbers: Any,
    width: int,
    rounded: tuple[bool, bool],
    out_dtype: Any,
) -> Any:
    """A product whose one contracting dimension is longer than the MXU: the contraction in
    passes of ``width`` (the last padded with zeros), each pass's exact sum rounded to
    ``float32`` and added to a ``float32`` accumulator in order, as the MXU accumulates.

    A kernel that blocks K at the MXU's width and adds each block's product to a ``float32``
    scratch gets the same numbers, bit for bit (JAX's ``test_stateful_matmul`` compares one with
    ``x @ y`` at ``atol=0`` on v5, whose MXU is 128 wide, and at ``2e-5`` on v6 and later: 256
    wide, a kernel's 128-row blocks no longer line up with the passes). The passes are one
    ``dot_general`` at ``HIGHEST`` precision with the pass as a batch dimension, which
    :func:`lowering` sums exactly."""
    import jax.numpy as jnp
    from jax import lax

    lhs, rhs = (to_bfloat16(x) if r else x for x, r in zip((lhs, rhs), rounded, strict=True))
    ((lc,), (rc,)), (lb, rb) = dimension_numbers
    size = lhs.shape[lc]
    passes = -(-size // width)

    def split(x: Any, dim: int) -> Any:
        pad = [(0, 0, 0)] * x.ndim
        pad[dim] = (0, passes * width - size, 0)
        x = lax.pad(x, jnp.zeros((), x.dtype), pad)
        return x.reshape((*x.shape[:dim], passes, width, *x.shape[dim + 1 :]))

    def moved(dims: Any, cut: int) -> tuple[int, ...]:
        return tuple(d + 1 if d > cut else d for d in dims)

    parts = lax.dot_general(
        split(lhs, lc),
        split(rhs, rc),
        (((lc + 1,), (rc + 1,)), ((*moved(lb, lc), lc), (*moved(rb, rc), rc))),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    batch = (slice(None),) * len(lb)
    acc = parts[(*batch, 0)]
    for k in range(1, passes):
        acc = acc + parts[(*batch, k)]
    return acc.astype(out_dtype)


def lowering(base: Any) -> Any:
    """The CPU lowering rule of ``dot_general``: ``base`` (upstream's) unless the state is on
    and :func:`modelled` covers the product."""
    from jax._src.interpreters import mlir

    rounding = mlir.lower_fun(to_bfloat16, multiple_results=False)

    def rule(ctx: Any, lhs: Any, rhs: Any, *, precision: Any, **params: Any) -> Any:
        width = state().value
        if not width or not modelled(ctx.avals_in, ctx.avals_out, precision):
            return base(ctx, lhs, rhs, precision=precision, **params)
        dims = params["dimension_numbers"]
        vector = on_vector_unit(ctx.avals_in, dims)
        lhs_rounds, rhs_rounds = (
            np.dtype(aval.dtype) in _ROUNDED and _rounds(precision, k) and not vector
            for k, aval in enumerate(ctx.avals_in)
        )
        rounded = (lhs_rounds, rhs_rounds)
        ((lhs_contracting, _), _) = dims
        if (
            not vector
            and len(lhs_contracting) == 1
            and ctx.avals_in[0].shape[lhs_contracting[0]] > width
        ):
            in_passes = functools.partial(
                chunked,
                dimension_numbers=dims,
                width=width,
                rounded=rounded,
                out_dtype=ctx.avals_out[0].dtype,
            )
            return mlir.lower_fun(in_passes, multiple_results=False)(ctx, lhs, rhs)
        wide = []
        for operand, aval, rounds in zip((lhs, rhs), ctx.avals_in, rounded, strict=True):
            x = operand
            if rounds:
                (x,) = rounding(ctx.replace(avals_in=[aval], avals_out=[aval]), operand)
            wide.append(mlir.convert_hlo(ctx, x, aval, aval.update(dtype=np.float64)))
        (out_aval,) = ctx.avals_out
        f64, f32 = out_aval.update(dtype=np.float64), out_aval.update(dtype=np.float32)
        inner = ctx.replace(
            avals_in=[a.update(dtype=np.float64) for a in ctx.avals_in], avals_out=[f64]
        )
        params["preferred_element_type"] = np.dtype(np.float64)
        (out,) = base(inner, *wide, precision=None, **params)
        out = mlir.convert_hlo(ctx, out, f64, f32)
        if np.dtype(out_aval.dtype) != np.float32:
            out = mlir.convert_hlo(ctx, out, f32, out_aval)
        return [out]

    return rule


def targets() -> list[tuple[Any, str, Any]]:
    """The patch: the CPU lowering rule of ``dot_general`` (the state, :func:`sync`, turns it
    on)."""
    from jax import lax

    from coremesh.testing.sim.lowering_tables import cpu_rule

    state()
    return [cpu_rule(lax.dot_general_p, lowering)]
