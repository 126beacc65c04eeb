"""Which simulated slice each upstream test needs: one table, read from the tests' own gates.

JAX's TPU tests pick what they run on from the device they find (``jtu.is_device_tpu(5, "e")``,
``jax.device_count() < 4``, ``jtu.is_device_tpu_at_least(6)``). Run on a simulator, each test is
given the chip and device count its gates ask for, so it runs instead of skipping. The first
pattern (``fnmatch`` over ``file.py::Class::test``) that matches a test decides; a test no pattern
names gets ``DEFAULT``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Literal

DeviceUnderTest = Literal["tpu", "cpu"]


@dataclasses.dataclass(frozen=True)
class Needs:
    """A test's slice: ``devices`` x ``chip``, and what ``jtu.device_under_test()`` answers
    (``"cpu"`` for the tests written for interpret mode on a CPU, which skip elsewhere)."""

    chip: str = "v5p"
    devices: int = 4
    device_under_test: DeviceUnderTest = "tpu"


DEFAULT = Needs()

#: (pattern, needs, why): the gate in the test file that asks for it.
TABLE: tuple[tuple[str, Needs, str], ...] = (
    (
        "tpu_all_gather_test.py::AllGatherTest::*",
        Needs("v5e", 4),
        "setUp: is_device_tpu(version=5, variant='e'); even device count",
    ),
    (
        "tpu_pallas_distributed_test.py::*::test_remote_dma_regular_semaphore*",
        Needs("v6e", 4),
        "is_device_tpu_at_least(6); the _sc case needs a SparseCore",
    ),
    (
        "tpu_pallas_distributed_test.py::*::test_interpret_remote_dma_asymmetrical_indexer*",
        Needs("v5e", 4),
        "is_device_tpu(5, 'e')",
    ),
    (
        "tpu_sparsecore_pallas_distributed_test.py::DistributedMpmdTest::test_mpmd_reduce_scatter",
        Needs("v5p", 2),
        "mesh.size > 1 (any device count); on 4 devices its 2 bodies x 4 SparseCores would hold "
        "more blocked host callbacks than XLA:CPU runs, refused by name (sim/mpmd.py)",
    ),
    (
        "tpu_sparsecore_pallas_test.py::*::test_pl_kernel_in_shmap_explicit_mesh",
        Needs("v5p", 1),
        "its kernel copies num_subcores rows of its shard of a (num_subcores, lanes) array sharded "
        "over make_mesh((device_count(), 1)): whole on one device only (on 4 it copies past its "
        "shard, a DMA out of bounds)",
    ),
    (
        "tpu_pallas_async_test.py::*::test_axis_dict_with_core_single_device*",
        Needs("v5p", 1),
        "device_count() <= 2 and two cores per device",
    ),
    (
        "tpu_pallas_pipeline_test.py::PallasCallMultipleBufferedPipeline*",
        Needs("v5p", 1),
        "setUp: skips when device_count() > 1",
    ),
    (
        "tpu_ops_test.py::*::test_bf16_input_reduce_index*",
        Needs("v6e", 4),
        "skipTest('Requires TPUv6+') unless is_device_tpu_at_least(6)",
    ),
    (
        "tpu_ops_test.py::*::test_dynamic_gather_along_axis*",
        Needs("v6e", 4),
        "skipTest('Requires TPUv6+') unless is_device_tpu_at_least(version=6)",
    ),
    (
        "tpu_ops_test.py::*::test_quantize*",
        Needs("v6e", 4),
        "skipTest('Requires TPUv6+') unless is_device_tpu_at_least(version=6)",
    ),
    (
        "tpu_pallas_test.py::*regular_semaphore*",
        Needs("v6e", 1),
        "skipTest('Regular semaphores in DMAs require TPU v6+') unless is_device_tpu_at_least(6)",
    ),
    (
        "tpu_pallas_test.py::*",
        Needs("v5p", 1),
        "single-device kernels; several skip when device_count() > 1",
    ),
    (
        "tpu_pallas_memory_space_test.py::*",
        Needs("v5p", 1),
        "the HOST memory-space cases skip when device_count() > 1",
    ),
    (
        "tpu_pallas_interpret_distributed_test.py::*",
        Needs("v5p", 8, "cpu"),
        "CPU-only (test_device_matches(['cpu'])); request_cpu_devices(8), needs >= 4",
    ),
    (
        "tpu_pallas_interpret_test.py::*::test_randomization_of_parallel_dimensions",
        Needs("v5e", 1, "cpu"),
        "every grid point expected on core 0 (interpret mode's one core): a one-TensorCore chip",
    ),
    (
        "tpu_pallas_interpret_test.py::*",
        Needs("v5p", 1, "cpu"),
        "CPU-only: test_device_matches(['cpu'])",
    ),
    (
        "tpu_pallas_interpret_thread_map_test.py::*",
        Needs("v5p", 1, "cpu"),
        "CPU-only: test_device_matches(['cpu'])",
    ),
)


def node_key(nodeid: str) -> str:
    """``file.py::Class::test`` of a pytest node id (whatever folder the file is in)."""
    path, _, rest = nodeid.partition("::")
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}::{rest}" if rest else name


def needs_for(nodeid: str, table: tuple[tuple[str, Needs, str], ...] = TABLE) -> Needs:
    key = node_key(nodeid)
    for pattern, needs, _ in table:
        if fnmatch.fnmatchcase(key, pattern):
            return needs
    return DEFAULT


def most_devices(file_name: str, table: tuple[tuple[str, Needs, str], ...] = TABLE) -> int:
    """The largest device count any test of ``file_name`` needs (for stock mode, whose host
    device count is fixed for the whole process)."""
    counts = [DEFAULT.devices]
    counts += [n.devices for p, n, _ in table if p.split("::", 1)[0] == file_name]
    file_wide = [n.devices for p, n, _ in table if p == f"{file_name}::*"]
    return file_wide[0] if file_wide else max(counts)
