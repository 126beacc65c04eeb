"""``--coremesh-target=hardware``: simulate() hands the test the local TPU, or says why not."""

from __future__ import annotations

import pytest

from coremesh.core import CoremeshError, get_chip
from coremesh.core.targets import HardwareTarget
from coremesh.testing import hardware
from coremesh.testing.sim import Simulator, simulate


def test_simulator_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hardware.ENV, raising=False)
    assert isinstance(simulate("v5p", 1), Simulator)


def test_hardware_without_a_tpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.ENV, "hardware")
    monkeypatch.setattr(HardwareTarget, "detect", classmethod(lambda cls: None))
    with pytest.raises(CoremeshError, match="no TPU") as e:
        simulate("v5p", 4)
    assert "--coremesh-target" in str(e.value)


def test_hardware_run_matches_the_local_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.ENV, "hardware")
    local = HardwareTarget(get_chip("v6e"), 4, 1)
    monkeypatch.setattr(HardwareTarget, "detect", classmethod(lambda cls: local))
    run: object = simulate("v6e", 2)
    assert isinstance(run, hardware.HardwareRun)
    assert (run.chip.name, run.num_devices, run.cores_per_device) == ("v6e", 2, 1)
    with pytest.raises(hardware.NotOnThisHardwareError, match=r"wants 4 x v5p .* has 4 x v6e"):
        simulate("v5p", 4)
    with pytest.raises(hardware.NotOnThisHardwareError, match="wants 8 x v6e"):
        simulate("v6e", 8)


def test_plugin_turns_another_slice_into_a_skip(pytester: pytest.Pytester) -> None:
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
        from coremesh.testing.sim import simulate

        def test_wants_v5p():
            with simulate("v5p", 4):
                raise AssertionError("must not run")

        def test_wants_v6e():
            run = simulate("v6e", 1)
            assert run.name == "hardware"
        """
    )
    result = pytester.runpytest("--coremesh-target=hardware", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)


def test_the_option_does_not_outlive_its_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing():\n    pass\n")
    pytester.runpytest("--coremesh-target=hardware", "-p", "no:cacheprovider")
    assert not hardware.hardware_requested()
