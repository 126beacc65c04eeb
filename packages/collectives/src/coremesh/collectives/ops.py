"""Jittable collectives on arrays, equal to their ``jax.lax`` counterparts.

Call them inside ``shard_map`` on the per-device operand, as ``jax.lax.psum`` and friends, or
outside on a global array whose first dim is split over the target's devices (they then run as
``shard_map(f, in_specs=P("device"), out_specs=P("device"))``). Each one checks its input
before tracing, picks an algorithm, and runs one Pallas kernel with a ``CostEstimate`` and a
collective id from the process allocator.

Axes: ``"device"`` (any device mesh axis inside ``shard_map``), ``"core"`` and
``("device", "core")``. Over the axes with cores, core ``c``'s operand is slice ``c`` of the
per-device operand's first dim (split in equal slices), and the per-device result is the cores'
results stacked the same way: exactly what ``jax.lax`` computes over a ``(device, core)`` mesh
with ``P(("device", "core"))`` specs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from coremesh.collectives import axes, validate
from coremesh.collectives.axes import Axis, AxisName
from coremesh.collectives.kernels import Request, build
from coremesh.collectives.validate import Algorithm, Op
from coremesh.core import LayoutError

LANES = 128
Transform = Callable[[Any], Any]


# ------------------------------------------------------------------------------ shapes


def canonical_chunk(shape: Sequence[int]) -> tuple[int, ...]:
    """A chunk of rank >= 2 holding ``shape``'s elements in the same order."""
    if len(shape) >= 2:
        return tuple(shape)
    size = math.prod(shape)
    if size >= 2 * LANES and size % LANES == 0:
        return (size // LANES, LANES)
    return (1, size)


def _merge(y: Any, at: int) -> Any:
    """Merge dims ``at`` and ``at + 1`` of ``y``."""
    shape = y.shape
    return y.reshape(*shape[:at], shape[at] * shape[at + 1], *shape[at + 2 :])


# --------------------------------------------------------------------------- dispatch


def _per_device_shape(x: Any, axis: Axis, inside: bool) -> tuple[int, ...]:
    shape = validate.check_shape(x, axis)
    if inside:
        return shape
    from coremesh.core import current_target

    devices = current_target().num_devices
    if not shape or shape[0] % devices:
        raise LayoutError(
            f"an operand of shape {shape} outside shard_map",
            rule=f"outside shard_map the first dim is split over the target's {devices} "
            "devices, so it must be a multiple of the device count",
            chip=axis.chip.name if axis.chip else None,
            fix=f"give the operand a first dim divisible by {devices}, or call the collective "
            "inside shard_map on the per-device operand",
        )
    return (shape[0] // devices, *shape[1:])


def _participant_shape(device_shape: tuple[int, ...], axis: Axis, op: str) -> tuple[int, ...]:
    if not axis.spans_cores:
        return device_shape
    validate.cores_split(device_shape, axis, op)
    return (device_shape[0] // axis.cores, *device_shape[1:])


def _run(
    x: Any,
    axis: Axis,
    req: Request,
    to_src: Transform,
    from_dst: Transform,
    *,
    inside: bool,
    collective_id: int | None,
) -> Any:
    """Run ``req`` on every participant: canonicalise, call the kernel, restore the shape."""
    import jax
    from jax.sharding import PartitionSpec as P

    from coremesh.core.sharding import on_devices

    validate.check_sync(req.sync, axis)
    cid = validate.collective_id(req.id_owner, collective_id) if req.n > 1 else None
    kernel = build(req, collective_id=cid) if cid is not None else None

    def collective(src: Any) -> Any:
        if kernel is None:
            return _single(req, src)
        return kernel(src)

    def per_device(xd: Any) -> Any:
        if not axis.spans_cores:
            return from_dst(collective(to_src(xd)))
        cores = axis.cores
        xc = xd.reshape(cores, xd.shape[0] // cores, *xd.shape[1:])
        src = jax.vmap(to_src)(xc)
        y = jax.vmap(lambda s: _single(req, s))(src) if kernel is None else kernel(src)
        out = jax.vmap(from_dst)(y)
        return out.reshape(out.shape[0] * out.shape[1], *out.shape[2:])

    if inside:
        return per_device(x)
    return on_devices(per_device, in_specs=(P(axes.DEVICE_AXIS),), out_specs=P(axes.DEVICE_AXIS))(x)


def _single(req: Request, src: Any) -> Any:
    """A collective over one participant: no communication, only the layout change."""
    import jax.numpy as jnp

    c = req.collective
    if c == "all_gather":
        return src[None]
    if c == "reduce_scatter":
        return src[0]
    if c == "ppermute":
        return src if (0, 0) in req.perm else jnp.zeros_like(src)
    return src


def _setup(
    x: Any, axis_name: AxisName, op_name: str, *, reduces: bool
) -> tuple[Axis, tuple[int, ...], bool]:
    """Resolve the axis, check the dtype, and find one participant's operand shape."""
    axis = axes.resolve(axis_name)
    inside = bool(axes._manual_axes())
    validate.check_dtype(x.dtype, axis, reduces=reduces)
    device_shape = _per_device_shape(x, axis, inside)
    return axis, _participant_shape(device_shape, axis, op_name), inside


# ------------------------------------------------------------------------ collectives


def all_gather(
    x: Any,
    axis_name: AxisName,
    *,
    axis: int = 0,
    tiled: bool = False,
    algorithm: Algorithm = "auto",
    sync: str = "per_step",
    collective_id: int | None = None,
) -> Any:
    """``jax.lax.all_gather(x, axis_name, axis=axis, tiled=tiled)``."""
    ax, shape, inside = _setup(x, axis_name, "all_gather", reduces=False)
    n = ax.size
    if tiled and not shape:
        raise LayoutError(
            "a tiled all_gather of a scalar",
            rule="tiled=True concatenates along an existing dim",
            chip=ax.chip.name if ax.chip else None,
            fix="pass tiled=False, or gather an array of rank >= 1",
        )
    at = validate.check_axis_index("axis", axis, max(1, len(shape) + (0 if tiled else 1)), ax)
    chunk = canonical_chunk(shape)

    def to_src(v: Any) -> Any:
        return v.reshape(chunk)

    def from_dst(y: Any) -> Any:
        import jax.numpy as jnp

        y = jnp.moveaxis(y.reshape(n, *shape), 0, at)
        return _merge(y, at) if tiled else y

    req = Request("all_gather", ax, chunk, x.dtype, algorithm, sync)
    return _run(x, ax, req, to_src, from_dst, inside=inside, collective_id=collective_id)


def _split_dim(
    shape: tuple[int, ...], dim: int, n: int, tiled: bool
) -> tuple[tuple[int, ...], tuple[int, ...], Transform]:
    """``dim`` of ``shape`` split over ``n`` participants (its ``n`` slices when tiled, else its
    ``n`` entries): each participant's part, its canonical chunk, and the (n, *chunk) source."""
    rest = tuple(d for i, d in enumerate(shape) if i != dim)
    part = (shape[dim] // n, *rest) if tiled else rest
    chunk = canonical_chunk(part)

    def to_src(v: Any) -> Any:
        import jax.numpy as jnp

        return jnp.moveaxis(v, dim, 0).reshape(n, *chunk)

    return part, chunk, to_src


def reduce_scatter(
    x: Any,
    axis_name: AxisName,
    *,
    op: Op = "sum",
    scatter_dimension: int = 0,
    tiled: bool = False,
    algorithm: Algorithm = "auto",
    sync: str = "per_step",
    collective_id: int | None = None,
) -> Any:
    """``jax.lax.psum_scatter`` (``op="sum"``), or the same with max / min."""
    ax, shape, inside = _setup(x, axis_name, "reduce_scatter", reduces=True)
    validate.check_op(op, ax)
    n = ax.size
    if not shape:
        raise LayoutError(
            "reduce_scatter of a scalar",
            rule="the scattered dim is split over the participants",
            chip=ax.chip.name if ax.chip else None,
            fix="scatter an array of rank >= 1",
        )
    sd = validate.check_axis_index("scatter_dimension", scatter_dimension, len(shape), ax)
    if tiled:
        validate.check_divisible(
            f"dim {sd} (scatter_dimension)",
            shape[sd],
            n,
            ax,
            fix=f"pad dim {sd} to a multiple of {n}, or scatter another dim",
        )
    elif shape[sd] != n:
        raise LayoutError(
            f"reduce_scatter with tiled=False over the {ax.describe()}: dim {sd} is {shape[sd]}",
            rule=f"without tiling the scattered dim has exactly one entry per participant ({n})",
            chip=ax.chip.name if ax.chip else None,
            fix=f"pass tiled=True, or give dim {sd} size {n}",
        )
    part, chunk, to_src = _split_dim(shape, sd, n, tiled)

    def from_dst(y: Any) -> Any:
        import jax.numpy as jnp

        y = y.reshape(part)
        return jnp.moveaxis(y, 0, sd) if tiled else y

    req = Request("reduce_scatter", ax, chunk, x.dtype, algorithm, sync, op)
    return _run(x, ax, req, to_src, from_dst, inside=inside, collective_id=collective_id)


def all_reduce(
    x: Any,
    axis_name: AxisName,
    *,
    op: Op = "sum",
    algorithm: Algorithm = "auto",
    sync: str = "per_step",
    collective_id: int | None = None,
) -> Any:
    """``jax.lax.psum`` / ``pmax`` / ``pmin`` as a reduce-scatter then an all-gather.

    The operand is cut into one chunk per participant along its first dim when that divides,
    else flattened and padded to a multiple of the participant count.
    """
    ax, shape, inside = _setup(x, axis_name, "all_reduce", reduces=True)
    validate.check_op(op, ax)
    n = ax.size
    size = math.prod(shape)
    if len(shape) >= 2 and shape[0] % n == 0:
        chunk = (shape[0] // n, *shape[1:])
        pad = 0
    else:
        per = -(-size // n)
        if per >= 2 * LANES:
            per = -(-per // LANES) * LANES
        chunk = canonical_chunk((per,))
        pad = n * per - size

    def to_src(v: Any) -> Any:
        import jax.numpy as jnp

        if pad or len(shape) < 2 or shape[0] % n:
            v = jnp.pad(v.reshape(-1), (0, pad))
        return v.reshape(n, *chunk)

    def from_dst(y: Any) -> Any:
        if pad:
            y = y.reshape(-1)[:size]
        return y.reshape(shape)

    req = Request("all_reduce", ax, chunk, x.dtype, algorithm, sync, op)
    return _run(x, ax, req, to_src, from_dst, inside=inside, collective_id=collective_id)


def all_to_all(
    x: Any,
    axis_name: AxisName,
    split_axis: int,
    concat_axis: int,
    *,
    tiled: bool = False,
    collective_id: int | None = None,
) -> Any:
    """``jax.lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled)``."""
    ax, shape, inside = _setup(x, axis_name, "all_to_all", reduces=False)
    n = ax.size
    if not shape:
        raise LayoutError(
            "all_to_all of a scalar",
            rule="all_to_all splits a dim over the participants",
            chip=ax.chip.name if ax.chip else None,
            fix="pass an array of rank >= 1",
        )
    sa = validate.check_axis_index("split_axis", split_axis, len(shape), ax)
    if tiled:
        ca = validate.check_axis_index("concat_axis", concat_axis, len(shape), ax)
        validate.check_divisible(
            f"dim {sa} (split_axis)",
            shape[sa],
            n,
            ax,
            fix=f"pad dim {sa} to a multiple of {n}",
        )
    else:
        ca = validate.check_axis_index("concat_axis", concat_axis, len(shape), ax)
        if shape[sa] != n:
            raise LayoutError(
                f"all_to_all with tiled=False over the {ax.describe()}: dim {sa} is {shape[sa]}",
                rule=f"without tiling the split dim has one entry per participant ({n})",
                chip=ax.chip.name if ax.chip else None,
                fix=f"pass tiled=True, or give dim {sa} size {n}",
            )
    part, chunk, to_src = _split_dim(shape, sa, n, tiled)

    def from_dst(y: Any) -> Any:
        import jax.numpy as jnp

        y = y.reshape(n, *part)
        if not tiled:
            return jnp.moveaxis(y, 0, ca)
        y = jnp.moveaxis(y, 1, sa + 1)  # each chunk back in x's dim order
        return _merge(jnp.moveaxis(y, 0, ca), ca)

    req = Request("all_to_all", ax, chunk, x.dtype, "direct")
    return _run(x, ax, req, to_src, from_dst, inside=inside, collective_id=collective_id)


def ppermute(
    x: Any,
    axis_name: AxisName,
    perm: Sequence[tuple[int, int]],
    *,
    collective_id: int | None = None,
) -> Any:
    """``jax.lax.ppermute(x, axis_name, perm)``: zeros where nothing is received."""
    ax, shape, inside = _setup(x, axis_name, "ppermute", reduces=False)
    pairs = tuple(validate.check_permutation(perm, ax))
    chunk = canonical_chunk(shape)

    def to_src(v: Any) -> Any:
        return v.reshape(chunk)

    def from_dst(y: Any) -> Any:
        return y.reshape(shape)

    req = Request("ppermute", ax, chunk, x.dtype, "direct", perm=pairs)
    return _run(x, ax, req, to_src, from_dst, inside=inside, collective_id=collective_id)


def barrier(
    x: Any,
    axis_name: AxisName,
    *,
    collective_id: int | None = None,
) -> Any:
    """``x``, returned once every participant of ``axis_name`` has reached the barrier.

    Pass the value whose producers must run before the barrier and use the result after it;
    the kernel copies it (pass something small).
    """
    ax, shape, inside = _setup(x, axis_name, "barrier", reduces=False)
    chunk = canonical_chunk(shape)

    def to_src(v: Any) -> Any:
        return v.reshape(chunk)

    def from_dst(y: Any) -> Any:
        return y.reshape(shape)

    req = Request("barrier", ax, chunk, x.dtype, "direct")
    return _run(x, ax, req, to_src, from_dst, inside=inside, collective_id=collective_id)


# ------------------------------------------------------------------ jax.lax spellings


def psum(x: Any, axis_name: AxisName, **kw: Any) -> Any:
    """``jax.lax.psum`` (see :func:`all_reduce`)."""
    return all_reduce(x, axis_name, op="sum", **kw)


def pmax(x: Any, axis_name: AxisName, **kw: Any) -> Any:
    """``jax.lax.pmax`` (see :func:`all_reduce`)."""
    return all_reduce(x, axis_name, op="max", **kw)


def pmin(x: Any, axis_name: AxisName, **kw: Any) -> Any:
    """``jax.lax.pmin`` (see :func:`all_reduce`)."""
    return all_reduce(x, axis_name, op="min", **kw)


def psum_scatter(
    x: Any, axis_name: AxisName, *, scatter_dimension: int = 0, tiled: bool = False, **kw: Any
) -> Any:
    """``jax.lax.psum_scatter`` (see :func:`reduce_scatter`)."""
    return reduce_scatter(
        x, axis_name, op="sum", scatter_dimension=scatter_dimension, tiled=tiled, **kw
    )
