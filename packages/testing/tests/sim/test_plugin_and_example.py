"""The pytest plugin's fixtures and the guide as a user runs it (examples/core_map_guide.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import pytest

from coremesh.testing.plugin import HOST_DEVICES, Isolated
from coremesh.testing.sim import Simulator

pytestmark = pytest.mark.sim

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "core_map_guide.py"


def test_plugin_started_jax_with_its_host_devices() -> None:
    assert len(jax.devices("cpu")) == HOST_DEVICES


@pytest.mark.sim(chip="v6e", devices=2, dma_execution_mode="eager")
def test_sim_marker_keywords_configure_the_fixture(sim: Simulator) -> None:
    assert (sim.chip.name, sim.num_devices) == ("v6e", 2)
    assert sim.interpret_params.dma_execution_mode == "eager"
    assert jax.device_count() == 2


@pytest.mark.parametrize("chip", ["TPU7x"], indirect=True)
def test_chip_fixture_is_parametrizable(sim: Simulator, chip: str) -> None:
    assert sim.chip.name == chip == "TPU7x"


def test_run_isolated_reports_hangs_and_output(run_isolated: Callable[..., Isolated]) -> None:
    # It never returns; 5 s is for a bare interpreter to start and print on a loaded machine.
    hung = run_isolated("import time; print('started', flush=True); time.sleep(3600)", timeout=5)
    assert hung.timed_out
    assert hung.status == "deadlock (timeout 5 s)"
    assert "started" in hung.stdout
    done = run_isolated("import sys; print('out'); sys.exit(3)", timeout=30)
    assert (done.timed_out, done.returncode, done.stdout) == (False, 3, "out\n")
    assert done.status == "failed (exit 3)"


def test_the_guide_script_runs_as_written(run_isolated: Callable[..., Isolated]) -> None:
    """A fresh process: simulate() arranges 4 host devices itself, the guide's asserts pass."""
    run = run_isolated(EXAMPLE.read_text(), timeout=240, env={"JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "Running on 4 TPU v5p devices." in out
    assert "There are 4 devices, and 2 cores each." in out
    for line in (
        "swap_cores (core_map + run_scoped): OK",
        "swap_cores (pl.kernel): OK",
        "add_one (emit_pipeline, PARALLEL core split): OK",
        "indexed_add_one (scalar prefetch, manual split): OK",
        "sc_add_one (4 SparseCores x 16 vector subcores): OK",
    ):
        assert line in out
