"""A kernel primitive the interpreter has no rule for, answered by the simulator on the core's
token (``plsc.fetch_and_add``, ``pl.semaphore_read``).

At each jaxpr level the interpreter evaluates, the primitive's equations become one of the
simulator's own primitives, registered as an interpreter impl. The interpreter's
loop traces an impl and hands its jaxpr (that one equation) back to ``_interpret_jaxpr`` with
its token as it stands at the equation; the wrapper here answers that jaxpr with ``answer``,
which makes one host callback on that token, so the operation is ordered after the core's loads,
stores, signals and waits before it and before those after it. (A callback on a token of its
own, as :mod:`.hardware_prng` makes, is not: XLA:CPU ran such adds before the stores a barrier
had ordered first.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from coremesh.testing.sim.jaxprs import PerJaxpr

#: ``answer(jaxpr, args, ctx, token) -> (token, outputs)`` for the impl's one-equation jaxpr.
Answer = Callable[[Any, Sequence[Any], Any, Any], Any]


def _bind(primitive: Any, *args: Any, **params: Any) -> Any:
    """The interpreter impl: the same primitive, on the interpreter's values (buffer or
    semaphore ids in place of refs)."""
    return primitive.bind(*args, **params)


def targets(
    original: Any,
    primitive: Any,
    params: Callable[[Any], dict[str, Any]],
    answer: Answer,
    applies: Callable[[Any], bool] = lambda ctx: True,
) -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation and its table of impls: each equation of
    jax's ``original`` becomes the simulator's ``primitive`` with ``params(eqn)``, answered by
    ``answer``; ``applies(ctx)``: which kernels it serves (the others keep ``original``)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    def rewrite(jaxpr: Any) -> Any | None:
        if not any(eqn.primitive is original for eqn in jaxpr.eqns):
            return None
        eqns = [
            eqn.replace(primitive=primitive, params=params(eqn))
            if eqn.primitive is original
            else eqn
            for eqn in jaxpr.eqns
        ]
        return jaxpr.replace(eqns=eqns)

    orig = ipc._interpret_jaxpr
    rewritten = PerJaxpr(rewrite)
    impls = {**ipc._interpret_impls, primitive: functools.partial(_bind, primitive)}

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        if not applies(ctx):
            return orig(jaxpr, *args, ctx=ctx, token=token)
        open_jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # jax 0.12 passes an impl's ClosedJaxpr
        eqns = open_jaxpr.eqns
        if len(eqns) == 1 and eqns[0].primitive is primitive:
            return answer(open_jaxpr, args, ctx, token)
        done = rewritten(jaxpr)
        return orig(jaxpr if done is None else done, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr), (ipc, "_interpret_impls", impls)]


def operands(jaxpr: Any, args: Sequence[Any]) -> list[Any]:
    """The values of the one equation's operands of an impl's ``jaxpr`` called with ``args``."""
    from jax._src import core as jax_core

    (eqn,) = jaxpr.eqns
    env = dict(zip([*jaxpr.constvars, *jaxpr.invars], args, strict=True))
    return [v.val if isinstance(v, jax_core.Literal) else env[v] for v in eqn.invars]
