"""``plsc.bitcast(x, dtype)`` in the interpreter of jax before 0.12, as jax 0.12 runs it.

Before jax 0.12, ``plsc.bitcast`` binds the SparseCore primitive ``bitcast``
(``sc_primitives.py`` ``bitcast_p``), whose only lowering is Mosaic's SparseCore rule
(``vector.bitcast``); the interpreter has no rule for it either, so its fallback binds it on the
value and the core's program fails to compile for the host ("MLIR translation rule for primitive
'bitcast' not found for platform cpu"; patch ``sparsecore_primitives`` refused it by name).
jax 0.12 made ``plsc.bitcast(x, dtype)`` ``pltpu.bitcast(x, dtype, dim=-1)``, which the
interpreter runs through that primitive's CPU lowering (``primitives.py``
``_bitcast_lowering_rule``): with the scaled dimension minormost, ``numpy.ndarray.view``.

:func:`bitcast` is that lowering for the SparseCore primitive; the shapes and dtypes it takes
are those the primitive's abstract eval (the rule Mosaic's lowering builds its result type
from) already checked: the same rank, only the minormost dimension scaled by the ratio of the
widths, its size in bits divisible by the new width, a scalar only at the same width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coremesh.testing.sim import inline
from coremesh.testing.sim.jaxprs import PerJaxpr


def _primitive() -> Any:
    from jax._src.pallas.mosaic import sc_primitives

    return getattr(sc_primitives, "bitcast_p")  # noqa: B009  (gone from jax 0.12)


def bitcast(x: Any, *, dtype: Any) -> Sequence[Any]:
    """``x``'s bits as ``dtype``, the minormost dimension scaled as ``numpy.ndarray.view``
    scales it (jax 0.12's lowering of ``pltpu.bitcast(x, dtype, dim=-1)``)."""
    import jax.numpy as jnp
    from jax import lax
    from jax._src import dtypes

    src, dst = dtypes.itemsize_bits(x.dtype), dtypes.itemsize_bits(dtype)
    if src < dst:  # narrow elements packed into wide ones, lowest index in the lowest bits
        *leading, n = x.shape
        packed = jnp.reshape(x, (*leading, n * src // dst, dst // src))
        return [lax.bitcast_convert_type(packed, dtype)]
    y = lax.bitcast_convert_type(x, dtype)
    if src > dst:  # each wide element split into its narrow ones, lowest bits first
        *leading, n, k = y.shape
        y = jnp.reshape(y, (*leading, n * k))
    return [y]


def _rewrite(jaxpr: Any) -> tuple[Any, list[Any]] | None:
    """``jaxpr`` with each SparseCore bitcast replaced by :func:`bitcast`'s trace, or None if
    this level has none."""
    prim = _primitive()
    if not any(e.primitive is prim for e in jaxpr.eqns):
        return None
    return inline.inline(jaxpr, lambda e: bitcast if e.primitive is prim else None)


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation: a level that binds the SparseCore bitcast
    runs it as :func:`bitcast` (rewritten once per jaxpr). Installed after patch
    ``sparsecore_primitives``, so its refusal of what the simulator does not run never sees
    the primitive."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc._interpret_jaxpr
    rewritten = PerJaxpr(_rewrite)

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        jaxpr, args = inline.spliced(jaxpr, args, rewritten(jaxpr))
        return orig(jaxpr, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr)]
