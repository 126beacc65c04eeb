"""``--coremesh-target=hardware``: the plugin's fixtures hand the test the local TPU, or say why
not; ``simulate()`` stays the simulator."""

from __future__ import annotations

import pytest

from coremesh.core import CoremeshError, get_chip
from coremesh.core.targets import HardwareTarget
from coremesh.testing import hardware
from coremesh.testing.plugin import make_slice
from coremesh.testing.sim import Simulator, simulate


class _Config:
    """The one thing make_slice reads from a pytest config: the --coremesh-target option."""

    def __init__(self, target: str | None) -> None:
        self._target = target

    def getoption(self, name: str, default: object = None) -> object:
        assert name == "--coremesh-target"
        return self._target


def _slice(target: str | None, chip: str, devices: int) -> object:
    return make_slice(_Config(target), chip, devices)  # type: ignore[arg-type]


def test_simulator_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hardware.ENV, raising=False)
    assert isinstance(_slice(None, "v5p", 1), Simulator)
    assert isinstance(_slice("sim", "v5p", 1), Simulator)


def test_simulate_is_always_the_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.ENV, "hardware")
    assert isinstance(simulate("v5p", 1), Simulator)


def test_hardware_without_a_tpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.ENV, "hardware")
    monkeypatch.setattr(HardwareTarget, "detect", classmethod(lambda cls: None))
    with pytest.raises(CoremeshError, match="no TPU") as e:
        _slice(None, "v5p", 4)
    assert "--coremesh-target" in str(e.value)


def test_the_option_wins_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.ENV, "hardware")
    assert isinstance(_slice("sim", "v5p", 1), Simulator)


def test_hardware_run_matches_the_local_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    local = HardwareTarget(get_chip("v6e"), 4, 1)
    monkeypatch.setattr(HardwareTarget, "detect", classmethod(lambda cls: local))
    run = _slice("hardware", "v6e", 2)
    assert isinstance(run, hardware.HardwareRun)
    assert (run.chip.name, run.num_devices, run.cores_per_device) == ("v6e", 2, 1)
    with pytest.raises(hardware.NotOnThisHardwareError, match=r"wants 4 x v5p .* has 4 x v6e"):
        _slice("hardware", "v5p", 4)
    with pytest.raises(hardware.NotOnThisHardwareError, match="wants 8 x v6e"):
        _slice("hardware", "v6e", 8)


def test_plugin_fixtures_run_on_hardware_or_skip(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from coremesh.core import get_chip
        from coremesh.core.targets import HardwareTarget

        @pytest.fixture(autouse=True)
        def one_v6e(monkeypatch):
            local = HardwareTarget(get_chip("v6e"), 1, 1)
            monkeypatch.setattr(HardwareTarget, "detect", classmethod(lambda cls: local))
        """
    )
    pytester.makepyfile(
        """
        import pytest
        from coremesh.testing.sim import Simulator, simulate

        def test_wants_v5p(slice_target):
            with slice_target("v5p", 4):
                raise AssertionError("must not run")

        def test_wants_v6e(slice_target):
            run = slice_target("v6e", 1, races=True)  # simulator options do not apply
            assert run.name == "hardware"

        @pytest.mark.sim(chip="v6e", devices=1)
        def test_sim_fixture(sim):
            assert sim.name == "hardware" and sim.num_devices == 1

        def test_simulate_stays_the_simulator():
            assert isinstance(simulate("v6e", 1), Simulator)
        """
    )
    result = pytester.runpytest("--coremesh-target=hardware", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, skipped=1)
