"""A kernel's CPU lowering runs without ``jax_enable_checks``: the checks are of jax's own
interpreter program, not of the kernel.

JAX's test case turns ``jax_enable_checks`` on for every test (``JaxTestCase``), and a user may
too. Under it jax type-checks each jaxpr it traces. A kernel's jaxpr is checked when
``pallas_call`` (or ``core_map``, ``pl.kernel``) traces it, before any lowering, and that stays.
What the interpreter then traces in the kernel's lowering is its own program: a host callback
for every load, store, DMA and semaphore operation of the kernel, with its grid loops and
conditions; on a chip the same lowering is a Mosaic custom call, and no such program exists.
Checking it tests jax's interpreter, once per kernel shape: on 11 of JAX's paged-attention tests
(jax 0.12.0.1) the lowering of their programs took 2.7 s without the checks against 4.5 and 6.0 s
with them.
"""

from __future__ import annotations

from typing import Any


def _unchecked(rule: Any) -> Any:
    from jax._src import config

    def lowering(ctx: Any, *args: Any, **params: Any) -> Any:
        with config.enable_checks(False):
            return rule(ctx, *args, **params)

    return lowering


def targets() -> list[tuple[Any, str, Any]]:
    """The CPU lowering rule of each kernel primitive, run with the checks off."""
    from coremesh.testing.sim.kernel_effects import kernel_primitives
    from coremesh.testing.sim.lowering_tables import cpu_rule

    return [cpu_rule(p, _unchecked) for p in kernel_primitives()]
