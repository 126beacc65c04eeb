"""README.md, run as a reader runs it: each marked block, in a fresh copy of the packages.

A block under ``<!-- readme-test: TAG -->`` is run here: ``install-*`` and ``shell`` blocks with
bash in the copy, ``file NAME`` blocks are written there, ``run`` blocks are saved and run with the
Python of the environment ``install-all`` made. Package READMEs' ``run`` blocks run the same way.
So a command or program the README shows cannot rot without this failing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(
    r"<!-- readme-test: (?P<tag>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```", re.S
)
#: Seconds for one block: an install downloads jax and libtpu the first time.
INSTALL_TIMEOUT = 1800
RUN_TIMEOUT = 600


def blocks(path: Path) -> dict[str, str]:
    """tag -> body of every marked block of one README (``run`` blocks numbered from 1)."""
    found: dict[str, str] = {}
    for n, m in enumerate(BLOCK.finditer(path.read_text()), start=1):
        tag = m.group("tag").strip()
        found[f"{tag} {n}" if tag in ("run", "shell") else tag] = m.group("body")
    return found


README = blocks(ROOT / "README.md")


def only(prefix: str) -> str:
    (body,) = [b for t, b in README.items() if t.startswith(prefix)]
    return body


def sh(body: str, cwd: Path, timeout: float = INSTALL_TIMEOUT) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", body],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{body}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a reader has after cloning: the packages and the README (no build outputs)."""
    where = tmp_path_factory.mktemp("clone")
    skip = shutil.ignore_patterns(".venv*", "dist", "build", "__pycache__", "*.egg-info", ".nox")
    shutil.copytree(ROOT / "packages", where / "packages", ignore=skip)
    shutil.copytree(ROOT / "constraints", where / "constraints")
    return where


@pytest.fixture(scope="module")
def installed(clone: Path) -> Path:
    out = sh(only("install-all"), clone)
    for chip in ("v4", "v5e", "v5p", "v6e", "TPU7x"):
        assert chip in out, out  # `coremesh info` lists the chip registry
    return clone / ".venv" / "bin" / "python"


def test_the_quick_tour_runs_as_written(installed: Path, clone: Path) -> None:
    (clone / "tour.py").write_text(only("run"))
    out = sh(f"{installed} tour.py", clone, RUN_TIMEOUT)
    assert "add_one and reduce match numpy on Simulator(v5p, devices=4" in out


def test_coremesh_check_compiles_the_readers_kernel(installed: Path, clone: Path) -> None:
    (clone / "mykernel.py").write_text(README["file mykernel.py"])
    out = sh(only("shell"), clone, RUN_TIMEOUT)
    assert "5/5 as expected (5 compiled)" in out, out


def test_one_backend_installs_alone(clone: Path) -> None:
    out = sh(only("install-one-backend"), clone)
    assert "coremesh.tensorcore ok" in out
    listing = sh(".venv-tc/bin/pip list --format=freeze", clone)
    ours = sorted(line.split("==")[0] for line in listing.split() if line.startswith("coremesh"))
    assert ours == ["coremesh-core", "coremesh-tensorcore"]


def test_installing_beside_jax_0_12_keeps_it(clone: Path) -> None:
    if shutil.which("python3.12") is None:
        pytest.skip("needs python3.12 on PATH (jax 0.12 needs Python 3.12 or newer)")
    sh(only("install-beside-jax-0.12"), clone)  # the block asserts the version itself


#: (README, block number, program) of every ``run`` block in a package README.
PACKAGE_PROGRAMS = [
    (readme, n, body)
    for readme in sorted(ROOT.glob("packages/*/README.md"))
    for n, (tag, body) in enumerate(blocks(readme).items())
    if tag.startswith("run")
]


def test_package_readmes_have_programs_to_run() -> None:
    assert {r.parent.name for r, _, _ in PACKAGE_PROGRAMS} >= {"testing"}


@pytest.mark.parametrize(
    ("readme", "n", "body"),
    PACKAGE_PROGRAMS,
    ids=[f"{r.parent.name}-{n}" for r, n, _ in PACKAGE_PROGRAMS],
)
def test_package_readme_program_runs(
    readme: Path, n: int, body: str, installed: Path, clone: Path
) -> None:
    script = clone / f"{readme.parent.name}_{n}.py"
    script.write_text(body)
    sh(f"{installed} {script.name}", clone, RUN_TIMEOUT)


def test_every_marked_block_is_used() -> None:
    tags = {t.split(" ")[0] if t.split(" ")[0] in ("run", "shell") else t for t in README}
    assert tags == {
        "install-all",
        "install-one-backend",
        "install-beside-jax-0.12",
        "run",
        "file mykernel.py",
        "shell",
    }, "a new marked README block needs a test here"
    assert sys.version_info >= (3, 11)


PACKAGES = ("core", "tensorcore", "sparsecore", "collectives", "testing")
MODULE = re.compile(r"`(?:coremesh\.)?(?P<pkg>" + "|".join(PACKAGES) + r")\.(?P<path>[a-z_.]+)")


def test_architecture_names_only_modules_that_exist() -> None:
    """Every ``pkg.module`` ARCHITECTURE.md names is a module (or a name in one) of the tree."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = {(m["pkg"], m["path"].rstrip(".")) for m in MODULE.finditer(text)}
    assert len(named) > 20
    missing = []
    for pkg, path in sorted(named):
        parts, base = path.split("."), ROOT / "packages" / pkg / "src" / "coremesh" / pkg
        # The longest prefix that is a module or package; the rest names something inside it.
        found = any(
            (base.joinpath(*parts[:k]).with_suffix(".py")).is_file()
            or (base.joinpath(*parts[:k]) / "__init__.py").is_file()
            for k in range(len(parts), 0, -1)
        )
        if not found:
            missing.append(f"{pkg}.{path}")
    assert not missing, f"ARCHITECTURE.md names modules that do not exist: {missing}"
