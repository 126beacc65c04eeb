"""Walking a kernel's jaxpr: the simulator's checks look at every equation, nested ones too."""

from __future__ import annotations

from typing import Any


def all_eqns(jaxpr: Any) -> list[Any]:
    """Every equation of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``) and of the jaxprs in its
    equations' parameters (loops, conditionals, ``run_scoped``, ...)."""
    out: list[Any] = []
    stack = [getattr(jaxpr, "jaxpr", jaxpr)]
    while stack:
        inner = stack.pop()
        for eqn in getattr(inner, "eqns", ()):
            out.append(eqn)
            for value in eqn.params.values():
                items = value if isinstance(value, tuple | list) else (value,)
                for item in items:
                    sub = getattr(item, "jaxpr", item)
                    if hasattr(sub, "eqns"):
                        stack.append(sub)
    return out
