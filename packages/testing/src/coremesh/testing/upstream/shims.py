"""pytest plugin of the child that runs one upstream file (``-p coremesh.testing.upstream.shims``).

It changes what a test sees, not what it does: the tree's ``jax/_src`` helpers become importable
(:mod:`~coremesh.testing.upstream.imports`), the device gates answer for the test's chip
(:mod:`~coremesh.testing.upstream.gates`), and each test runs inside its mode's context:

* ``sim``: ``coremesh.testing.simulate(chip, devices)`` with the slice from
  :mod:`~coremesh.testing.upstream.needs`;
* ``stock``: Pallas' own TPU interpret mode, ``pltpu.force_tpu_interpret_mode(
  pltpu.InterpretParams())``, so every kernel a test does not give ``interpret=`` itself runs as
  ``interpret=pltpu.InterpretParams()`` would, on the host devices the process started with;
  the files written for interpret mode on a CPU (``tpu_pallas_interpret*``) run as they are.

Outcomes go to the events file (:mod:`~coremesh.testing.upstream.events`) as they happen.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from coremesh.testing.upstream import gates, imports
from coremesh.testing.upstream.events import EventWriter, Status, first_line
from coremesh.testing.upstream.needs import Needs, needs_for

MODES = ("sim", "stock")


#: Past this share of the memory mappings a process may hold, even with its compiled programs
#: dropped, a test process stops after its test and the file goes on in a new one.
RECYCLE_MAPPINGS_SHARE = 0.75


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("coremesh-upstream", "JAX's own tests on a simulated chip")
    group.addoption("--upstream-mode", choices=MODES, default="sim", help="sim or stock")
    group.addoption("--upstream-tree", default=None, help="the JAX test tree's root")
    group.addoption("--upstream-events", default=None, help="file the outcomes are written to")
    group.addoption(
        "--upstream-done", default=None, help="file of node ids already run (not run again)"
    )
    group.addoption(
        "--upstream-only",
        default=None,
        help="file of the node ids to run (the others are another process's; ids the file "
        "no longer has are ignored)",
    )
    group.addoption(
        "--upstream-budgets",
        default=None,
        help="file of lines 'node id seconds': tests whose watchdog is not --timeout",
    )
    group.addoption(
        "--upstream-recycle-bytes",
        type=int,
        default=None,
        help="after a test, a process holding more than this many bytes stops; the runner "
        "starts a new one for the tests left",
    )


class _State:
    def __init__(self, config: pytest.Config) -> None:
        self.mode = str(config.getoption("--upstream-mode"))
        tree = config.getoption("--upstream-tree")
        self.finder = imports.install(Path(tree)) if tree else None
        self.gates: dict[str, Any] | None = None  # installed once there are tests to run
        events = config.getoption("--upstream-events")
        self.events = EventWriter(Path(events)) if events else None
        done = config.getoption("--upstream-done")
        self.done = set(Path(done).read_text().split()) if done else set()
        only = config.getoption("--upstream-only")
        self.only = set(Path(only).read_text().split()) if only else None
        budgets = config.getoption("--upstream-budgets")
        lines = Path(budgets).read_text().splitlines() if budgets else []
        self.budgets = {n: float(s) for n, s in (line.rsplit(" ", 1) for line in lines if line)}
        self.recycle_bytes: int | None = config.getoption("--upstream-recycle-bytes")
        self.status: dict[str, tuple[Status, str]] = {}
        self.started: dict[str, float] = {}

    def write(self, event: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.write(event, **fields)

    def close(self) -> None:
        if self.gates is not None:
            gates.uninstall(self.gates)
        if self.finder is not None:
            imports.uninstall(self.finder)
        if self.events is not None:
            self.events.close()


_KEY = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    return config.stash[_KEY]


#: The session's config, for the hooks that are not handed it.
_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY] = _State(config)
    _CONFIG[:] = [config]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _KEY in config.stash:
        _state(config).close()


def _error_line(text: str) -> str:
    """The exception line of a pytest error text (``E   ModuleNotFoundError: ...``)."""
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    return first_line(lines[0] if lines else text)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _state(_CONFIG[0]).write("not_run", message=_error_line(report.longreprtext))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = _state(config)
    keep = [
        i
        for i in items
        if i.nodeid not in state.done and (state.only is None or i.nodeid in state.only)
    ]
    if len(keep) != len(items):
        kept = {id(i) for i in keep}
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = keep
    state.write("collected", nodeids=[i.nodeid for i in items])
    for item in items:  # pytest-timeout reads a test's own marker before --timeout
        if item.nodeid in state.budgets:
            item.add_marker(pytest.mark.timeout(state.budgets[item.nodeid]))
    if items:  # after collection, so a file whose imports fail never starts jax here
        state.gates = gates.install()


def _context(mode: str, needs: Needs) -> contextlib.AbstractContextManager[Any]:
    if mode == "sim":
        from coremesh.testing.sim import simulate

        return simulate(needs.chip, needs.devices)
    if needs.device_under_test == "cpu":
        # Written for interpret mode on a CPU: each kernel passes its own InterpretParams, which
        # a forced mode would replace (stock jax computes ``forced or interpret``).
        return contextlib.nullcontext()
    from jax.experimental.pallas import tpu as pltpu

    stock: contextlib.AbstractContextManager[Any] = pltpu.force_tpu_interpret_mode(
        pltpu.InterpretParams()
    )
    return stock


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    state = _state(item.config)
    needs = needs_for(item.nodeid)
    gates.set_needs(needs)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_context(state.mode, needs))
        except Exception as e:  # the slice cannot be made: the test is an error, not a crash
            state.status[item.nodeid] = ("error", f"{type(e).__name__}: {first_line(str(e))}")
        try:
            return (yield)
        finally:
            with contextlib.suppress(Exception):
                stack.close()


def pytest_runtest_logstart(nodeid: str) -> None:
    state = _state(_CONFIG[0])
    state.started[nodeid] = time.perf_counter()
    state.write("start", nodeid=nodeid)


def _classify(report: pytest.TestReport, call: pytest.CallInfo[None]) -> tuple[Status, str]:
    if hasattr(report, "wasxfail"):
        return "skip", first_line(f"expected failure: {report.wasxfail}")
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        return "skip", first_line(reason.removeprefix("Skipped: "))
    excinfo = call.excinfo
    if excinfo is None:
        return "error", _error_line(report.longreprtext)
    said = first_line(str(excinfo.value))
    if not said and excinfo.traceback:
        where = excinfo.traceback[-1]
        said = f"(no message) raised at {Path(where.path).name}:{where.lineno + 1}"
    message = f"{excinfo.typename}: {said}"
    if excinfo.typename == "SimulationDeadlock":
        return "hang", message
    if report.when == "call" and excinfo.errisinstance(AssertionError):
        return "fail", message
    return "error", message


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    state = _state(item.config)
    nodeid = item.nodeid
    if report.when == "setup":
        state.status.setdefault(nodeid, ("pass", ""))
    settled = state.status.get(nodeid, ("pass", ""))
    if (not report.passed or hasattr(report, "wasxfail")) and settled[0] == "pass":
        state.status[nodeid] = _classify(report, call)
    if report.when == "teardown":
        status, message = state.status.pop(nodeid, ("pass", ""))
        seconds = time.perf_counter() - state.started.pop(nodeid, time.perf_counter())
        state.write("result", nodeid=nodeid, status=status, message=message, seconds=seconds)
        _recycle_if_large(item, state.recycle_bytes)
        _relieve_mappings(item)
    return report


def _relieve_mappings(item: pytest.Item) -> None:
    """Drop compiled programs when the process holds more than half the memory mappings a
    process may (``sim.host_mappings``: past the limit XLA:CPU crashes as it compiles), and stop
    the session after this test if it still holds more than three quarters: the runner starts
    a new process for the tests left."""
    from coremesh.testing.sim import host_mappings

    host_mappings.relieve()
    if host_mappings.over(RECYCLE_MAPPINGS_SHARE):
        item.session.shouldstop = (
            f"coremesh: this test process holds {host_mappings.count()} memory mappings, over "
            f"{RECYCLE_MAPPINGS_SHARE:.0%} of the {host_mappings.limit()} a process may; the "
            "runner goes on in a new one"
        )


def _recycle_if_large(item: pytest.Item, limit: int | None) -> None:
    """Stop the session after this test when the process holds more than ``limit`` bytes.

    A process that runs hundreds of tests keeps what jax caches for each (traced functions,
    compiled programs): JAX's splash and paged attention files grow by about 100 MB a test, and
    two such processes side by side exhausted a 24 GiB host (``MemoryError``, and XLA:CPU
    crashing while it compiled). The runner starts a new process for the tests left."""
    if limit is None:
        return
    from coremesh.testing.upstream.memory_budget import resident_bytes

    held = resident_bytes(os.getpid())
    if held is not None and held > limit:
        item.session.shouldstop = (
            f"coremesh: this test process holds {held / 2**30:.1f} GiB, over "
            f"{limit / 2**30:.1f} GiB; the runner goes on in a new one"
        )


def pytest_report_header(config: pytest.Config) -> str:
    return f"coremesh upstream shims: mode={_state(config).mode}, python {sys.version.split()[0]}"
