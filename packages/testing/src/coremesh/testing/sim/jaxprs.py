"""Walking a kernel's jaxpr: the simulator's checks look at every equation, nested ones too,
and at the memory space of each ref."""

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


def memory_space(aval: Any) -> str:
    """The memory space of a ref's aval, as a lower-case name: ``"vmem"``, ``"smem"``,
    ``"any"``, ...; ``"none"`` or ``"default"`` where the kernel left it to the default."""
    space = getattr(aval, "memory_space", None)
    return str(space).lower().rsplit(".", 1)[-1] if space is not None else "none"
