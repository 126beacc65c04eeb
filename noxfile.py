"""Sessions for the coremesh monorepo.

Each package is tested in an environment that holds only itself, the coremesh packages it
declares (dependencies and its ``test`` group) and their third-party dependencies, so an
undeclared import fails here rather than for a user. Every install is pinned by
``constraints.txt``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
import zipfile
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).parent
PACKAGES = ("core", "tensorcore", "sparsecore", "collectives", "testing")
CONSTRAINTS = str(ROOT / "constraints.txt")
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# libtpu probes for a TPU at start-up and prints warnings without one; these settings silence it
# without changing compile results. Several processes (pytest and the cycle-estimate children)
# may load libtpu at once, which its lock file otherwise refuses.
LIBTPU_ENV = {
    "TPU_ACCELERATOR_TYPE": "v5p-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def _pyproject(pkg: str) -> dict[str, object]:
    with (ROOT / "packages" / pkg / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _local_requirements(pkg: str, *, with_tests: bool) -> list[str]:
    """Names of coremesh packages ``pkg`` needs, transitively (dependencies and test group)."""
    seen: list[str] = []
    todo = [(pkg, with_tests)]
    while todo:
        name, tests = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        meta = _pyproject(name)
        project = meta["project"]
        assert isinstance(project, dict)
        reqs = list(project.get("dependencies", []))
        if tests:
            groups = meta.get("dependency-groups", {})
            assert isinstance(groups, dict)
            reqs += groups.get("test", [])
        for req in reqs:
            if req.startswith("coremesh-"):
                dep = req.removeprefix("coremesh-").split(">")[0].split("<")[0].split("=")[0]
                todo.append((dep.strip(), False))
    return seen


def _install(
    session: nox.Session, pkg: str, *, with_tests: bool, extra: tuple[str, ...] = ()
) -> None:
    paths = [str(ROOT / "packages" / p) for p in _local_requirements(pkg, with_tests=with_tests)]
    args = ["-c", CONSTRAINTS, *paths, *extra]
    if with_tests:
        args += ["--group", f"{ROOT / 'packages' / pkg / 'pyproject.toml'}:test"]
    session.install(*args)


@nox.session(python=PYTHON)
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package's tests on the CPU simulator and compile-only targets."""
    _install(session, package, with_tests=True)
    session.chdir(ROOT / "packages" / package)
    session.run("pytest", "tests", *session.posargs, env=LIBTPU_ENV)


@nox.session(python=PYTHON)
def tpu_tests(session: nox.Session) -> None:
    """The same suites on real TPU hardware; says so and passes when there is none."""
    _install(
        session, "collectives", with_tests=True, extra=(str(ROOT / "packages" / "sparsecore"),)
    )
    probe = (
        "import jax\n"
        "try:\n    d = jax.devices('tpu')\nexcept RuntimeError:\n    d = []\n"
        "print(len(d), d[0].device_kind if d else '')\n"
    )
    out = session.run("python", "-c", probe, silent=True) or "0"
    count, _, kind = str(out).strip().splitlines()[-1].partition(" ")
    if count == "0":
        session.log("No TPU on this machine: tpu_tests ran nothing. Run it on a TPU VM.")
        return
    session.log(f"Running on {count} x {kind}: simulate() hands the tests the local TPU")
    for package in PACKAGES:
        session.chdir(ROOT / "packages" / package)
        # Not LIBTPU_ENV: on a TPU VM libtpu must see the real accelerator type.
        session.run(
            "pytest",
            "tests",
            "--coremesh-target=hardware",
            *session.posargs,
            env={"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
        )


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: run the core_map guide's programs on the simulator, compile them for every
    TPU generation and show what ran where."""
    for pkg in ("tensorcore", "sparsecore", "collectives", "testing"):
        _install(session, pkg, with_tests=False)
    session.run("coremesh", "demo", *session.posargs, env=LIBTPU_ENV)


@nox.session(python=PYTHON)
def aot(session: nox.Session) -> None:
    """Compile every kernel the project ships for every chip; fail on any regression."""
    for pkg in ("tensorcore", "sparsecore", "collectives", "testing"):
        _install(session, pkg, with_tests=False)
    session.run("coremesh", "aot-all", *session.posargs, env=LIBTPU_ENV)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: simulator speed, compile matrix, static cycles against the roofline.
    Writes tables (markdown + JSON) and charts (PNG) to bench-results/."""
    for pkg in ("tensorcore", "sparsecore", "collectives", "testing"):
        _install(session, pkg, with_tests=False)
    session.install("-c", CONSTRAINTS, "matplotlib>=3.8")
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    if not scripts:
        session.error("no benchmarks found under benchmarks/")
    for script in scripts:
        session.run("python", str(script), "--out", str(out), *session.posargs, env=LIBTPU_ENV)
    session.log(f"results in {out}")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's sources and tests."""
    paths = [str(ROOT / "packages" / p) for p in PACKAGES]
    session.install("-c", CONSTRAINTS, *paths, "mypy>=1.15", "pytest>=8", "nox>=2025.2.9")
    srcs = [str(ROOT / "packages" / p / d) for p in PACKAGES for d in ("src", "tests")]
    # examples/ stays as close to the core_map guide's text as it can, so it is linted, not typed.
    extra = [str(ROOT / d) for d in ("benchmarks", "noxfile.py")]
    session.run("mypy", *srcs, *extra, *session.posargs)


@nox.session(python=PYTHON, venv_backend="uv|virtualenv")
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff>=0.11")
    session.run("ruff", "check", ".", *session.posargs)
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """One wheel and sdist per package in dist/, then prove a backend installs alone from them."""
    session.install("uv>=0.8")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for pkg in PACKAGES:
        session.run("uv", "build", "--quiet", "--out-dir", str(dist), str(ROOT / "packages" / pkg))
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    session.log("\n".join(wheels))
    if len(wheels) != len(PACKAGES):
        session.error(f"expected {len(PACKAGES)} wheels, got {wheels}")
    for wheel in dist.glob("*.whl"):
        names = zipfile.ZipFile(wheel).namelist()
        if "coremesh/__init__.py" in names:
            session.error(
                f"{wheel.name} ships coremesh/__init__.py: the namespace must stay PEP 420"
            )
        if not any(n.endswith("/py.typed") for n in names):
            session.error(f"{wheel.name} has no py.typed")
    # Installing the TensorCore backend alone must pull coremesh-core and jax, nothing else of ours.
    probe = session.create_tmp()
    venv = os.path.join(probe, "alone")
    session.run("uv", "venv", "--quiet", "--clear", "--python", sys.executable, venv)
    py = os.path.join(venv, "bin", "python")
    session.run(
        "uv",
        "pip",
        "install",
        "--quiet",
        "--python",
        py,
        "-c",
        CONSTRAINTS,
        "--find-links",
        str(dist),
        "coremesh-tensorcore",
    )
    listing = session.run("uv", "pip", "list", "--python", py, silent=True) or ""
    ours = sorted(
        line.split()[0] for line in str(listing).splitlines() if line.startswith("coremesh")
    )
    session.log(f"installed with coremesh-tensorcore: {ours}")
    if ours != ["coremesh-core", "coremesh-tensorcore"]:
        session.error(f"coremesh-tensorcore pulled {ours}")
    if "libtpu" in str(listing):
        session.error("coremesh-tensorcore pulled libtpu; only coremesh-testing may")
    session.run(
        py, "-c", "import coremesh.tensorcore, coremesh.core; print('import ok')", external=True
    )
