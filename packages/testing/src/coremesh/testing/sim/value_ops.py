"""TensorCore value operations with no CPU lowering, run as the jax.numpy they specify.

The interpreter binds ``pltpu.pack_elementwise``, ``pltpu.unpack_elementwise`` and
``pltpu.stochastic_round`` as they are, and XLA:CPU has no rule for them: the core's program
fails to compile inside a host callback ("MLIR translation rule for primitive
'unpack_elementwise' not found for platform cpu", reaching the user as a raw ``JaxRuntimeError:
INTERNAL: CpuCallback error``). Each kernel jaxpr is rewritten (:mod:`coremesh.testing.sim.inline`)
so they compute what their docstrings (``jax._src.pallas.mosaic.primitives``) specify:

* ``pack_elementwise(xs, packed_dtype)``: each source converted to ``packed_dtype`` (f32 to bf16
  rounds to nearest even; an integer keeps its low bits), the ``i``-th in bits ``[i*p, (i+1)*p)``
  of an unsigned word as wide as the sources;
* ``unpack_elementwise(x, index, ...)``: bits ``[index*p, (index+1)*p)`` of each word, read as
  ``packed_dtype`` (sign-extended if signed) and converted to ``unpacked_dtype``;
* ``stochastic_round(x, bits, target_dtype)``: one of the two ``target_dtype`` values around
  ``x``, the upper with probability equal to ``x``'s distance from the lower over the gap, drawn
  from the top 24 of ``bits``; exact and non-finite values convert as ``astype`` does. The chip's
  own use of the random bits is not documented: the values it can return are the same, the
  choice for given bits may differ;
* ``trace_value(label, value)`` (jax 0.10 and 0.11; 0.12's interpreter drops it itself): nothing.
  It puts the value in the profiler's trace, which the simulator does not produce;
* ``touch(ref)`` (``add_dependency``): nothing. It is a fake read and write of the ref that keeps
  Mosaic from reordering accesses around it; the interpreter runs a core's accesses in program
  order. No interpreter has a rule for it: its generic fallback bound it on the ref's buffer id,
  whose read effect then named no input of the traced program ("``JaxprInputEffect`` ... does
  not have a corresponding jaxpr input" on 0.10.2, "'Fake' object has no attribute 'arg_names'"
  from 0.11), so any kernel calling ``pltpu.touch`` failed (JAX's MPMD ``test_vmap``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from coremesh.core import jax_versions
from coremesh.testing.sim.inline import Rule


def _width(dtype: Any) -> int:
    from jax._src import dtypes

    return int(dtypes.itemsize_bits(jnp.dtype(dtype)))


def _raw_bits(x: Any) -> Any:
    """The bits of each element of ``x`` as uint32 (low bits; sub-byte integers too)."""
    width = _width(x.dtype)
    if width >= 8:
        unsigned = lax.bitcast_convert_type(x, jnp.dtype(f"uint{width}"))
        return unsigned.astype(jnp.uint32)
    return x.astype(jnp.int32).astype(jnp.uint32) & jnp.uint32((1 << width) - 1)


def _packed_bits(x: Any, packed: Any) -> Any:
    """``x`` converted to ``packed``, as the low bits of uint32 words."""
    p = _width(packed)
    if jnp.issubdtype(packed, jnp.floating):
        return _raw_bits(x.astype(packed))
    return x.astype(jnp.int32).astype(jnp.uint32) & jnp.uint32((1 << p) - 1)


def _pack(*xs: Any, packed_dtype: Any) -> Sequence[Any]:
    p = _width(packed_dtype)
    word = jnp.zeros(xs[0].shape, jnp.uint32)
    for i, x in enumerate(xs):
        word = word | (_packed_bits(x, packed_dtype) << jnp.uint32(i * p))
    return [word.astype(jnp.dtype(f"uint{_width(xs[0].dtype)}"))]


def _unpack(x: Any, *, index: int, packed_dtype: Any, unpacked_dtype: Any) -> Sequence[Any]:
    p = _width(packed_dtype)
    field = (_raw_bits(x) >> jnp.uint32(index * p)) & jnp.uint32((1 << p) - 1)
    if jnp.issubdtype(packed_dtype, jnp.floating):
        if p < 8:
            raise NotImplementedError(f"not simulated: unpacking {jnp.dtype(packed_dtype)}")
        value = lax.bitcast_convert_type(field.astype(jnp.dtype(f"uint{p}")), packed_dtype)
    elif jnp.issubdtype(packed_dtype, jnp.signedinteger):
        signed = field.astype(jnp.int32)
        value = jnp.where(signed >= (1 << (p - 1)), signed - (1 << p), signed)
    else:
        value = field
    return [value.astype(unpacked_dtype)]


def _stochastic_round(x: Any, bits: Any, *, target_dtype: Any) -> Sequence[Any]:
    nearest = x.astype(target_dtype)
    wide = nearest.astype(jnp.float32)
    info = jnp.finfo(target_dtype)
    lower = jnp.where(
        wide > x, jnp.nextafter(nearest, jnp.asarray(info.min, target_dtype)), nearest
    )
    upper = jnp.where(
        wide < x, jnp.nextafter(nearest, jnp.asarray(info.max, target_dtype)), nearest
    )
    lo, hi = lower.astype(jnp.float32), upper.astype(jnp.float32)
    gap = hi - lo
    fraction = jnp.where(gap > 0, (x - lo) / jnp.where(gap > 0, gap, 1), 0)
    draw = (bits >> jnp.uint32(8)).astype(jnp.float32) * jnp.float32(2.0**-24)
    rounded = jnp.where(draw < fraction, upper, lower)
    return [jnp.where(jnp.isfinite(x) & jnp.isfinite(wide), rounded, nearest)]


#: The jax release whose interpreter drops ``pltpu.trace_value`` itself.
TRACE_VALUE_INTERPRETED_SINCE = "0.12.0"


def _trace_value(value: Any, *, label: str) -> Sequence[Any]:
    del value, label  # it annotates the profiler's trace, which the simulator does not make
    return []


def _touch(ref: Any) -> Sequence[Any]:
    del ref  # orders Mosaic's accesses; the interpreter's are in program order already
    return []


def rules() -> dict[Any, Rule]:
    """Each primitive with its rule (all exist from jax 0.10.2 on)."""
    from jax._src.pallas.mosaic import primitives as tpu

    named: dict[str, Rule] = {
        "pack_elementwise_p": _pack,
        "unpack_elementwise_p": _unpack,
        "stochastic_round_p": _stochastic_round,
        "touch_p": _touch,
    }
    if not jax_versions.at_least(TRACE_VALUE_INTERPRETED_SINCE):
        named["trace_value_p"] = _trace_value
    return {getattr(tpu, n): r for n, r in named.items() if hasattr(tpu, n)}


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation."""
    import threading
    import weakref

    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim import inline

    orig = ipc._interpret_jaxpr
    table = rules()
    cache: weakref.WeakKeyDictionary[Any, tuple[Any, list[Any]] | None] = (
        weakref.WeakKeyDictionary()
    )
    lock = threading.Lock()

    def rule_of(eqn: Any) -> Rule | None:
        return table.get(eqn.primitive)

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        with lock:
            if jaxpr not in cache:
                wanted = any(rule_of(e) is not None for e in jaxpr.eqns)
                cache[jaxpr] = inline.inline(jaxpr, rule_of) if wanted else None
            done = cache[jaxpr]
        jaxpr, args = inline.spliced(jaxpr, args, done)
        return orig(jaxpr, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr)]
