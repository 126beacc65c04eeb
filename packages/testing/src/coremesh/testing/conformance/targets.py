"""Target conformance: what every :class:`coremesh.core.targets.Target` does, whatever runs it.

The simulator, the compile-only target and the local TPU implement one protocol; this suite says
what that protocol promises. A target's tests subclass :class:`TargetSuite` and override
``make_target`` (``(chip, devices) -> Target``, not yet active), ``target_slice`` (the
``(chip, devices)`` the suite tries), ``missing_devices`` (a device count the target cannot
provide for that chip) and the capability ``can_run`` (it executes programs; a compile-only
target compiles them instead). Each check is also a plain function (``check_*``) a test can
call on its own.

Backends build their meshes from the active target, so the suite checks that the TensorCore and
SparseCore backends' ``mesh()`` inside ``activate()`` answer with the target's chip and cores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from coremesh.core.errors import CoremeshError, UnsupportedOnChipError
from coremesh.core.targets import Target, current_target

_OVERRIDE = "a target's conformance test class must override this fixture"

#: ``make_target(chip, devices)``: a target of the kind under test, not yet active.
TargetFactory = Callable[[str, int], Target]


def _active_target() -> Target | None:
    try:
        return current_target()
    except CoremeshError:  # no target active and no TPU: nothing is current
        return None


def check_protocol(target: Target) -> None:
    """Its attributes are those of the protocol, of the right types and consistent."""
    from coremesh.core.chips import Chip

    assert isinstance(target, Target)
    name: object = target.name  # a third-party target may answer anything: check it as such
    devices: object = target.num_devices
    assert isinstance(name, str) and name
    assert isinstance(target.chip, Chip)
    assert isinstance(devices, int) and devices >= 1
    assert target.cores_per_device in target.chip.core_modes


def check_activate(target: Target) -> None:
    """``activate()`` makes it ``current_target()`` inside, and only inside, the block."""
    assert _active_target() is not target
    with target.activate():
        assert current_target() is target
    # Outside every target a TPU VM answers with a fresh HardwareTarget: not this one.
    assert _active_target() is not target


def check_device_mesh(target: Target) -> None:
    """``device_mesh()`` is one ``Auto`` axis over ``num_devices`` distinct devices."""
    from jax.sharding import AxisType, Mesh

    with target.activate():
        for name in ("device", "x"):
            mesh = target.device_mesh(name) if name != "device" else target.device_mesh()
            assert isinstance(mesh, Mesh)
            assert mesh.axis_names == (name,)
            assert tuple(mesh.axis_types) == (AxisType.Auto,)
            assert mesh.devices.shape == (target.num_devices,)
            assert len({d.id for d in mesh.devices.flat}) == target.num_devices


def check_backend_meshes(target: Target) -> None:
    """``coremesh.tensorcore.mesh()`` and ``coremesh.sparsecore.mesh()`` built inside the target
    are of its chip and its cores (or, on a chip without SparseCores, refused as such)."""
    import coremesh.sparsecore as sc
    import coremesh.tensorcore as tc

    with target.activate():
        tcm = tc.mesh()
        assert tcm.chip is target.chip
        assert dict(tcm.axes) == {"core": target.cores_per_device}
        if target.chip.sparsecore is None:
            with pytest.raises(UnsupportedOnChipError) as e:
                sc.mesh()
            assert e.value.chip == target.chip.name
            return
        scm = sc.mesh()
        assert scm.chip is target.chip
        assert scm.cores_per_device == target.cores_per_device


def _core_ids_kernel(target: Target) -> Callable[[Any], Any]:
    import coremesh.tensorcore as tc
    from coremesh.testing.conformance import programs

    return programs.core_ids(tc.mesh, target.device_mesh())


def _core_ids_input(target: Target) -> np.ndarray:
    from coremesh.testing.conformance import programs

    rows = target.num_devices * target.cores_per_device * programs.ROWS_PER_CORE
    return np.zeros((rows, programs.LANES), np.float32)


def check_runs_a_kernel(target: Target) -> None:
    """A per-core kernel run on the target writes what numpy says each core writes."""
    from coremesh.testing.conformance import programs

    with target.activate():
        f = _core_ids_kernel(target)
        x = _core_ids_input(target)
        run = getattr(target, "run", None)
        got = run(f, x) if run is not None else f(x)
    want = programs.core_ids_expected(target.num_devices, target.cores_per_device)
    np.testing.assert_array_equal(np.asarray(got), want)


def check_compiles_a_kernel(target: Target) -> None:
    """A per-core kernel lowered for the target's devices compiles (for targets that cannot run
    programs: the same kernel :func:`check_runs_a_kernel` runs)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    with target.activate():
        f = _core_ids_kernel(target)
        x = _core_ids_input(target)
        sharding = NamedSharding(target.device_mesh(), P("device", None))
        arg = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        compiled = jax.jit(f).lower(arg).compile()
    assert compiled is not None


def _use(make_target: TargetFactory, chip: str, devices: int) -> None:
    """Make a target, activate it and ask for its devices (where a target may first fail)."""
    t = make_target(chip, devices)
    with t.activate():
        t.device_mesh()


def check_unknown_chip(make_target: TargetFactory) -> None:
    """An unknown chip is a coremesh error that says what to do."""
    with pytest.raises(CoremeshError, match="v9z") as e:
        _use(make_target, "v9z", 1)
    assert e.value.fix


def check_missing_devices(make_target: TargetFactory, chip: str, devices: int) -> None:
    """Asking for devices the target cannot provide is a coremesh error naming the chip, at
    the latest when the target is activated and its devices are used."""
    with pytest.raises(CoremeshError) as e:
        _use(make_target, chip, devices)
    assert e.value.fix and e.value.chip is not None


class TargetSuite:
    """The Target protocol, on the target kind the subclass's fixtures make."""

    @pytest.fixture
    def make_target(self) -> TargetFactory:
        """``(chip, devices) -> Target``, not yet active."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def target_slice(self) -> tuple[str, int]:
        """The ``(chip, devices)`` the suite's target is made with."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def missing_devices(self) -> int:
        """A device count the target cannot provide for the chip in ``target_slice``."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def can_run(self) -> bool:
        """Does the target execute programs (else: it compiles them)?"""
        return False

    @pytest.fixture
    def target(self, make_target: TargetFactory, target_slice: tuple[str, int]) -> Target:
        return make_target(*target_slice)

    def test_protocol(self, target: Target) -> None:
        check_protocol(target)

    def test_activate_makes_it_current(self, target: Target) -> None:
        check_activate(target)

    def test_device_mesh_is_one_auto_axis(self, target: Target) -> None:
        check_device_mesh(target)

    def test_backend_meshes_have_its_chip_and_cores(self, target: Target) -> None:
        check_backend_meshes(target)

    def test_runs_or_compiles_a_kernel(self, target: Target, can_run: bool) -> None:
        if can_run:
            check_runs_a_kernel(target)
        else:
            check_compiles_a_kernel(target)

    def test_unknown_chip_is_a_coremesh_error(self, make_target: TargetFactory) -> None:
        check_unknown_chip(make_target)

    def test_missing_devices_are_a_coremesh_error(
        self, make_target: TargetFactory, target_slice: tuple[str, int], missing_devices: int
    ) -> None:
        check_missing_devices(make_target, target_slice[0], missing_devices)
