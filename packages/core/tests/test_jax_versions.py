"""The tested jax lines: reading and comparing versions, refusing old ones, warning on new ones."""

from __future__ import annotations

import sys
import warnings

import jax
import pytest

from coremesh.core import CoremeshError, CoremeshWarning, jax_versions


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0.10.2", (0, 10, 2)),
        ("0.12.0.1", (0, 12, 0, 1)),
        ("0.12.0", (0, 12)),  # trailing zeros do not count: 0.12.0 == 0.12
        ("0.11.0", (0, 11)),
        ("0.11.2.dev20261201", (0, 11, 2)),  # a nightly counts as the release it leads to
        ("0.10.2+cuda12", (0, 10, 2)),
        (" 0.12.0.1\n", (0, 12, 0, 1)),
        ("1", (1,)),
    ],
)
def test_parse(text: str, parsed: tuple[int, ...]) -> None:
    assert jax_versions.parse(text) == parsed


def test_parse_orders_versions_as_numbers() -> None:
    order = ["0.9.4", "0.10.2", "0.11.0", "0.11.2", "0.12.0", "0.12.0.1", "0.12.1", "0.13.0"]
    assert sorted(order, key=jax_versions.parse) == order
    assert jax_versions.parse("0.10.2") > jax_versions.parse("0.9.10")


@pytest.mark.parametrize("text", ["", "jax", "v0.12", "latest"])
def test_parse_refuses_what_is_no_version(text: str) -> None:
    with pytest.raises(CoremeshError, match="cannot read the jax version") as e:
        jax_versions.parse(text)
    assert repr(text) in str(e.value)
    assert e.value.fix


def test_installed_is_jax_own_version() -> None:
    assert jax_versions.installed() == jax.__version__


@pytest.mark.parametrize(
    ("version", "found", "expected"),
    [
        ("0.11.0", "0.11.2", True),
        ("0.11.0", "0.11.0", True),
        ("0.11.0", "0.10.2", False),
        ("0.12", "0.12.0", True),
        ("0.12.0.1", "0.12.0", False),
        ("0.12.0.1", "0.12.0.1", True),
        ("0.11.0", "0.12.0.1", True),
        ("0.10.2", "0.9.4", False),
    ],
)
def test_at_least(version: str, found: str, expected: bool) -> None:
    assert jax_versions.at_least(version, found) is expected


def test_at_least_reads_the_installed_jax() -> None:
    mine = jax.__version__
    assert jax_versions.at_least(mine)
    assert jax_versions.at_least(jax_versions.MINIMUM)
    assert not jax_versions.at_least("99.0")


def test_tested_lines_are_ordered_and_each_names_its_python() -> None:
    assert jax_versions.TESTED == ("0.10.2", "0.11.2", "0.12.0.1")
    assert jax_versions.MINIMUM == "0.10.2"
    parsed = [jax_versions.parse(t) for t in jax_versions.TESTED]
    assert parsed == sorted(parsed)
    assert set(jax_versions.PYTHON_FOR_LINE) == set(jax_versions.TESTED)
    assert jax_versions.PYTHON_FOR_LINE["0.10.2"] == (3, 11)
    assert jax_versions.PYTHON_FOR_LINE["0.11.2"] == (3, 12)


def test_this_python_suits_the_installed_line() -> None:
    line = jax_versions.line_of()
    assert line in jax_versions.TESTED
    assert sys.version_info[:2] >= jax_versions.PYTHON_FOR_LINE[line]


def test_supported_range() -> None:
    assert jax_versions.supported_range() == "jax 0.10.2 to 0.12.0.1"


def test_check_accepts_every_tested_release_and_the_installed_one() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for tested in jax_versions.TESTED:
            jax_versions.check(tested)
        jax_versions.check("0.11.0")  # between tested releases: supported, no warning
        jax_versions.check("0.12.0.1.dev20261201")  # a nightly of the newest tested release
        jax_versions.check()


@pytest.mark.parametrize("old", ["0.9.4", "0.10.1", "0.10.0", "0.4.38"])
def test_check_refuses_older_than_minimum_with_the_range(old: str) -> None:
    with pytest.raises(CoremeshError) as e:
        jax_versions.check(old)
    msg = str(e.value)
    assert f"jax {old} is installed" in msg
    assert "at least jax 0.10.2" in msg
    assert "jax 0.10.2 to 0.12.0.1" in msg  # the rule names the whole supported range
    assert 'pip install "jax>=0.10.2"' in msg
    assert "Python 3.12" in msg  # the fix says the newer lines need a newer Python


def test_check_warns_once_per_version_newer_than_tested() -> None:
    newer = "0.14.7"  # no other test uses this version, so its first check here is its first
    with pytest.warns(CoremeshWarning) as record:
        jax_versions.check(newer)
    assert len(record) == 1
    msg = str(record[0].message)
    assert "jax 0.14.7 is newer than any release coremesh is tested on" in msg
    assert "jax 0.10.2 to 0.12.0.1" in msg
    assert "jax==0.12.0.1" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax_versions.check(newer)  # the second time is silent
        jax_versions.check(newer)
    with pytest.warns(CoremeshWarning, match=r"jax 0\.12\.0\.2 is newer"):
        jax_versions.check("0.12.0.2")  # another version warns on its own


def test_warning_points_at_the_caller() -> None:
    def caller() -> None:
        jax_versions.check("0.15.3")

    with pytest.warns(CoremeshWarning) as record:
        caller()
    assert record[0].filename != jax_versions.__file__


@pytest.mark.parametrize(
    ("found", "line"),
    [
        ("0.10.2", "0.10.2"),
        ("0.10.0", "0.10.2"),
        ("0.11.0", "0.11.2"),
        ("0.11.1", "0.11.2"),
        ("0.11.2", "0.11.2"),
        ("0.11.9", "0.11.2"),
        ("0.12.0", "0.12.0.1"),
        ("0.12.0.1", "0.12.0.1"),
        ("0.12.3", "0.12.0.1"),
        ("0.13.0", "0.12.0.1"),  # newer than every line: the newest tested below it
        ("1.0", "0.12.0.1"),
        ("0.9.4", "0.10.2"),  # older than every line: the oldest
    ],
)
def test_line_of(found: str, line: str) -> None:
    assert jax_versions.line_of(found) == line


def test_line_of_the_installed_jax_shares_its_major_minor() -> None:
    line = jax_versions.line_of()
    assert jax_versions.parse(line)[:2] == jax_versions.parse(jax.__version__)[:2]


@pytest.mark.parametrize("package", ["core", "tensorcore", "sparsecore", "collectives", "testing"])
def test_package_metadata_declares_the_tested_range(package: str) -> None:
    """pip installs what ``check`` accepts: from MINIMUM up to, not including, the next line.

    Read from each package's pyproject.toml in the checkout: core's test environment holds no
    other coremesh package."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[2] / package / "pyproject.toml"
    with pyproject.open("rb") as f:
        reqs = [Requirement(r) for r in tomllib.load(f)["project"]["dependencies"]]
    (jax_req,) = [r for r in reqs if r.name == "jax"]
    spec = jax_req.specifier
    for tested in jax_versions.TESTED:
        assert spec.contains(tested), (package, tested, str(spec))
    newest = jax_versions.parse(jax_versions.TESTED[-1])
    assert spec.contains(f"{newest[0]}.{newest[1]}.9")  # later patches of the newest line
    assert not spec.contains(f"{newest[0]}.{newest[1] + 1}.0")  # the next line is untested
    assert not spec.contains("0.10.1")
