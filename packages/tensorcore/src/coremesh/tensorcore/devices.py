"""Kept for callers of ``coremesh.tensorcore.devices``: the helpers live in
``coremesh.core.sharding`` (the SparseCore backend uses them too)."""

from coremesh.core.sharding import device_shards, inside_shard_map, on_devices

__all__ = ["device_shards", "inside_shard_map", "on_devices"]
