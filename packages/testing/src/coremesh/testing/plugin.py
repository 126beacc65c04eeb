"""pytest plugin (entry point ``pytest11``): coremesh markers, fixtures and hang protection.

* Markers: ``sim`` (runs on the CPU simulator; ``@pytest.mark.sim(chip="v6e", devices=2, ...)``
  passes its keywords to the ``sim`` fixture), ``aot`` (compiles for TPU generations with libtpu),
  ``tpu`` (needs TPU hardware).
* Host devices: jax fixes its CPU device count when its backend starts, so the plugin asks for
  16 before any test runs: a simulated core blocked on a semaphore holds a host execution thread,
  and 4 devices x 2 cores run reliably with 4 x (2 + 1) host devices. It does not
  change ``JAX_PLATFORMS``: libtpu stays available for compile-only checks in the same process.
* Fixtures: ``chip`` (``"v5p"``; parametrize it indirectly for other chips), ``sim`` (an entered
  slice: :func:`coremesh.testing.simulate`'s simulator), ``slice_target`` (a factory of slices
  for tests that choose their own: ``with slice_target("v6e", 2) as s:``), ``run_isolated`` (run
  Python code in a subprocess with a timeout, for code that may hang).
* Targets: ``--coremesh-target=hardware`` (or ``COREMESH_TARGET=hardware``; ``nox -s tpu_tests``
  passes it) makes ``sim`` and ``slice_target`` hand out the local TPU devices
  (:class:`coremesh.testing.hardware.HardwareRun`, the simulator's API) instead, so the same tests
  run their kernels on the chip; a test asking for a slice the VM is not is skipped with the
  reason. Tests that call ``simulate()`` themselves always get the simulator.
* Memory mappings: XLA:CPU holds each compiled program in mappings of its own, and past
  ``vm.max_map_count`` of them it crashes as it compiles; between tests the plugin drops jax's
  and the simulator's compiled programs when more than half are held.
* Hang protection: the simulator turns deadlocks into errors after ``deadline`` seconds (the
  fixture uses 10 s); tests default to pytest-timeout's limit; code that can hang for reasons
  the simulator does not watch (stock jax) runs through ``run_isolated``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import pytest

if TYPE_CHECKING:
    from coremesh.testing.hardware import HardwareRun
    from coremesh.testing.sim.simulator import Simulator

    #: What ``sim`` and ``slice_target`` hand out: a simulator, or the local TPU on hardware.
    Slice: TypeAlias = Simulator | HardwareRun

#: The ``slice_target`` fixture's type: ``(chip, devices, **options) -> Slice``.
SliceFactory: TypeAlias = Callable[..., "Slice"]

#: Host CPU devices the plugin asks jax for.
HOST_DEVICES = 16
#: Deadlock deadline of the ``sim`` fixture, well inside any test timeout.
FIXTURE_DEADLINE_S = 10.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--coremesh-target",
        choices=("sim", "hardware"),
        default=None,
        help="where the sim and slice_target fixtures run kernels: the CPU simulator (default) "
        "or the local TPU (also COREMESH_TARGET=hardware)",
    )


def hardware_requested(config: pytest.Config) -> bool:
    """Does this session run its slices on the local TPU? The option wins over the variable."""
    from coremesh.testing.hardware import ENV

    where = config.getoption("--coremesh-target", default=None) or os.environ.get(ENV, "sim")
    return str(where).lower() == "hardware"


def _skip_other_slices() -> Any:
    """On hardware, a test that asks for a slice this VM is not is a skip, with the reason."""
    from coremesh.testing.hardware import NotOnThisHardwareError

    try:
        return (yield)
    except NotOnThisHardwareError as e:
        pytest.skip(str(e).splitlines()[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup() -> Any:
    return (yield from _skip_other_slices())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call() -> Any:
    return (yield from _skip_other_slices())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown() -> Any:
    """After each test, compiled programs are dropped if they hold more than half the memory
    mappings a process may (:mod:`coremesh.testing.sim.host_mappings`)."""
    try:
        return (yield)
    finally:
        if "jax" in sys.modules:
            from coremesh.testing.sim import host_mappings

            host_mappings.relieve()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sim(**kwargs): runs on the CPU simulator; keywords go to coremesh.testing.simulate",
    )
    config.addinivalue_line("markers", "aot: compiles for real TPU generations with libtpu")
    config.addinivalue_line("markers", "tpu: needs real TPU hardware")
    config.addinivalue_line("markers", "slow: a long configuration (large shapes, many devices)")
    _arrange_host_devices()
    # Compile-only support (the aot marker's fixtures); importing coremesh.testing already set
    # libtpu's environment (coremesh.testing.libtpu_env).
    if not config.pluginmanager.has_plugin("coremesh.testing.aot.pytest_support"):
        config.pluginmanager.import_plugin("coremesh.testing.aot.pytest_support")


def _arrange_host_devices() -> None:
    from coremesh.core.errors import CoremeshError
    from coremesh.testing.sim.devices import configure_host_devices

    try:
        configure_host_devices(HOST_DEVICES)
    except CoremeshError as err:  # jax already started (e.g. by another plugin): say so
        import warnings

        warnings.warn(f"coremesh: {err}", stacklevel=1)


@pytest.fixture
def chip(request: pytest.FixtureRequest) -> str:
    """The simulated chip: ``"v5p"`` unless parametrized (``indirect=["chip"]``)."""
    return str(getattr(request, "param", "v5p"))


def make_slice(
    config: pytest.Config,
    chip: str = "v5p",
    devices: int = 4,
    *,
    cores_per_device: int | None = None,
    **simulator_options: Any,
) -> Slice:
    """A slice of ``devices`` x ``chip`` to enter: the simulator (``simulator_options`` go to
    :func:`coremesh.testing.simulate`), or, when the session targets hardware, the local TPU
    (the simulator's own options, such as ``races`` or ``deadline``, do not apply there)."""
    if hardware_requested(config):
        from coremesh.testing.hardware import HardwareRun

        return HardwareRun(chip, devices, cores_per_device)
    from coremesh.testing.sim import simulate

    return simulate(chip, devices, cores_per_device=cores_per_device, **simulator_options)


@pytest.fixture
def slice_target(request: pytest.FixtureRequest) -> SliceFactory:
    """``slice_target(chip="v5p", devices=4, *, cores_per_device=None, **simulator_options)``:
    a slice for tests that choose their own, entered with ``with``; see :func:`make_slice`."""

    def make(*args: Any, **kwargs: Any) -> Slice:
        return make_slice(request.config, *args, **kwargs)

    return make


@pytest.fixture
def sim(request: pytest.FixtureRequest, chip: str) -> Iterator[Slice]:
    """An entered slice: ``chip`` x 4 devices, or what ``@pytest.mark.sim(...)`` says."""
    kwargs: dict[str, Any] = {"chip": chip, "devices": 4, "deadline": FIXTURE_DEADLINE_S}
    marker = request.node.get_closest_marker("sim")
    if marker is not None:
        kwargs.update(marker.kwargs)
    with make_slice(request.config, **kwargs) as s:
        yield s


@dataclasses.dataclass(frozen=True)
class Isolated:
    """Outcome of :func:`run_isolated`: ``timed_out`` or the return code and output."""

    timed_out: bool
    returncode: int | None
    stdout: str
    stderr: str
    timeout: float

    @property
    def status(self) -> str:
        if self.timed_out:
            return f"deadlock (timeout {self.timeout:g} s)"
        return "ok" if self.returncode == 0 else f"failed (exit {self.returncode})"


class Pending:
    """A Python subprocess started by :func:`launch`; ``wait()`` gives its :class:`Isolated`.

    Output goes to temporary files, not pipes, so a chatty process never blocks on a full pipe
    (which would look like the hang a test is looking for).
    """

    def __init__(self, code: str, timeout: float, env: dict[str, str] | None = None) -> None:
        import tempfile
        import time

        self.timeout = timeout
        self._deadline = time.monotonic() + timeout
        # Closed by wait(), which every caller reaches (the fixtures wait on teardown).
        self._out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=self._out,
            stderr=self._err,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: killed with every child
        )
        self._result: Isolated | None = None

    def wait(self) -> Isolated:
        import signal
        import time

        if self._result is None:
            timed_out = False
            try:
                self._proc.wait(timeout=max(self._deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
            outputs = []
            for f in (self._out, self._err):
                f.seek(0)
                outputs.append(f.read())
                f.close()
            code = None if timed_out else self._proc.returncode
            self._result = Isolated(timed_out, code, outputs[0], outputs[1], self.timeout)
        return self._result


def launch(code: str, timeout: float, env: dict[str, str] | None = None) -> Pending:
    """Start ``code`` in a fresh Python process, killed ``timeout`` seconds after launch."""
    return Pending(code, timeout, env)


def run_python(code: str, timeout: float, env: dict[str, str] | None = None) -> Isolated:
    """Run ``code`` in a fresh Python process; kill it after ``timeout`` seconds."""
    return launch(code, timeout, env).wait()


@pytest.fixture
def run_isolated() -> Callable[..., Isolated]:
    """``run_isolated(code, timeout=60, env=None)``: run code that may hang in a subprocess."""

    def run(code: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Isolated:
        return run_python(code, timeout, env)

    return run
