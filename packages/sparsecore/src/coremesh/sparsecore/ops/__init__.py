"""The kernels SparseCores exist for: gather, scatter-add, segment sum, embedding bags."""

from coremesh.sparsecore.ops.bag import embedding_bag, embedding_bag_reference
from coremesh.sparsecore.ops.gather import gather, gather_reference
from coremesh.sparsecore.ops.scatter import (
    scatter_add,
    scatter_add_reference,
    segment_sum,
    segment_sum_reference,
)

__all__ = [
    "embedding_bag",
    "embedding_bag_reference",
    "gather",
    "gather_reference",
    "scatter_add",
    "scatter_add_reference",
    "segment_sum",
    "segment_sum_reference",
]
