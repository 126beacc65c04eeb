"""NaN-propagating max and min, as ``jax.numpy`` defines them, on every target.

XLA:CPU's reductions drop NaN: ``jnp.max`` over a (16, 256) float32 array holding a NaN returns
the largest number (its vectorised reduce skips NaN lanes), and so do ``jax.lax.pmax`` and
``pmin`` across CPU devices, while numpy and ``jnp``'s documented semantics return NaN. The
simulator runs kernels on XLA:CPU, so ``reduce`` would lose NaN there and only there. These
helpers fold a separate "is any NaN" flag (a max of 0/1, which no backend gets wrong) and select
NaN where it is set; elementwise combines check their operands the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

_FOLD: dict[str, Callable[..., Any]] = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}
_COMBINE: dict[str, Callable[[Any, Any], Any]] = {
    "sum": jnp.add,
    "max": jnp.maximum,
    "min": jnp.minimum,
}
_ACROSS: dict[str, Callable[..., Any]] = {
    "sum": jax.lax.psum,
    "max": jax.lax.pmax,
    "min": jax.lax.pmin,
}

OPS = tuple(_FOLD)


def _orders(op: str, dtype: Any) -> bool:
    """Whether NaN needs carrying: max/min of a floating dtype (a sum propagates it itself)."""
    return op != "sum" and bool(jnp.issubdtype(dtype, jnp.floating))


def _nan_flag(x: Any) -> Any:
    return jnp.where(jnp.isnan(x), 1.0, 0.0).astype(jnp.float32)


def fold(op: str, x: Any, axis: int, *, keepdims: bool = False) -> Any:
    """``jnp.sum/max/min(x, axis)``; a max/min with a NaN along ``axis`` is NaN."""
    out = _FOLD[op](x, axis=axis, keepdims=keepdims)
    if not _orders(op, x.dtype):
        return out
    has_nan = jnp.max(_nan_flag(x), axis=axis, keepdims=keepdims) > 0
    return jnp.where(has_nan, jnp.nan, out).astype(out.dtype)


def combine(op: str, a: Any, b: Any) -> Any:
    """``a + b``, ``jnp.maximum(a, b)`` or ``jnp.minimum(a, b)``; NaN if either is NaN."""
    out = _COMBINE[op](a, b)
    if not _orders(op, out.dtype):
        return out
    return jnp.where(jnp.isnan(a), a, jnp.where(jnp.isnan(b), b, out))


def across(op: str, x: Any, axis_name: str) -> Any:
    """``psum/pmax/pmin(x, axis_name)``; a max/min is NaN where any participant's is."""
    out = _ACROSS[op](x, axis_name)
    if not _orders(op, x.dtype):
        return out
    has_nan = jax.lax.pmax(_nan_flag(x), axis_name) > 0
    return jnp.where(has_nan, jnp.nan, out).astype(out.dtype)
