"""coremesh.tensorcore: TensorCore meshes and kernels that split work across TensorCores."""

from coremesh.tensorcore.backend import TensorCoreBackend, TensorCoreKernel
from coremesh.tensorcore.mesh import TensorCoreMesh, mesh

__version__ = "0.1.0"
__all__ = ["TensorCoreBackend", "TensorCoreKernel", "TensorCoreMesh", "mesh"]
