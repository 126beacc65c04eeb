"""A simulated kernel inside ``jax.checkpoint``: its callback effects are allowed there.

On a TPU a kernel is a custom call with no effects, so ``jax.checkpoint`` (``jax.remat``) of a
function that calls one, differentiated, recomputes it in the backward pass like any other
operation. In interpret mode the kernel's abstract evaluation declares the effects of the host
callbacks it lowers to (``pallas_core.get_interpret_effects``: jax's ``IOEffect`` and
``OrderedIOEffect``), and remat refuses both: "Effects not supported in partial-eval of
`checkpoint`/`remat`" (jax 0.10.2, ``ad_checkpoint.py``) or "... in AD of ..." (0.12). So a
remat'd layer with a Pallas kernel in it cannot be differentiated on the simulator, stock
interpret mode included.

Inside :func:`coremesh.testing.simulate` a kernel declares these effects as instances of
subclasses of jax's two: jax's registries take them for jax's (they check with ``isinstance``:
lowerable, ordered, allowed in control flow and custom derivatives), and remat allows them. They
are effects of their own (a set holding a kernel's and an ``io_callback``'s keeps both), so an
``io_callback`` of the user's inside ``jax.checkpoint`` keeps jax's effect and is refused as on a
TPU. Where the kernel is lowered, its callbacks take the token of the kernel's ordered effect:
the lowering rule sees it under jax's effect too, and the kernel's token goes on from where the
callbacks left it. Recomputing a kernel is what remat does with it on the chip too: each
interpreted call allocates its own buffers.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def kernel_effects() -> dict[Any, Any]:
    """jax's two IO effects -> the effect a simulated kernel declares in its place."""
    from jax._src import callback, effects

    def allowed_under_remat(base: type[Any]) -> Any:
        kind = type(f"Kernel{base.__name__}", (base,), {"__doc__": "A kernel's host callbacks."})
        effects.remat_allowed_effects.add_type(kind)
        return kind()

    return {
        callback._OrderedIOEffect: allowed_under_remat(callback.OrderedIOEffect),
        callback._IOEffect: allowed_under_remat(callback.IOEffect),
    }


def kernel_primitives() -> list[Any]:
    """The primitives whose abstract evaluation declares the interpret-mode effects
    (``core_map`` is one up to jax 0.12.0.1; 0.12.1 traces it as ``mpmd_map``)."""
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas import mpmd, pallas_call

    found = [pallas_call.pallas_call_p, mpmd.mpmd_map_p, getattr(pallas_core, "core_map_p", None)]
    return [p for p in found if p is not None]


def _with_kernel_tokens(rule: Any) -> Any:
    """``rule`` with each kernel effect's token under jax's effect too (the interpreter's
    ``io_callback``s look it up there) and, after it, the kernel's token where they left it."""
    from jax._src.interpreters import mlir

    def lowering(ctx: Any, *args: Any, **params: Any) -> Any:
        tokens = dict(ctx.tokens_in.items())
        ours = {base: k for base, k in kernel_effects().items() if k in tokens}
        if not ours or any(base in tokens for base in ours):
            return rule(ctx, *args, **params)
        inner = ctx.replace(
            tokens_in=mlir.TokenSet({**tokens, **{b: tokens[k] for b, k in ours.items()}}),
            tokens_out=None,
        )
        out = rule(inner, *args, **params)
        if inner.tokens_out is not None:
            after = dict(inner.tokens_out.items())
            for base, kernel in ours.items():
                start = tokens[kernel]
                moved = [after[e] for e in (base, kernel) if after.get(e, start) != start]
                # The interpreter's callbacks move jax's token; a rule that lowered a kernel of
                # its own would move the kernel's. Never both: one chain goes on.
                assert len(moved) < 2, "a kernel lowering moved both token chains"
                if moved:
                    tokens[kernel] = moved[0]
            ctx.set_tokens_out(mlir.TokenSet(tokens))  # ctx.tokens_in's effects, in its order
        return out

    return lowering


def targets() -> list[tuple[Any, str, Any]]:
    """The interpret-mode effects kernels declare (``pallas_call``, ``core_map`` and
    ``pl.kernel`` read them when they are traced), and the CPU lowering of each kernel."""
    from jax._src.pallas.mosaic.interpret import params

    from coremesh.testing.sim.lowering_tables import cpu_rule

    def get_interpret_effects() -> set[Any]:
        return set(kernel_effects().values())

    out: list[tuple[Any, str, Any]] = [(params, "get_interpret_effects", get_interpret_effects)]
    out += [cpu_rule(p, _with_kernel_tokens) for p in kernel_primitives()]
    return out
