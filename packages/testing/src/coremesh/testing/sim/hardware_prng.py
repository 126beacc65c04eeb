"""The TensorCore's hardware PRNG (``pltpu.prng_seed`` / ``pltpu.prng_random_bits``), per core.

Pallas' interpreter ignores ``prng_seed`` and answers every ``prng_random_bits`` with zeros
(interpret_pallas_call.py: "TODO(jburnim): Implement this properly?"), so a kernel that draws
dropout masks or ``pltpu.stateful_uniform`` samples from it runs on constant bits in silence.

Simulated so: each core of each simulated device has a generator state, which ``prng_seed``
sets from its seed values (mixed, as the chip mixes several) and ``prng_random_bits`` advances.
A draw is uniform 32-bit words from numpy's PCG64 seeded with the seeds and the number of draws
since, so the same seeds give the same bits, other seeds other bits, and each draw new bits. The
chip's own generator is not documented: the bits are not the chip's, only their contract is.
A core that draws before any seed draws from seed 0.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from coremesh.testing.sim.jaxprs import PerJaxpr

_lock = threading.Lock()
#: (device, core) -> [seed values, draws since the seed].
_state: dict[tuple[int, int], list[Any]] = {}


def _seed(token: Any, device: Any, core: Any, *seeds: Any) -> Any:
    with _lock:
        _state[(int(device), int(core))] = [tuple(int(s) for s in seeds), 0]
    return token


def _bits(
    token: Any, device: Any, core: Any, *, shape: tuple[int, ...], dtype: Any
) -> tuple[Any, Any]:
    with _lock:
        state = _state.setdefault((int(device), int(core)), [(0,), 0])
        seeds, draws = state
        state[1] = draws + 1
    words = [s & 0xFFFFFFFF for s in seeds]
    rng = np.random.Generator(np.random.PCG64([len(words), *words, draws]))
    return token, rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(dtype)


def _draws(eqn: Any) -> bool:
    """Does ``eqn`` draw from the hardware PRNG: ``prng_random_bits``, or jax.random's
    ``random_bits`` on the stateful key ``pltpu.stateful_uniform`` and the like sample with?"""
    from jax._src.pallas.mosaic import primitives as mosaic_primitives
    from jax._src.pallas.mosaic import random as pallas_random
    from jax._src.random import prng

    if eqn.primitive is mosaic_primitives.prng_random_bits_p:
        return True
    if eqn.primitive is not prng.random_bits_p:
        return False
    impl = getattr(eqn.invars[0].aval.dtype, "_impl", None)
    return impl is pallas_random.tpu_internal_stateful_impl


def _uses_prng(jaxpr: Any) -> bool:
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    return any(eqn.primitive is mosaic_primitives.prng_seed_p or _draws(eqn) for eqn in jaxpr.eqns)


def _callback(eqn: Any) -> Any:
    """The host call standing in for one PRNG equation, as a function of ``(token, device,
    core, *the equation's operands)`` returning ``(token, *its results)``."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax._src.pallas.mosaic import primitives as mosaic_primitives
    from jax.experimental import io_callback

    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    if eqn.primitive is mosaic_primitives.prng_seed_p:

        def seed(token: Any, device: Any, core: Any, *seeds: Any) -> list[Any]:
            return [io_callback(_seed, scalar, token, device, core, *seeds)]

        return seed
    aval = eqn.outvars[0].aval
    shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
    bits = functools.partial(_bits, shape=shape, dtype=dtype)

    def draw(token: Any, device: Any, core: Any, *_: Any) -> list[Any]:
        return list(
            io_callback(bits, (scalar, jax.ShapeDtypeStruct(shape, dtype)), token, device, core)
        )

    return draw


def rewrite(jaxpr: Any) -> Any:
    """``jaxpr`` (this level; the interpreter rewrites nested ones as it reaches them) taking
    ``(token, device, core, *constvars)`` as constants and its ``invars``, its PRNG equations
    host callbacks on that core's generator, run in the level's order: each takes the token
    the one before returned, the first the interpreter's token as the level starts (unordered
    callbacks, as the interpreter's own; an ordered one has no token in a core's program). The
    other equations stay as they are (the interpreter answers ``axis_index`` and the like)."""
    import jax.numpy as jnp
    from jax._src import core as jax_core
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    from coremesh.testing.sim import compat, inline

    scalar = jax_core.ShapedArray((), jnp.int32)
    lead = [jax_core.Var(scalar) for _ in range(3)]
    token, device, core = lead
    subst: dict[Any, Any] = {}

    def sub(atom: Any) -> Any:
        return atom if isinstance(atom, jax_core.Literal) else subst.get(atom, atom)

    eqns: list[Any] = []
    for eqn in jaxpr.eqns:
        if not (eqn.primitive is mosaic_primitives.prng_seed_p or _draws(eqn)):
            eqns.append(eqn.replace(invars=[sub(v) for v in eqn.invars]))
            continue
        avals = [scalar] * 3 + [v.aval for v in eqn.invars]
        inner = inline.trace_body(_callback(eqn), avals)
        local = dict(zip(inner.invars, [token, device, core, *map(sub, eqn.invars)], strict=True))
        for e in inner.eqns:
            eqns.append(
                e.replace(
                    invars=[
                        v if isinstance(v, jax_core.Literal) else local.get(v, v) for v in e.invars
                    ]
                )
            )
        token, *outs = (
            v if isinstance(v, jax_core.Literal) else local.get(v, v) for v in inner.outvars
        )
        subst.update(zip(eqn.outvars, outs, strict=True))
    effects = jax_core.join_effects(jaxpr.effects, *(e.effects for e in eqns))
    # The three lead as constants: a jaxpr's debug info names its invars, not its constvars.
    return compat.open_jaxpr(
        [*lead, *jaxpr.constvars],
        list(jaxpr.invars),
        [sub(v) for v in jaxpr.outvars],
        eqns,
        effects,
        jaxpr.debug_info,
    )


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation."""
    import jax.numpy as jnp
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc._interpret_jaxpr
    rewritten = PerJaxpr(lambda jaxpr: rewrite(jaxpr) if _uses_prng(jaxpr) else None)

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        done = rewritten(jaxpr)
        if done is None:
            return orig(jaxpr, *args, ctx=ctx, token=token)
        ids = (
            jnp.asarray(token, jnp.int32),
            jnp.int32(ctx.device_id),
            jnp.int32(ctx.local_core_id),
        )
        return orig(done, *ids, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr)]
