"""The ``aot`` marker and fixtures, in this session and in a fresh pytest run."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from coremesh.testing.aot import CompileTarget
from coremesh.testing.guide import PROGRAMS as GUIDE


@pytest.mark.aot(chips=("v5e", "TPU7x"))
def test_marker_runs_the_test_once_per_chip(
    request: pytest.FixtureRequest, aot_target: CompileTarget, aot_compile: Callable[..., Any]
) -> None:
    chip = aot_target.chip.name
    node: Any = request.node
    assert node.callspec.params["aot_chip"] == chip
    assert node.name.endswith(f"[{chip}]")
    result = aot_compile(GUIDE["add_one"]).raise_for_status()
    assert (result.chip, result.num_devices, result.status) == (chip, 4, "ok")


@pytest.mark.aot(chips="v4,v5p", mode="split")
def test_matrix_fixture_follows_the_marker(aot_matrix: Callable[..., Any]) -> None:
    results = aot_matrix(GUIDE["add_one"])
    assert [(r.chip, r.mode, r.cores_per_device) for r in results] == [
        ("v4", "split", 1),
        ("v5p", "split", 1),
    ]
    assert all(r.ok for r in results)


def test_a_fresh_session_reports_compile_errors_with_their_fix(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["coremesh.testing.aot.pytest_support"]')
    pytester.makepyfile(
        textwrap.dedent(
            """
            import pytest
            from coremesh.testing.aot import samples
            from coremesh.testing.guide import PROGRAMS

            @pytest.mark.aot(chips="v5e,v6e")
            def test_add_one(aot_compile):
                aot_compile(PROGRAMS["add_one"]).raise_for_status()

            @pytest.mark.aot(chips=["v5e"])
            def test_too_much_vmem(aot_compile):
                aot_compile(samples.VMEM_48_MIB, prevalidate=False).raise_for_status()

            def test_every_chip_without_a_marker(aot_target):
                assert aot_target.num_devices == 4
            """
        )
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=7, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_too_much_vmem?v5e?*",
            "*CompilerCapacityError*",
            "*vmem_limit_bytes=53 * 1024 * 1024*",
            "*Compiler said: JaxRuntimeError: RESOURCE_EXHAUSTED: E1001*",
        ]
    )
