"""The interpret parameters a kernel runs with inside the simulator.

A call may pass its own ``interpret=pltpu.InterpretParams(...)`` (race detection, out-of-bounds
reads, HBM in ``run_scoped``, a DMA mode, a core count), or open its own
``pltpu.force_tpu_interpret_mode(...)``. Stock interpret mode honours those; the simulator's
forced mode would replace them. Here the call keeps every field it set and takes the
simulator's parameters, chip included, for the rest. The fields set are those passed to
``InterpretParams(...)`` while a simulator is open (:func:`record_fields` notes them, so
``num_cores_or_threads=1`` stays 1 on a 2-core chip), else those that differ from the defaults.
A plain ``interpret=True`` or a compiled (non-interpret) call gets the simulator's parameters.
A kernel with parameters of its own is not checked for reads of unwritten memory.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from jax._src.pallas.mosaic.interpret.params import InterpretParams

#: Attribute holding the names of the fields passed to an ``InterpretParams(...)``.
_SET_FIELDS = "_coremesh_set_fields"


def record_fields(init: Callable[..., None]) -> Callable[..., None]:
    """``InterpretParams.__init__`` that also notes which fields the caller passed."""

    @functools.wraps(init)
    def recording_init(self: InterpretParams, **kw: Any) -> None:
        init(self, **kw)
        object.__setattr__(self, _SET_FIELDS, frozenset(kw))

    return recording_init


def _set_fields(own: InterpretParams) -> set[str]:
    passed = getattr(own, _SET_FIELDS, None)
    if passed is not None:
        return set(passed)
    default = type(own)()
    return {
        f.name for f in dataclasses.fields(own) if getattr(own, f.name) != getattr(default, f.name)
    }


def merge(sim: InterpretParams, own: InterpretParams) -> InterpretParams:
    """``sim`` (the simulator's parameters) with every field ``own`` sets."""
    names = {f.name for f in dataclasses.fields(sim)}
    changes: dict[str, Any] = {name: getattr(own, name) for name in _set_fields(own) & names}
    if not changes:
        return sim
    if "own_fields" in names:
        # Such a call configures the interpreter itself: the fast path leaves it to the
        # interpreter, and the uninitialized-read check leaves its reads of the fill alone
        # (JAX's interpret tests read it on purpose).
        changes["own_fields"] = frozenset(changes)
    return dataclasses.replace(sim, **changes)


def effective(sim: InterpretParams, forced: Any, own: Any) -> Any:
    """What a kernel entry point runs with, where stock computes ``forced or own``.

    ``sim``: the simulator's parameters; ``forced``: the active ``force_tpu_interpret_mode``
    value (the simulator's, or a context the caller opened inside it); ``own``: the call's
    ``interpret=`` argument (``False``, ``True``, parameters, or parameters merged already).
    """
    if isinstance(forced, InterpretParams) and not isinstance(forced, type(sim)):
        return merge(sim, forced)  # the caller's own context wins over the call, as in stock
    if isinstance(own, InterpretParams) and own != forced:
        return own if isinstance(own, type(sim)) else merge(sim, own)
    return forced
