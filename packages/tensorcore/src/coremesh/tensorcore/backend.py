"""The ``tensorcore`` backend registered under the ``coremesh.backends`` entry points."""

from __future__ import annotations

import importlib.util

from coremesh.core import CoreKind, KernelSpec
from coremesh.core.kernel import PallasKernel


class TensorCoreKernel(PallasKernel):
    """A kernel over a TensorCore mesh, built with ``pl.kernel``."""

    backend_name = "tensorcore"
    kinds = frozenset({CoreKind.TENSOR})


class TensorCoreBackend:
    name = "tensorcore"
    core_kinds = frozenset({CoreKind.TENSOR})

    def is_available(self) -> bool:
        return importlib.util.find_spec("jax.experimental.pallas.tpu") is not None

    def make_kernel(self, spec: KernelSpec) -> TensorCoreKernel:
        return TensorCoreKernel(spec)
