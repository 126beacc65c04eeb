"""The libtpu coremesh needs: missing or too old gives an error (or a skip) that says what to do."""

from __future__ import annotations

import textwrap
import warnings
from importlib import metadata
from typing import Any

import jax
import pytest

from coremesh.core.errors import CoremeshWarning, MeshError
from coremesh.testing.aot import compile_on, profile, versions
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.cli import main
from coremesh.testing.guide import PROGRAMS as GUIDE

ADD_ONE = "coremesh.testing.aot.guide:PROGRAMS[add_one]"


def fake_libtpu(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    monkeypatch.setattr(versions, "libtpu_version", lambda: version)


def test_the_installed_versions_are_read_from_the_distributions() -> None:
    assert versions.libtpu_version() == metadata.version("libtpu")
    assert versions.jax_version() == jax.__version__


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0.0.52", (0, 0, 52)),
        ("0.0.50.1", (0, 0, 50, 1)),
        ("0.0.53.dev20261201+nightly", (0, 0, 53)),
        ("nonsense", ()),
    ],
)
def test_versions_parse_as_numbers(text: str, parsed: tuple[int, ...]) -> None:
    assert versions.parse(text) == parsed


@pytest.mark.parametrize("found", ["0.0.52", "0.0.53", "0.0.53.dev20261201+nightly", "0.1.0"])
def test_static_profile_takes_0_0_52_and_newer(found: str) -> None:
    versions.check_libtpu(found, needed="0.0.52", purpose="static cycle estimates")


@pytest.mark.parametrize("found", ["0.0.42.1", "0.0.48.1", "0.0.50.1", "0.0.51"])
def test_static_profile_refuses_an_older_libtpu(found: str) -> None:
    with pytest.raises(versions.LibtpuError) as e:
        versions.check_libtpu(found, needed="0.0.52", purpose="static cycle estimates")
    err = e.value
    assert (err.found, err.needed) == (found, "0.0.52")
    assert f"libtpu {found} is installed" in err.what and "0.0.52 or newer" in err.what
    assert "pip install libtpu==0.0.52" in str(err.fix)
    assert "TPU7x" in str(err.rule)


def test_profile_refuses_an_old_libtpu_before_starting_a_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_libtpu(monkeypatch, "0.0.42.1")
    started: list[Any] = []
    with pytest.raises(versions.LibtpuError) as e:
        profile([ADD_ONE], ["v5p"], include_xla=False, progress=started.append)
    assert started == []
    message = str(e.value)
    assert "libtpu 0.0.42.1 is installed" in message
    assert "static cycle estimates need libtpu 0.0.52 or newer" in message
    assert "pip install libtpu==0.0.52" in message


def test_profile_without_libtpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_libtpu(monkeypatch, None)
    with pytest.raises(versions.LibtpuError, match="libtpu is not installed") as e:
        profile([ADD_ONE], ["v5p"], include_xla=False)
    assert e.value.found is None and "pip install libtpu==0.0.52" in str(e.value.fix)


def test_compiling_without_libtpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_libtpu(monkeypatch, None)
    with pytest.raises(versions.LibtpuError) as e:
        compile_on(GUIDE["add_one"], CompileTarget.for_chip("v6e"))
    assert "compile-only checks need libtpu" in e.value.what
    assert "pip install libtpu==0.0.52" in str(e.value.fix)


def test_compiling_with_an_older_libtpu_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Any libtpu compiles; only the static profile needs 0.0.52.
    fake_libtpu(monkeypatch, "0.0.42.1")
    assert compile_on(GUIDE["add_one"], CompileTarget.for_chip("v6e")).status == "ok"


def test_a_topology_an_older_libtpu_refuses_names_the_upgrade(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # libtpu 0.0.42.1 refuses TPU7x:2x1x1 (measured); here libtpu 0.0.52 refuses v6e:3x3, which
    # is a plain MeshError with the libtpu coremesh is built against, and names the upgrade
    # with an older one.
    with pytest.raises(MeshError, match="libtpu has no topology v6e:3x3"):
        CompileTarget.for_chip("v6e", topology="3x3").devices  # noqa: B018
    fake_libtpu(monkeypatch, "0.0.42.1")
    with pytest.raises(versions.LibtpuError) as e:
        CompileTarget.for_chip("v6e", topology="3x3").devices  # noqa: B018
    assert "libtpu 0.0.42.1 has no topology v6e:3x3" in e.value.what
    assert (e.value.found, e.value.needed, e.value.chip) == ("0.0.42.1", "0.0.52", "v6e")
    assert "pip install libtpu==0.0.52" in str(e.value.fix)
    assert "not divisible" in str(e.value.rule)  # libtpu's own words


def test_the_cli_reports_a_missing_libtpu_as_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_libtpu(monkeypatch, None)
    assert main(["check", ADD_ONE, "--chips", "v6e", "-q"]) == 2
    err = capsys.readouterr().err
    assert "coremesh check: libtpu is not installed" in err and "pip install libtpu==" in err
    fake_libtpu(monkeypatch, "0.0.50.1")
    assert main(["profile", ADD_ONE, "--chips", "v6e", "-q"]) == 2
    err = capsys.readouterr().err
    assert "libtpu 0.0.50.1 is installed" in err and "pip install libtpu==0.0.52" in err


def test_aot_fixtures_skip_without_libtpu_and_name_the_fix(
    monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester
) -> None:
    fake_libtpu(monkeypatch, None)
    pytester.makeconftest('pytest_plugins = ["coremesh.testing.aot.pytest_support"]')
    pytester.makepyfile(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.aot(chips="v5e,v6e")
            def test_one(aot_target):
                pass

            def test_matrix(aot_matrix):
                pass
            """
        )
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*libtpu is not installed*pip install libtpu==0.0.52*"])


@pytest.mark.parametrize(
    ("name", "line", "changed"),
    [
        ("bool_operand", "0.10.2", False),
        ("bool_operand", "0.11.2", True),
        ("bool_operand", "0.12.0.1", True),
        ("x64_pipeline", "0.10.2", False),
        ("x64_pipeline", "0.11.2", False),
        ("x64_pipeline", "0.12.0.1", True),
        ("traced_attribute", "0.10.2", False),
        ("traced_attribute", "0.11.2", True),
    ],
)
def test_compiler_changes_by_line(name: str, line: str, changed: bool) -> None:
    assert versions.has_change(name, line) is changed
    change = versions.COMPILER_CHANGES[name]
    assert change.kernel and change.before and change.after


def test_the_bool_change_is_jaxs_lowering() -> None:
    # The reason given for the bool row: jax 0.10's DMA lowering refuses bool, later ones do not.
    import inspect

    from jax._src.pallas.mosaic import lowering

    refuses = "DMAs with bool dtypes are not supported" in inspect.getsource(lowering)
    assert refuses is not versions.has_change("bool_operand")


def test_the_traced_attribute_change_is_jaxs_tracer() -> None:
    # The reason given for that row: from 0.11 a Tracer's memory_space is a property that raises.
    from jax._src import core

    raises = isinstance(getattr(core.Tracer, "memory_space", None), property)
    assert raises is versions.has_change("traced_attribute")


def test_a_libtpu_older_than_jaxs_lowering_warns_once_a_pair() -> None:
    with pytest.warns(CoremeshWarning, match=r"jax 0\.12\.7's Mosaic lowering .* libtpu 0\.0\.53"):
        assert versions.warn_if_older_than_lowering("0.0.51", "0.12.7")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert versions.warn_if_older_than_lowering("0.0.51", "0.12.7")  # cached: no warning
        assert not versions.warn_if_older_than_lowering("0.0.53", "0.12.7")
        assert not versions.warn_if_older_than_lowering("0.0.52", "0.12.0.1")
        assert not versions.warn_if_older_than_lowering("0.0.52", "0.10.2")


def test_the_libtpu_jaxs_lowering_asks_for_is_read_from_jax() -> None:
    """jax's own lowering names the oldest libtpu it runs with (lowering.py): on the installed
    jax it is the one ``lowering_libtpu`` records, or one the tested libtpu satisfies."""
    import inspect
    import re

    from jax._src.pallas.mosaic import lowering

    source = inspect.getsource(lowering)
    asked = set(re.findall(r"requires a recent libtpu version \(at least ([\d.]+)\)", source))
    assert len(asked) <= 1, asked  # jax 0.10.2 asks for none
    needed = asked.pop() if asked else "0"
    recorded = versions.lowering_libtpu()
    if recorded is None:
        assert versions.parse(needed) <= versions.parse(versions.TESTED_LIBTPU)
    else:
        assert recorded == needed
