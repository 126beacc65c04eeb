"""The ``sparsecore`` backend registered under the ``coremesh.backends`` entry points."""

from __future__ import annotations

import importlib.util

from coremesh.core import CoreKind, KernelSpec
from coremesh.core.kernel import PallasKernel


class SparseCoreKernel(PallasKernel):
    """A kernel over a SparseCore vector- or scalar-subcore mesh, built with ``pl.kernel``."""

    backend_name = "sparsecore"
    kinds = frozenset({CoreKind.SPARSE_VECTOR, CoreKind.SPARSE_SCALAR})


class SparseCoreBackend:
    name = "sparsecore"
    core_kinds = frozenset({CoreKind.SPARSE_VECTOR, CoreKind.SPARSE_SCALAR})

    def is_available(self) -> bool:
        return importlib.util.find_spec("jax.experimental.pallas.tpu_sc") is not None

    def make_kernel(self, spec: KernelSpec) -> SparseCoreKernel:
        return SparseCoreKernel(spec)
