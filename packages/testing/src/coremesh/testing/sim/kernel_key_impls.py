"""PRNG implementations written as Pallas kernels (``pallas_threefry2x32``, ``pallas_philox4x32``)
under ``jax.jit``: their key operations carry the interpreted kernel's ordered effect.

jax lowers ``random_bits`` (and ``random_seed``, ``random_split``, ``random_fold_in``) by tracing
the key implementation's function inside the lowering rule (``prng.py``, ``mlir.lower_fun``).
The primitives are declared effect-free, which a compiled kernel is; an interpreted one is a
chain of *ordered* io_callbacks (``interpret_pallas_call.py``: "to ensure that execution of this
interpreted kernel cannot overlap with the interpretation of any other kernel"). The rule then
finds no token for that effect and fails with ``KeyError: OrderedIOEffect`` in any jitted
function, stock interpret mode included (``jax.random.bits(jax.random.key(0,
impl="pallas_threefry2x32"), ...)`` under ``jit`` or ``shard_map``).

Inside the simulator these primitives declare the ordered effects their implementation's
function has (found by tracing it once per implementation, primitive and parameters), so the
enclosing computation threads the token to them and the kernel stays ordered with every other.
Implementations without kernels trace effect-free and keep jax's own rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_PRIMITIVES = ("random_seed_p", "random_split_p", "random_fold_in_p", "random_bits_p")


def _key_aval(impl: Any) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(tuple(impl.key_shape), jnp.uint32)


def _traced(name: str, impl: Any, dtypes: tuple[Any, ...], params: tuple[Any, ...]) -> Any:
    """One key, not the batch: the function jax's lowering rule would trace, on operands of
    ``dtypes``."""
    import jax
    import jax.numpy as jnp

    kw = dict(params)
    if name == "random_seed_p":
        return jax.make_jaxpr(impl.seed)(jax.ShapeDtypeStruct((), dtypes[0]))
    key = _key_aval(impl)
    if name == "random_split_p":
        return jax.make_jaxpr(lambda k: impl.split(k, kw["shape"]))(key)
    if name == "random_fold_in_p":
        msg = jax.ShapeDtypeStruct((), jnp.uint32)
        return jax.make_jaxpr(impl.fold_in)(key, msg)
    return jax.make_jaxpr(lambda k: impl.random_bits(k, kw["bit_width"], kw["shape"]))(key)


@functools.lru_cache(maxsize=256)
def ordered_effects(
    name: str, impl: Any, dtypes: tuple[Any, ...], params: tuple[Any, ...]
) -> frozenset[Any]:
    """The ordered effects of ``impl``'s function for primitive ``name`` (none when it is plain
    jax, or cannot be traced here: then jax's own rule decides, as without the simulator)."""
    from jax._src import effects

    if not str(getattr(impl, "name", "")).startswith("pallas"):
        return frozenset()
    try:
        closed = _traced(name, impl, dtypes, params)
    except Exception:
        return frozenset()
    return frozenset(effects.ordered_effects.filter_in(closed.effects))


def _key_impl(name: str, avals: tuple[Any, ...], params: dict[str, Any]) -> Any:
    if name == "random_seed_p":
        return params["impl"]
    return getattr(avals[0].dtype, "_impl", None)


def _effectful(name: str, stock: Callable[..., Any]) -> Callable[..., Any]:
    def abstract_eval(*avals: Any, **params: Any) -> Any:
        out, effs = stock(*avals, **params)
        impl = _key_impl(name, avals, params)
        if impl is None:
            return out, effs
        dtypes = tuple(a.dtype for a in avals)  # the effects do not depend on the batch shape
        extra = ordered_effects(name, impl, dtypes, tuple(sorted(params.items(), key=str)))
        return out, (set(effs) | extra) if extra else effs

    return abstract_eval


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src.random import prng

    found = []
    for name in _PRIMITIVES:
        prim = getattr(prng, name)
        found.append((prim, "abstract_eval", _effectful(name, prim.abstract_eval)))
    return found
