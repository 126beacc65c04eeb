"""Rewriting a kernel's jaxpr before the interpreter runs it: equations the interpreter cannot run
as they are (no rule of its own, no CPU lowering) are replaced by what a rule traces for them.

A rule is a function of the equation's operands and params that returns its results, written in
operations the interpreter runs (jax.numpy, ref reads and writes). :func:`inline` traces each
rule on the equation's input types and splices the traced equations in its place; the constants
the traces close over become extra leading inputs of the new jaxpr.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jax._src import api_util
from jax._src import core as jax_core
from jax._src import linear_util as lu
from jax._src.interpreters import partial_eval as pe

Rule = Callable[..., Sequence[Any]]

#: The equation whose rule is being traced: a rule's run-time checks name the user's line from
#: it (the traced equations carry the rule's own source info, which the shadow reads).
_replacing: contextvars.ContextVar[Any] = contextvars.ContextVar("coremesh_replacing", default=None)


def replaced_eqn() -> Any:
    """The equation whose rule is being traced now, or None outside :func:`trace_rule`."""
    return _replacing.get()


@contextlib.contextmanager
def _replacing_eqn(eqn: Any) -> Iterator[None]:
    token = _replacing.set(eqn)
    try:
        yield
    finally:
        _replacing.reset(token)


def trace_rule(rule: Rule, eqn: Any) -> tuple[Any, list[Any]]:
    """Trace one rewrite rule on the equation's input types into a jaxpr."""
    in_avals = [v.aval for v in eqn.invars]

    def run(*args: Any) -> list[Any]:
        return list(rule(*args, **eqn.params))

    debug = api_util.debug_info("coremesh simulator", run, in_avals, {})
    with _replacing_eqn(eqn):
        jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(run, debug_info=debug), in_avals)
    return jaxpr, list(consts)


def trace_body(body: Callable[..., list[Any]], avals: Sequence[Any]) -> Any:
    """``body`` (a kernel body written in Python, or a jaxpr level re-evaluated) as an open
    jaxpr on arguments of ``avals``; it may not close over arrays."""
    debug = api_util.debug_info("coremesh simulator", body, avals, {})
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(body, debug_info=debug), avals)
    assert not consts, consts
    return jaxpr


def retrace_kernel(grid_mapping: Any, body: Callable[..., list[Any]], avals: Sequence[Any]) -> Any:
    """A kernel body written around the old one (see :func:`eval_kernel`) as the jaxpr a
    ``pallas_call`` takes, traced inside the kernel's grid and mesh axes as it first was (so a
    body that asks ``lax.axis_index('core')`` traces)."""
    with grid_mapping.trace_env():
        return trace_body(body, avals)


def eval_kernel(jaxpr: Any, refs: Sequence[Any]) -> None:
    """Run a kernel body ``jaxpr`` (no results) on ``refs``, inside a trace of a new body.
    Some refs stand in for others (a scratch semaphore typed as the interpreter types them, an
    operand's ref for its aliased result's): with ``jax_enable_checks`` on, as in JAX's tests,
    eval_jaxpr would refuse those bindings."""
    from jax._src import config

    with config.enable_checks(False):
        jax_core.eval_jaxpr(jaxpr, (), *refs)


def kernel_steps(grid_mapping: Any) -> int | None:
    """The grid steps of a kernel, None if a grid size is only known when it runs."""
    grid = grid_mapping.grid
    if not all(isinstance(g, int) for g in grid):
        return None
    return int(math.prod(grid))


def inline(jaxpr: Any, rule_of: Callable[[Any], Rule | None]) -> tuple[Any, list[Any]]:
    """``jaxpr`` with each equation that ``rule_of`` gives a rule for replaced by the rule's
    trace; the new jaxpr takes ``(*old_constvars, *extra_consts, *invars)``."""
    subst: dict[Any, Any] = {}

    def sub(atom: Any) -> Any:
        return atom if isinstance(atom, jax_core.Literal) else subst.get(atom, atom)

    eqns: list[Any] = []
    extra_vars: list[Any] = []
    extra_consts: list[Any] = []
    for eqn in jaxpr.eqns:
        rule = rule_of(eqn)
        if rule is None:
            eqns.append(eqn.replace(invars=[sub(v) for v in eqn.invars]))
            continue
        inner, consts = trace_rule(rule, eqn)
        extra_vars += inner.constvars
        extra_consts += consts
        local = dict(zip(inner.invars, (sub(v) for v in eqn.invars), strict=True))
        for e in inner.eqns:
            eqns.append(
                e.replace(
                    invars=[
                        v if isinstance(v, jax_core.Literal) else local.get(v, v) for v in e.invars
                    ],
                    effects=_renamed(e.effects, local),
                )
            )
        for out, new in zip(eqn.outvars, inner.outvars, strict=True):
            subst[out] = new if isinstance(new, jax_core.Literal) else local.get(new, new)
    new = jax_core.Jaxpr(
        [*jaxpr.constvars, *extra_vars],
        jaxpr.invars,
        [sub(v) for v in jaxpr.outvars],
        eqns,
        jaxpr.effects,
        jaxpr.debug_info,
    )
    return new, extra_consts


def _renamed(effs: Any, local: dict[Any, Any]) -> Any:
    """An equation's effects with the inputs they name renamed as its operands are (an
    equation's input effect names the variable it reads or writes: left as the trace's own,
    it names no input of the jaxpr the equation is spliced into, and jax refuses the jaxpr
    the next time it collects effects, e.g. around a ``run_scoped``)."""
    from jax._src import effects

    def rename(e: Any) -> Any:
        if isinstance(e, effects.JaxprInputEffect) and isinstance(e.input, jax_core.Var):
            new = local.get(e.input, e.input)
            return e.replace(new) if not isinstance(new, jax_core.Literal) else e
        return e

    return type(effs)(rename(e) for e in effs)


def spliced(
    jaxpr: Any, args: Sequence[Any], done: tuple[Any, list[Any]] | None
) -> tuple[Any, tuple[Any, ...]]:
    """The jaxpr and arguments to interpret: ``jaxpr``'s rewrite ``done`` (from :func:`inline`)
    with its extra constants put after the old ones, or ``jaxpr`` as it is."""
    if done is None:
        return jaxpr, tuple(args)
    new_jaxpr, extra = done
    n = len(jaxpr.constvars)
    return new_jaxpr, (*args[:n], *extra, *args[n:])
