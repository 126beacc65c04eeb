"""Index vectors handed to gather/scatter-like ops: shape and, when concrete, range.

Both backends take a 1-D integer vector of row or block indices; an out-of-range one would read
or write another row, so a concrete vector is checked on the host before anything is traced.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coremesh.core.chips import Chip
from coremesh.core.errors import LayoutError


def check_index_vector(what: str, idx: Any, chip: Chip, *, rule: str) -> int:
    """The length of ``idx``, or the error if it is not a 1-D integer vector."""
    import jax.numpy as jnp

    shape = tuple(getattr(idx, "shape", ()))
    dtype = getattr(idx, "dtype", None)
    if len(shape) != 1 or dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise LayoutError(
            f"{what} must be a 1-D integer vector, got {dtype}{list(shape)}",
            rule=rule,
            chip=chip.name,
            fix=f"pass {what} as a 1-D int32 array",
        )
    return int(shape[0])


def is_traced(x: Any) -> bool:
    """Whether ``x`` is a tracer (its values unknown until the program runs)."""
    import jax

    return isinstance(x, jax.core.Tracer)


def check_in_range(what: str, idx: Any, size: int, chip: Chip, *, rule: str, fix: str) -> None:
    """Concrete ``idx`` must lie in ``[0, size)``; the error names the first one that does not.
    Traced indices are the caller's to handle."""
    if is_traced(idx):
        return
    host = np.asarray(idx)
    bad = np.flatnonzero((host < 0) | (host >= size))
    if bad.size:
        raise LayoutError(
            f"{what}[{bad[0]}] = {host[bad[0]]} is outside 0..{size - 1}",
            rule=rule,
            chip=chip.name,
            fix=fix,
        )
