"""JAX's TPU tests that check what only a TPU compile or a TPU device object produces: left out
of the pass rate.

Some tests assert on the text of a program compiled for a TPU: the ``tpu_custom_call`` Mosaic
emits and its attributes (memory-space colours, kernel metadata, parameter names, collective
ids), the VMEM a compiled program reserves, a cost analysis of the custom call. A program
compiled for a CPU (stock interpret mode and the simulator alike) has none of it, so these tests
cannot pass on a CPU whatever the simulator does (some parameterizations check no text and do
pass: those count). Nor can a test of the ``device_kind`` of ``jax.devices()``: a simulated
device is a host CPU device, and jax's device objects are jax's own. The conformance target
counts the others ("neither skipped nor needing what no CPU gives"). Each pattern (``fnmatch``
over ``file.py::Class::test``, parameterized suffixes included) is listed with what the test
reads; the kernels these tests run are also run by other tests that check their results.
"""

from __future__ import annotations

import fnmatch

from coremesh.testing.upstream.needs import node_key

_HLO = "compares the HLO text of a TPU compile"

#: (pattern, what the test reads that only a TPU compile gives).
TABLE: tuple[tuple[str, str], ...] = (
    (
        "tpu_pallas_test.py::PallasHloNamesTest::*",
        f"{_HLO}: the custom call's name and its operands' parameter names",
    ),
    ("tpu_pallas_test.py::PallasKernelMetadataTest::*", f"{_HLO}: the kernel's metadata"),
    (
        "tpu_pallas_test.py::PallasTPUCollectiveIdTest::test_sequential_collectives_auto*",
        "compares the collective ids Mosaic assigns in the lowered TPU module",
    ),
    (
        "tpu_pallas_test.py::TPUPipelineModeTest::test_two_input_vadd*",
        f"{_HLO}: the VMEM the compiled program reserves",
    ),
    (
        "tpu_pallas_test.py::PallasCallPoisonTest::test_allow_input_fusion*",
        f"{_HLO}: the input fusion XLA:TPU makes into the custom call",
    ),
    (
        "tpu_pallas_test.py::PallasCallTest::test_cost_analysis*",
        "reads XLA:TPU's cost analysis of the custom call (its CostEstimate)",
    ),
    (
        "tpu_pallas_distributed_test.py::PallasKernelMetadataDistributedTest::*",
        f"{_HLO}: the kernel's mesh-axes metadata",
    ),
    (
        "tpu_pallas_distributed_test.py::PallasBarrierCollectiveIdsTest::"
        "test_auto_assigned_barrier_semaphores*",
        f"{_HLO}: the barrier semaphores Mosaic assigns",
    ),
    (
        "tpu_pallas_memory_space_test.py::*MemorySpaceTest::*memory_space_constraint*",
        f"{_HLO}: the memory-space colours of the custom call",
    ),
    ("tpu_pallas_state_test.py::PinnedBufferTest::*", f"{_HLO}: the buffer's memory colour"),
    (
        "tpu_pallas_state_test.py::CoreMapTest::test_kernel_with_output_memory_space*",
        f"{_HLO}: the custom call's output memory space",
    ),
    (
        "tpu_side_effects_test.py::SideEffectsTest::test_side_effecting_dce*",
        f"{_HLO}: whether XLA:TPU keeps a side-effecting custom call",
    ),
    (
        "tpu_sparsecore_pallas_test.py::*::test*sparsecore_availability_check",
        f"{_HLO}: the Mosaic custom call of a kernel on a TPU with SparseCores (its other "
        "branch expects jax's refusal to compile a kernel for a CPU outside interpret mode, "
        "which is no simulated device's answer)",
    ),
    (
        "tpu_info_test.py::TpuInfoTest::test_get_tpu_info",
        "reads jax.devices()[0].device_kind, which names the host's CPU: a simulated device is "
        "a CPU device (get_tpu_info's answer for the simulated chip is checked by the file's "
        "other tests)",
    ),
)


def reason(nodeid: str, table: tuple[tuple[str, str], ...] = TABLE) -> str | None:
    """What the test ``nodeid`` reads that only a TPU compile gives, or None."""
    key = node_key(nodeid)
    for pattern, why in table:
        if fnmatch.fnmatchcase(key, pattern):
            return why
    return None
