"""coremesh.core: the backend-neutral contract of coremesh.

Chips, targets, core meshes, kernels, pipeline splits, work splitting, collective ids, errors and
backend discovery. Depends on jax and numpy only; backends (coremesh.tensorcore,
coremesh.sparsecore, ...) build on it and register under the ``coremesh.backends`` entry points.
"""

from coremesh.core.backends import (
    Backend,
    available_backends,
    backend_for,
    get_backend,
    using_backend,
)
from coremesh.core.capacity import check_fits, nbytes, padded_nbytes, scratch_bytes
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
from coremesh.core.kernel import CostEstimate, Kernel, KernelSpec, PallasKernel, kernel
from coremesh.core.mesh import CoreKind, CoreMesh, num_cores
from coremesh.core.partition import Span, check_block_shape, core_share, split_rows, tile_shape
from coremesh.core.pipeline import Manual, Parallel, Split
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
    "DeviceFigures",
    "HardwareTarget",
    "Kernel",
    "KernelSpec",
    "LayoutError",
    "Manual",
    "MeshError",
    "PallasKernel",
    "Parallel",
    "SliceTarget",
    "Span",
    "SparseCoreSpec",
    "Split",
    "Target",
    "UnsupportedOnChipError",
    "available_backends",
    "backend_for",
    "check_array_dtype",
    "check_block_shape",
    "check_fits",
    "check_matmul_dtypes",
    "check_operand_dtype",
    "chip_names",
    "core_share",
    "current_target",
    "default_allocator",
    "get_backend",
    "get_chip",
    "kernel",
    "nbytes",
    "num_cores",
    "padded_nbytes",
    "scratch_bytes",
    "split_rows",
    "tile_shape",
    "using_backend",
    "using_target",
]
