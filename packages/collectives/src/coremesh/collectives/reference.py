"""Each collective by name, and the ``jax.lax`` computation it equals.

For checking a kernel against XLA's own collective (tests) and comparing the two (benchmarks):
``collective("all_gather", "device", tiled=True)`` is this package's array function,
``lax_equivalent("all_gather", "device", size=4, tiled=True)`` the ``jax.lax`` one, both to be
called on one participant's operand inside ``shard_map``. ``jax.lax`` has no max / min
reduce-scatter; its equivalent is ``pmax`` / ``pmin`` followed by this participant's slice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from coremesh.collectives import ops
from coremesh.collectives.axes import AxisName
from coremesh.collectives.validate import Algorithm, Op

COLLECTIVES = ("barrier", "ppermute", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")


def shift(size: int, by: int = 1) -> list[tuple[int, int]]:
    """The permutation sending participant ``i`` to ``i + by`` (mod ``size``)."""
    return [(i, (i + by) % size) for i in range(size)]


def collective(
    name: str,
    axis_name: AxisName,
    *,
    op: str = "sum",
    algorithm: str = "auto",
    perm: Sequence[tuple[int, int]] = (),
    **kw: Any,
) -> Callable[[Any], Any]:
    """This package's array function ``name`` over ``axis_name`` with ``kw`` bound."""
    red, algo = cast(Op, op), cast(Algorithm, algorithm)
    if name == "all_gather":
        return lambda v: ops.all_gather(v, axis_name, algorithm=algo, **kw)
    if name == "reduce_scatter":
        return lambda v: ops.reduce_scatter(v, axis_name, op=red, algorithm=algo, **kw)
    if name == "all_reduce":
        return lambda v: ops.all_reduce(v, axis_name, op=red, algorithm=algo, **kw)
    if name == "all_to_all":
        split, concat = kw.pop("split_axis", 0), kw.pop("concat_axis", 0)
        return lambda v: ops.all_to_all(v, axis_name, split, concat, **kw)
    if name == "ppermute":
        return lambda v: ops.ppermute(v, axis_name, perm, **kw)
    if name == "barrier":
        return lambda v: ops.barrier(v, axis_name, **kw)
    raise ValueError(f"unknown collective {name!r}; collectives are {', '.join(COLLECTIVES)}")


def lax_equivalent(
    name: str,
    axis_name: AxisName,
    *,
    size: int,
    op: str = "sum",
    perm: Sequence[tuple[int, int]] = (),
    **kw: Any,
) -> Callable[[Any], Any]:
    """The ``jax.lax`` computation :func:`collective` with the same arguments equals.

    ``size`` is the number of participants (for the max / min reduce-scatter slice).
    """
    import jax.numpy as jnp
    from jax import lax

    kw.pop("algorithm", None)
    kw.pop("sync", None)
    kw.pop("collective_id", None)
    if name == "all_gather":
        return lambda v: lax.all_gather(v, axis_name, **kw)
    if name == "reduce_scatter":
        if op == "sum":
            return lambda v: lax.psum_scatter(v, axis_name, **kw)
        whole = lax.pmax if op == "max" else lax.pmin
        dim, tiled = kw.get("scatter_dimension", 0), kw.get("tiled", False)

        def scatter(v: Any) -> Any:
            full = whole(v, axis_name)
            part = full.shape[dim] // size
            mine = lax.dynamic_slice_in_dim(full, lax.axis_index(axis_name) * part, part, dim)
            return mine if tiled else jnp.squeeze(mine, dim)

        return scatter
    if name == "all_reduce":
        fn = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[op]
        return lambda v: fn(v, axis_name)
    if name == "all_to_all":
        split, concat = kw.pop("split_axis", 0), kw.pop("concat_axis", 0)
        return lambda v: lax.all_to_all(v, axis_name, split, concat, **kw)
    if name == "ppermute":
        return lambda v: lax.ppermute(v, axis_name, list(perm))
    if name == "barrier":
        return lambda v: v
    raise ValueError(f"unknown collective {name!r}; collectives are {', '.join(COLLECTIVES)}")
