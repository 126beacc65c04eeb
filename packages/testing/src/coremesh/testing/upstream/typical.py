"""How long each file of JAX's TPU test tree takes on the simulator, so that a first run with
several jobs starts the longest files first (with none of its own timings it would start them
in name order, and one of 70 minutes started last runs alone at the end); and the few tests that
take longer than a run's per-test watchdog, which get a watchdog of their own.

Measured on 2 CPUs in one whole run, 2026-12-04 (jax 0.12.0.1 with the ``jax-post-0.11.0/`` tree;
``tpu_pallas_mpmd_test``, which that jax cannot import, on jax 0.10.2): an order, not a
promise. The table an earlier run left in ``--out`` takes precedence, and files not named here
(a newer tree's) still start first of all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

#: Seconds of the simulator's run of each file (whole file, one process per file, 120 s per
#: test, two files at a time), as the testing README's table of jax 0.12.0.1 records them.
SIM_SECONDS: Mapping[str, float] = {
    "tpu_paged_attention_kernel_test.py": 4276,
    "tpu_splash_attention_kernel_test.py": 2243,
    "tpu_pallas_test.py": 1607,
    "tpu_fusible_matmul_test.py": 816,
    "tpu_ragged_paged_attention_test.py": 736,
    "tpu_gmm_test.py": 613,
    "tpu_pallas_pipeline_test.py": 400,
    "tpu_ops_test.py": 221,
    "tpu_sparsecore_pallas_test.py": 208,
    "tpu_splash_attention_kernel_sharded_test.py": 202,
    "tpu_pallas_mpmd_test.py": 66,
    "tpu_pallas_interpret_distributed_test.py": 53,
    "tpu_fusible_matmul_with_stateful_fusions_test.py": 53,
    "tpu_pallas_interpret_test.py": 37,
    "tpu_all_gather_test.py": 36,
    "tpu_pallas_random_test.py": 31,
    "tpu_pallas_async_test.py": 17,
    "tpu_pallas_distributed_test.py": 14,
    "tpu_splash_attention_mask_test.py": 12,
    "tpu_pallas_memory_space_test.py": 11,
    "tpu_pallas_state_test.py": 8,
    "tpu_sparsecore_pallas_distributed_test.py": 5,
    "tpu_side_effects_test.py": 4,
    "tpu_trace_value_test.py": 4,
    "tpu_info_test.py": 3,
    "tpu_pallas_call_print_test.py": 2,
    "tpu_pallas_interpret_thread_map_test.py": 2,
    "tpu_sparsecore_pallas_debug_check_test.py": 2,
}


def typical_seconds(files: Sequence[Path], modes: Sequence[str]) -> dict[tuple[str, str], float]:
    """(file name, mode) -> typical seconds for the files of :data:`SIM_SECONDS` (stock
    interpret mode's order follows the simulator's)."""
    return {
        (f.name, mode): SIM_SECONDS[f.name]
        for f in files
        for mode in modes
        if f.name in SIM_SECONDS
    }


#: Tests measured to take longer than the runner's usual watchdog (120 s in the README's runs)
#: on the simulator, in seconds, on 2 CPUs shared by three processes (2026-12-05, jax 0.12.0.1):
#: ten Hypothesis examples of a forward and a backward 512x2048x256 gmm, each interpreted, and
#: the pipeline file's padded matmuls. The simulator never hangs (its deadlocks raise), so past
#: the watchdog a test is only slow.
SLOW_TEST_SECONDS: Mapping[str, float] = {
    "tpu_gmm_test.py::GroupedMatmulTest::test_gmm1": 230,
    "tpu_gmm_test.py::GroupedMatmulTest::test_gmm_sharded_groups1": 200,
    # jax 0.10.2 (2026-12-06): 72 s alone, 88 s beside a second run, past 120 s in CI beside
    # a package's test suite (jax 0.11.2 and 0.12.0.1 passed them in the same CI run)
    "tpu_gmm_test.py::GroupedMatmulTest::test_gmm_sharded_groups0": 150,
    "tpu_gmm_test.py::GroupedMatmulTest::test_gmm_sharded_groups2": 150,
    # 30 Hypothesis examples of a matmul pipelined over shapes that are not whole blocks
    # (2026-12-06, beside two other test processes); the int8 ones raise (testing README).
    **{
        f"tpu_pallas_pipeline_test.py::{cls}::test_padded_matmul_{dtype}": seconds
        for cls, dtype, seconds in (
            ("PaddedPipelineEmitterTest", "float32", 312),
            ("PaddedPipelineEmitterTest", "bfloat16", 387),
            ("PaddedPipelineEmitterPrimitiveTest", "float32", 256),
            ("PaddedPipelineEmitterPrimitiveTest", "bfloat16", 299),
        )
    },
}


def watchdog_seconds(
    file_name: str, timeout: float, slow: Mapping[str, float] = SLOW_TEST_SECONDS
) -> dict[str, float]:
    """The tests of ``file_name`` that get a longer watchdog than ``timeout`` seconds: twice
    what they were measured to take (``slow``, by node id)."""
    return {
        nodeid: 2 * seconds
        for nodeid, seconds in slow.items()
        if nodeid.split("::")[0] == file_name and 2 * seconds > timeout
    }
