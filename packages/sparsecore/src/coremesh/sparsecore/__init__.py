"""coremesh.sparsecore: SparseCore vector/scalar subcore meshes and sparse kernels."""

from coremesh.sparsecore.backend import SparseCoreBackend, SparseCoreKernel
from coremesh.sparsecore.mesh import SparseCoreMesh, mesh, sparsecore_of

__version__ = "0.1.0"
__all__ = ["SparseCoreBackend", "SparseCoreKernel", "SparseCoreMesh", "mesh", "sparsecore_of"]
