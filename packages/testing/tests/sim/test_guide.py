"""The core_map guide's five programs on the simulator, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from coremesh.testing.guide import PROGRAMS, GuideProgram
from coremesh.testing.sim import Simulator

pytestmark = pytest.mark.sim

NAMES = list(PROGRAMS)


def run_program(sim: Simulator, program: GuideProgram, seed: int = 1) -> None:
    mesh = sim.mesh()
    fn = program.build(mesh)
    inputs = program.make_inputs(mesh, seed=seed)
    got = np.asarray(sim.run(fn, *inputs))
    want = program.expected(*(np.asarray(a) for a in inputs), num_cores=sim.cores_per_device)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.sim(devices=4, dma_execution_mode="on_wait")
def test_guide_program_4_devices_dma_on_wait(sim: Simulator, name: str) -> None:
    run_program(sim, PROGRAMS[name])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.sim(devices=4, dma_execution_mode="eager")
def test_guide_program_4_devices_dma_eager(sim: Simulator, name: str) -> None:
    run_program(sim, PROGRAMS[name])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.sim(devices=1)
def test_guide_program_1_device(sim: Simulator, name: str) -> None:
    run_program(sim, PROGRAMS[name])


@pytest.mark.parametrize(
    ("chip", "name"),
    [
        ("v4", "swap_kernel"),
        ("v4", "indexed_add_one"),
        ("v5e", "swap_core_map"),
        ("v5e", "add_one"),
        ("v6e", "sc_add_one"),
        ("v6e", "swap_kernel"),
        ("TPU7x", "sc_add_one"),
        ("TPU7x", "indexed_add_one"),
    ],
    indirect=["chip"],
)
@pytest.mark.sim(devices=2)
def test_guide_program_on_other_chips(sim: Simulator, chip: str, name: str) -> None:
    assert sim.chip.name == chip
    run_program(sim, PROGRAMS[name])


def test_swap_reference_is_a_rotation_of_core_slices() -> None:
    """The numpy reference itself, against a hand-made case (core c gets core c-1's slice)."""
    x = np.arange(2 * 4, dtype=np.float32).reshape(2, 4)
    got = PROGRAMS["swap_kernel"].expected(x, num_cores=2)
    np.testing.assert_array_equal(got, [[4, 6, 0, 2], [12, 14, 8, 10]])
    np.testing.assert_array_equal(PROGRAMS["swap_kernel"].expected(x, num_cores=1), x * 2)


def test_program_specs_describe_the_inputs() -> None:
    p = PROGRAMS["indexed_add_one"]
    specs = p.arg_specs(4)
    assert [s.shape for s in specs] == [(1024, 1024), (1,)]
    assert len(p.in_specs()) == len(specs)
    assert PROGRAMS["sc_add_one"].uses_sparsecore
    assert not any(PROGRAMS[n].uses_sparsecore for n in NAMES if n != "sc_add_one")


def test_program_rejects_a_row_count_that_does_not_split() -> None:
    from coremesh.core.errors import LayoutError

    with pytest.raises(LayoutError, match="cannot be split over 3 device"):
        PROGRAMS["add_one"].arg_specs(3)
