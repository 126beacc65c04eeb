"""pytest support for compile-only checks: the ``aot`` marker and its fixtures.

A test that asks for ``aot_target`` or ``aot_compile`` runs once per chip (ids ``[v5e]``,
``[TPU7x]``...), on the chips its ``aot`` marker names (default: every generation)::

    @pytest.mark.aot(chips=("v5e", "v5p", "v6e", "TPU7x"), devices=4)
    def test_add_one_compiles(aot_compile):
        aot_compile(PROGRAMS["add_one"]).raise_for_status()   # the coremesh error, if any

    @pytest.mark.aot(mode="split")
    def test_matrix(aot_matrix):
        results = aot_matrix(PROGRAMS.values())                # one test, every chip
        assert all(r.as_expected for r in results)

Marker keywords: ``chips`` (names or a comma-separated string), ``devices``, ``mode``
(``"megacore"``/``"split"``) or ``cores_per_device``. Tests are skipped only when libtpu is not
installed, with a reason that names the libtpu to install.

Load it with ``pytest_plugins = ("coremesh.testing.aot.pytest_support",)`` in a pytest plugin or
the top-level conftest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from coremesh.core.chips import get_chip
from coremesh.testing.aot import versions
from coremesh.testing.aot.compile import (
    DEFAULT_CHIPS,
    CompileResult,
    compile_matrix,
    compile_on,
)
from coremesh.testing.aot.program import as_programs
from coremesh.testing.aot.topology import CompileTarget

MARKER = "aot"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(chips=None, devices=None, mode=None, cores_per_device=None): compile for "
        "real TPU generations with libtpu, no TPU needed; tests using aot_target/aot_compile "
        "run once per chip",
    )


def _options(node: Any) -> dict[str, Any]:
    marker = node.get_closest_marker(MARKER) if node is not None else None
    kwargs = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        kwargs.setdefault("chips", marker.args[0])
    chips = kwargs.get("chips") or DEFAULT_CHIPS
    if isinstance(chips, str):
        chips = [c for c in chips.split(",") if c.strip()]
    return {
        "chips": [get_chip(c).name for c in chips],
        "devices": kwargs.get("devices"),
        "mode": kwargs.get("mode"),
        "cores_per_device": kwargs.get("cores_per_device"),
    }


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "aot_chip" not in metafunc.fixturenames:
        return
    chips = _options(metafunc.definition)["chips"]
    metafunc.parametrize("aot_chip", chips, ids=chips)


def _need_libtpu() -> None:
    """Skip, saying what is missing and how to install it, where there is no libtpu."""
    try:
        versions.require_compiler()
    except versions.LibtpuError as e:
        pytest.skip(f"{e.what}; fix: {e.fix}")


@pytest.fixture
def aot_target(request: pytest.FixtureRequest, aot_chip: str) -> CompileTarget:
    """The compile-only target for this test's chip (one test per chip of the marker)."""
    _need_libtpu()
    opts = _options(request.node)
    return CompileTarget.for_chip(
        aot_chip,
        devices=opts["devices"],
        mode=opts["mode"],
        cores_per_device=opts["cores_per_device"],
    )


@pytest.fixture
def aot_compile(aot_target: CompileTarget) -> Callable[..., CompileResult]:
    """``aot_compile(program, prevalidate=True)``: compile for this test's chip."""

    def run(program: Any, *, prevalidate: bool = True, keep_executable: bool = False) -> Any:
        (p,) = as_programs(program)
        return compile_on(p, aot_target, prevalidate=prevalidate, keep_executable=keep_executable)

    return run


@pytest.fixture
def aot_matrix(request: pytest.FixtureRequest) -> Callable[..., list[CompileResult]]:
    """``aot_matrix(programs)``: compile programs for every chip of the marker, in this test."""
    _need_libtpu()
    opts = _options(request.node)

    def run(
        programs: Any, *, chips: Sequence[str] | None = None, prevalidate: bool = True
    ) -> list[CompileResult]:
        found = as_programs(programs)
        return compile_matrix(
            found,
            chips or opts["chips"],
            devices=opts["devices"],
            mode=opts["mode"],
            cores_per_device=opts["cores_per_device"],
            prevalidate=prevalidate,
        )

    return run
