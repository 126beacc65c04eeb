"""Running a per-device kernel over every device of the target.

A Mosaic kernel cannot be partitioned by XLA ("Mosaic kernels cannot be automatically
partitioned. Please wrap the call in a shard_map"), so every array-level op of a backend wraps
itself in ``shard_map`` over the target's device axis, unless it is already inside one (then it
works on the local shard).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coremesh.core.targets import current_target


def inside_shard_map(axis: str = "device") -> bool:
    """True while tracing inside a ``shard_map`` that is manual over ``axis``."""
    import jax

    mesh = jax.sharding.get_abstract_mesh()
    return axis in getattr(mesh, "manual_axes", ())


def device_shards(axis: str = "device") -> int:
    """How many pieces an op's arrays are in: 1 inside a user's ``shard_map`` (the op sees its
    local shard), else the target's device count (the op shard_maps itself)."""
    return 1 if inside_shard_map(axis) else current_target().num_devices


def on_devices(
    fn: Callable[..., Any],
    *,
    in_specs: Any,
    out_specs: Any,
    axis: str = "device",
) -> Callable[..., Any]:
    """``fn`` as a per-device program: shard_mapped over the target's devices when needed."""
    import jax

    def run(*args: Any) -> Any:
        if inside_shard_map(axis):
            return fn(*args)
        mesh = current_target().device_mesh(axis)
        return jax.shard_map(
            fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )(*args)

    return run
