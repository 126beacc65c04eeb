"""Pinned buffers (``pin`` / ``unpin`` of ``jax._src.state.primitives``) on the simulator.

A jitted program may pin an array (a buffer that stays where it is), hand it to a
``pallas_call`` that aliases it to a result, and unpin the result. Upstream lowers a pinned value
for TPU only: its type is a memref (``_linval_to_mlir_type``), ``pin`` and ``unpin`` are the custom
calls "Pin" and "Unpin", and the interpreter's callback has no XLA shape for the kernel's pinned
operand ("No xla_shape_handler for type: AbstractLinVal", jax 0.10.2 to 0.12.0.1). On a simulated
device a pinned value is its array: its type is the array's tensor, ``pin`` and ``unpin`` pass it
on, and the kernel sees the array, aliased to its result as the program asked.
"""

from __future__ import annotations

from typing import Any

from coremesh.testing.sim.lowering_tables import table_entry


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src import core
    from jax._src.interpreters import mlir
    from jax._src.pallas import pallas_call
    from jax._src.state import primitives
    from jax._src.state.types import AbstractLinVal

    array_types = mlir.ir_type_handlers[core.ShapedArray]
    cpu = mlir._platform_specific_lowerings["cpu"]
    kernel = cpu.get(pallas_call.pallas_call_p) or mlir._lowerings[pallas_call.pallas_call_p]

    def plain(aval: Any) -> Any:
        return aval.inner_aval if isinstance(aval, AbstractLinVal) else aval

    def pass_on(ctx: Any, x: Any, **params: Any) -> Any:  # noqa: ARG001 (a lowering rule's form)
        return [x]

    def lower_pallas_call(ctx: Any, *args: Any, **params: Any) -> Any:
        avals = (*ctx.avals_in, *(ctx.avals_out or ()))
        if not any(isinstance(a, AbstractLinVal) for a in avals):
            return kernel.rule(ctx, *args, **params)
        inner = ctx.replace(
            avals_in=[plain(a) for a in ctx.avals_in],
            avals_out=[plain(a) for a in ctx.avals_out],
        )
        out = kernel.rule(inner, *args, **params)
        if inner.tokens_out is not None:  # the interpreter's ordered callbacks
            ctx.set_tokens_out(inner.tokens_out)
        return out

    def entry(rule: Any, inline: Any = True) -> Any:
        # jax 0.12.1 keeps a core.Inline in the entry (True is its JAX_LATE); before, a bool.
        inline_enum = getattr(core, "Inline", None)
        if inline_enum is not None and isinstance(inline, bool):
            inline = inline_enum.JAX_LATE if inline else inline_enum.AUTO
        return mlir.LoweringRuleEntry(rule, inline)

    return [
        (
            table_entry(mlir.ir_type_handlers, AbstractLinVal),
            "entry",
            lambda aval: array_types(aval.inner_aval),
        ),
        (table_entry(cpu, primitives.pin_p), "entry", entry(pass_on)),
        (table_entry(cpu, primitives.unpin_p), "entry", entry(pass_on)),
        (
            table_entry(cpu, pallas_call.pallas_call_p),
            "entry",
            entry(lower_pallas_call, kernel.inline),
        ),
    ]
