"""coremesh.sparsecore: SparseCore vector/scalar subcore meshes and sparse kernels.

import coremesh.sparsecore as sc

rows = sc.gather(table, indices)                  # embedding lookup
table = sc.scatter_add(table, indices, updates)   # duplicates each add once
sums = sc.segment_sum(values, segment_ids, num_segments)
bags = sc.embedding_bag(table, indices, offsets, combiner="mean")

Each op has its XLA reference beside it (``gather_reference``...). The names match
``coremesh.tensorcore``'s: ``mesh``, ``kernel``, the mesh class, the ops and their references,
and the sharding helpers.
"""

from coremesh.core import jax_versions
from coremesh.core.partition import core_share
from coremesh.core.sharding import device_shards, inside_shard_map, on_devices
from coremesh.sparsecore.backend import SparseCoreBackend, SparseCoreKernel
from coremesh.sparsecore.kernel import kernel
from coremesh.sparsecore.mesh import SparseCoreMesh, active_sparsecores, mesh, sparsecore_of
from coremesh.sparsecore.ops import (
    embedding_bag,
    embedding_bag_reference,
    gather,
    gather_reference,
    scatter_add,
    scatter_add_reference,
    segment_sum,
    segment_sum_reference,
)
from coremesh.sparsecore.registers import check_register_shape, register_shape, register_width

jax_versions.check()  # refuse a jax older than coremesh supports; warn on an untested one

__version__ = "0.1.0"
__all__ = [
    "SparseCoreBackend",
    "SparseCoreKernel",
    "SparseCoreMesh",
    "active_sparsecores",
    "check_register_shape",
    "core_share",
    "device_shards",
    "embedding_bag",
    "embedding_bag_reference",
    "gather",
    "gather_reference",
    "inside_shard_map",
    "kernel",
    "mesh",
    "on_devices",
    "register_shape",
    "register_width",
    "scatter_add",
    "scatter_add_reference",
    "segment_sum",
    "segment_sum_reference",
    "sparsecore_of",
]
