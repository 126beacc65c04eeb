"""Division by a scalar as one rule in every program: ``x / c`` is ``x * (1 / c)``.

XLA's algebraic simplifier rewrites a floating division by a value broadcast from a scalar into
a multiplication by its reciprocal (one division instead of one per element), but not in every
program: in the one ``jax.vjp`` compiles for ``lambda x: x / 3.0`` the scalar is also an output
(the residual) and the division stays. On the CPU the two differ in the last bit of a third of
the elements, so a function and its ``vjp`` give different numbers. The chip's rounding turns
such a bit into more: a ``float32`` product at the default precision rounds its operands to
``bfloat16`` (:mod:`coremesh.testing.sim.chip_matmul`), and JAX's splash attention test
``test_splash_attention_custom_bwd`` compares ``attention_reference`` under ``jax.vjp`` with
``attention_reference_custom`` at ``atol=1e-5``: its ``tanh(logits / soft_cap)`` differs in the
last bit, the softmax's ``bfloat16`` rounding flips, and the outputs differ by 1.5e-5.

Inside :func:`coremesh.testing.simulate` the CPU lowering of ``div`` makes the rewrite itself
whenever the divisor is a scalar and the dividend is not, so every program computes ``x / c``
alike, as the programs the simplifier rewrites already do. Integer division lowers as upstream.
Like :mod:`~coremesh.testing.sim.chip_matmul`, the rule is keyed on a jax configuration state in
every jit cache key, so a function compiled outside the simulator is compiled again inside it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

#: The jax configuration state that turns the rule on (:func:`sync`).
STATE_NAME = "coremesh_scalar_division"


@functools.cache
def state() -> Any:
    """The configuration state: on inside a simulator that has the patch (registered once)."""
    from jax._src import config

    return config.bool_state(
        STATE_NAME,
        False,
        help="lower a floating division by a scalar as a multiplication by its reciprocal "
        "(coremesh)",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def sync(on: bool) -> None:
    """Turn the rule on (``on``: the patch is in force in the innermost simulator) or off.
    The patches call it as a context opens and closes."""
    import jax

    from coremesh.testing.sim.chip import active_slice

    wanted = on and active_slice() is not None
    if state().value != wanted:
        jax.config.update(STATE_NAME, wanted)


def rewritten(avals_in: Any, aval_out: Any) -> bool:
    """Is this ``div`` one the rule rewrites: floating, a scalar divisor, a non-scalar dividend?"""
    _, divisor = avals_in
    return bool(
        np.issubdtype(np.dtype(aval_out.dtype), np.floating)
        and divisor.ndim == 0
        and aval_out.ndim > 0
    )


def lowering(base: Any) -> Any:
    """The CPU lowering rule of ``div``: ``base`` (upstream's) unless the state is on and
    :func:`rewritten` covers the division."""
    from jax._src.interpreters import mlir
    from jax._src.lax import lax as lax_internal
    from jax._src.lib.mlir.dialects import hlo

    def rule(ctx: Any, x: Any, y: Any, **params: Any) -> Any:
        if not state().value or not rewritten(ctx.avals_in, ctx.avals_out[0]):
            return base(ctx, x, y, **params)
        divisor = ctx.avals_in[1]
        reciprocal = hlo.divide(mlir.full_like_aval(ctx, 1, divisor), y)
        return lax_internal._nary_lower_hlo(hlo.multiply, ctx, x, reciprocal)

    return rule


def targets() -> list[tuple[Any, str, Any]]:
    """The patch: the CPU lowering rule of ``div`` (the state, :func:`sync`, turns it on)."""
    from jax import lax

    from coremesh.testing.sim.lowering_tables import cpu_rule

    state()
    return [cpu_rule(lax.div_p, lowering)]
