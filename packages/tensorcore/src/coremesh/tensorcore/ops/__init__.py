"""Array-level TensorCore ops, each beside its XLA reference (``<op>_reference``)."""

from coremesh.tensorcore.ops.gather_blocks import gather_blocks, gather_blocks_reference
from coremesh.tensorcore.ops.map_blocks import map_blocks, map_blocks_reference
from coremesh.tensorcore.ops.matmul import matmul, matmul_reference
from coremesh.tensorcore.ops.reduce import reduce, reduce_reference

__all__ = [
    "gather_blocks",
    "gather_blocks_reference",
    "map_blocks",
    "map_blocks_reference",
    "matmul",
    "matmul_reference",
    "reduce",
    "reduce_reference",
]
