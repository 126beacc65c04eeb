"""coremesh.core: the backend-neutral contract of coremesh.

Chips, targets, core meshes, kernels, pipelines, work splitting, collective ids, errors and
backend discovery. Depends on jax and numpy only; backends (coremesh.tensorcore,
coremesh.sparsecore, ...) build on it and register under the ``coremesh.backends`` entry points.
"""

from coremesh.core.backends import Backend, available_backends, backend_for, get_backend
from coremesh.core.capacity import check_fits, nbytes
from coremesh.core.chips import CHIPS, Chip, DeviceFigures, SparseCoreSpec, chip_names, get_chip
from coremesh.core.collective_ids import CollectiveIdAllocator, default_allocator
from coremesh.core.dtypes import check_array_dtype, check_matmul_dtypes, check_operand_dtype
from coremesh.core.errors import (
    BackendError,
    CapacityError,
    ChipError,
    CollectiveIdError,
    CompileError,
    CoremeshError,
    CoremeshWarning,
    DeadlockError,
    LayoutError,
    MeshError,
    UnsupportedOnChipError,
)
from coremesh.core.kernel import CostEstimate, Kernel, KernelSpec, kernel
from coremesh.core.mesh import CoreKind, CoreMesh, DeviceCoreView, check_axis, num_cores
from coremesh.core.partition import Span, check_block_shape, split_rows, tile_shape
from coremesh.core.pipeline import Block, Manual, Parallel, Pipeline, PipelineSpec, Semantics
from coremesh.core.targets import (
    HardwareTarget,
    SliceTarget,
    Target,
    current_target,
    using_target,
)

__version__ = "0.1.0"

__all__ = [
    "CHIPS",
    "Backend",
    "BackendError",
    "Block",
    "CapacityError",
    "Chip",
    "ChipError",
    "CollectiveIdAllocator",
    "CollectiveIdError",
    "CompileError",
    "CoreKind",
    "CoreMesh",
    "CoremeshError",
    "CoremeshWarning",
    "CostEstimate",
    "DeadlockError",
    "DeviceCoreView",
    "DeviceFigures",
    "HardwareTarget",
    "Kernel",
    "KernelSpec",
    "LayoutError",
    "Manual",
    "MeshError",
    "Parallel",
    "Pipeline",
    "PipelineSpec",
    "Semantics",
    "SliceTarget",
    "Span",
    "SparseCoreSpec",
    "Target",
    "UnsupportedOnChipError",
    "available_backends",
    "backend_for",
    "check_array_dtype",
    "check_axis",
    "check_block_shape",
    "check_fits",
    "check_matmul_dtypes",
    "check_operand_dtype",
    "chip_names",
    "current_target",
    "default_allocator",
    "get_backend",
    "get_chip",
    "kernel",
    "nbytes",
    "num_cores",
    "split_rows",
    "tile_shape",
    "using_target",
]
