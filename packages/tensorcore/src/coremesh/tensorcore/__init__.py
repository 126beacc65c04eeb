"""coremesh.tensorcore: TensorCore meshes, kernels and pipelines that split work across cores.

Array-level ops (``map_blocks``, ``reduce``, ``matmul``, ``gather_blocks``) are jittable and equal
their XLA references (``<op>_reference``); ``kernel`` and ``pipeline`` are the building blocks they
use. The names match ``coremesh.sparsecore``'s: ``mesh``, ``kernel``, the mesh class, the ops and
their references, and the sharding helpers.
"""

from coremesh.core import jax_versions
from coremesh.core.partition import core_share
from coremesh.core.sharding import device_shards, inside_shard_map, on_devices
from coremesh.tensorcore.backend import TensorCoreBackend, TensorCoreKernel
from coremesh.tensorcore.block_sizes import choose_block, choose_matmul_blocks, choose_resident_plan
from coremesh.tensorcore.kernel import kernel
from coremesh.tensorcore.mesh import TensorCoreMesh, mesh
from coremesh.tensorcore.ops import (
    gather_blocks,
    gather_blocks_reference,
    map_blocks,
    map_blocks_reference,
    matmul,
    matmul_reference,
    reduce,
    reduce_reference,
)
from coremesh.tensorcore.pipeline import pipeline, sub_blocks

jax_versions.check()  # refuse a jax older than coremesh supports; warn on an untested one

__version__ = "0.1.0"
__all__ = [
    "TensorCoreBackend",
    "TensorCoreKernel",
    "TensorCoreMesh",
    "choose_block",
    "choose_matmul_blocks",
    "choose_resident_plan",
    "core_share",
    "device_shards",
    "gather_blocks",
    "gather_blocks_reference",
    "inside_shard_map",
    "kernel",
    "map_blocks",
    "map_blocks_reference",
    "matmul",
    "matmul_reference",
    "mesh",
    "on_devices",
    "pipeline",
    "reduce",
    "reduce_reference",
    "sub_blocks",
]
