"""Conformance suites every backend runs against itself.

The classes are not named ``Test*``, so pytest collects them only where a backend subclasses them
(``class TestKernels(TensorCoreKernelSuite): ...``) and overrides the fixtures that raise
``NotImplementedError`` here. Capability fixtures default to False; a backend turns on what it
supports, and a suite test for a missing capability is reported as skipped with the reason.
"""

from coremesh.testing.conformance.backend import BackendSuite
from coremesh.testing.conformance.collectives import CollectivesSuite
from coremesh.testing.conformance.sparsecore import (
    SparseCoreCompileSuite,
    SparseCoreKernelSuite,
    SparseCoreSplitCompileSuite,
)
from coremesh.testing.conformance.targets import TargetSuite
from coremesh.testing.conformance.tensorcore import (
    TensorCoreCompileSuite,
    TensorCoreKernelSuite,
    TensorCorePipelineSuite,
)

__all__ = [
    "BackendSuite",
    "CollectivesSuite",
    "SparseCoreCompileSuite",
    "SparseCoreKernelSuite",
    "SparseCoreSplitCompileSuite",
    "TargetSuite",
    "TensorCoreCompileSuite",
    "TensorCoreKernelSuite",
    "TensorCorePipelineSuite",
]
