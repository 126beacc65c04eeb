"""Sessions for the coremesh monorepo.

Each package is tested in an environment that holds only itself, the coremesh packages it
declares (dependencies and its ``test`` group) and their third-party dependencies, so an
undeclared import fails here rather than for a user.

coremesh runs on several jax lines, each on the Python it needs (``JAX_LINES``). Every session
that installs jax comes in two forms:

* ``tests``, ``demo``, ``aot``, ``typecheck``, ``bench``: the newest line this machine has a
  Python for; the log says which jax ran;
* ``tests-<jax>-py<X.Y>``, ``demo-<jax>-py<X.Y>``, ...: one line, e.g.
  ``nox -s tests-0.10.2-py3.11`` or ``nox -s "tests-0.12.0.1-py3.13(package='core')"``;
  ``nox -t tests-all-lines`` (and ``typecheck-all-lines``, ...) runs every line.

A line whose Python is missing is skipped with a message that names it (NOT RUN), never passed;
``nox -s lines`` shows the interpreter each line uses. Every install of a line is pinned by
``constraints/jax-<jax>.txt``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_venv = "yes"
# Reuse an environment only if it was made from the interpreter its session asks for now: the
# plain sessions (tests, demo, ...) move to a newer Python when one is installed.
os.environ.setdefault("NOX_ENABLE_STALENESS_CHECK", "1")

ROOT = Path(__file__).parent
# Every process a session starts (pytest, the upstream runner's children, the compile children)
# imports jax. Where the machine sets PYTHONDONTWRITEBYTECODE (CI machines often do) each one
# compiled jax from source again, about 3 s a start on 2 CPUs; the sessions keep bytecode under
# .nox/pycache instead, never beside the sources.
os.environ.setdefault("PYTHONPYCACHEPREFIX", str(ROOT / ".nox" / "pycache"))
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
PACKAGES = ("core", "tensorcore", "sparsecore", "collectives", "testing")
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# The tested jax lines, oldest first, and the Pythons each one runs on. The same values as
# TESTED and PYTHON_FOR_LINE in packages/core/src/coremesh/core/jax_versions.py (a line's first
# Python is the one PYTHON_FOR_LINE names); this file imports nothing from the packages, so a
# change there is made here too. Each line is pinned by constraints/jax-<line>.txt.
JAX_LINES: dict[str, tuple[str, ...]] = {
    "0.10.2": ("3.11",),
    "0.11.2": ("3.12",),
    "0.12.0.1": ("3.12", "3.13"),
}
# libtpu probes for a TPU at start-up and prints warnings without one; these settings silence it
# without changing compile results. Several processes (pytest and the cycle-estimate children)
# may load libtpu at once, which its lock file otherwise refuses.
LIBTPU_ENV = {
    "TPU_ACCELERATOR_TYPE": "v5p-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}

_PROBE = "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])"


def _runs_as(candidate: str, version: str) -> str | None:
    """The executable behind ``candidate`` if it starts and is Python ``version``, else None.

    A pyenv shim is on PATH for every installed version but only runs for the active ones, so a
    name on PATH proves nothing until it has run."""
    try:
        out = subprocess.run(
            [candidate, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != 2 or lines[1] != version:
        return None
    return lines[0]


def _pyenv_pythons(version: str) -> list[str]:
    """``$(pyenv root)/versions/X.Y.*/bin/pythonX.Y``, newest patch release first."""
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return []
    try:
        root = subprocess.run(
            [pyenv, "root"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    found: list[tuple[int, str]] = []
    for path in Path(root, "versions").glob(f"{version}.*"):
        patch = path.name.removeprefix(f"{version}.")
        exe = path / "bin" / f"python{version}"
        if patch.isdigit() and exe.is_file():  # 3.12.1, not 3.12-dev or 3.13.0t
            found.append((int(patch), str(exe)))
    return [exe for _, exe in sorted(found, reverse=True)]


@functools.cache
def find_python(version: str) -> str | None:
    """Python ``version`` ("3.12") as a user's machine has it: ``python3.12`` on PATH, else the
    newest 3.12.x that pyenv has installed (active or not). None when there is neither."""
    on_path = shutil.which(f"python{version}")
    if on_path is not None and (exe := _runs_as(on_path, version)):
        return exe
    for candidate in _pyenv_pythons(version):
        if exe := _runs_as(candidate, version):
            return exe
    return None


@dataclasses.dataclass(frozen=True)
class Line:
    """One jax line on one Python."""

    jax: str
    python: str

    @property
    def name(self) -> str:
        return f"{self.jax}-py{self.python}"

    @property
    def constraints(self) -> str:
        return str(ROOT / "constraints" / f"jax-{self.jax}.txt")

    @property
    def interpreter(self) -> str | None:
        return find_python(self.python)

    def missing(self) -> str:
        where = f"python{self.python} is not on PATH"
        if shutil.which("pyenv"):
            where += f" and pyenv has no {self.python}.x"
        return (
            f"NOT RUN: jax {self.jax} needs Python {self.python}, not found here ({where}). "
            f"Install it (`pyenv install {self.python}`, `uv python install {self.python}` or "
            f"the system's python{self.python} package); `nox -s lines` shows what each line uses"
        )


LINES = tuple(Line(jax, py) for jax, pythons in JAX_LINES.items() for py in pythons)
NEWEST_JAX = LINES[-1].jax
# What `nox -s tests` (and demo, aot, typecheck, bench) runs: the newest jax on the newest Python
# this machine has for it.
DEFAULT = next((line for line in reversed(LINES) if line.interpreter), None)


def _python_of(line: Line | None) -> str | bool:
    """The interpreter nox builds a line's environment from; False (no environment) when the
    Python is missing, so that the session runs only to say it did not run."""
    return (line.interpreter if line else None) or False


def _start(session: nox.Session, line: Line | None, *, newest: bool) -> Line:
    if line is None:
        session.skip(
            "NOT RUN: no Python for any jax line here ("
            + ", ".join(f"jax {ln.jax} needs {ln.python}" for ln in LINES)
            + "); `nox -s lines` shows what was looked for"
        )
    if line.interpreter is None:
        session.skip(line.missing())
    which = ", the newest line with a Python here" if newest else ""
    session.log(f"jax {line.jax} on Python {line.python}{which}: {line.interpreter}")
    return line


def _report_jax(session: nox.Session, line: Line) -> None:
    """Log the jax the environment holds, and fail if the pin did not take."""
    probe = (
        "import sys, jax, jaxlib; print('versions:', jax.__version__, jaxlib.__version__, "
        "'%d.%d.%d' % sys.version_info[:3])"
    )
    out = str(session.run("python", "-c", probe, silent=True) or "")
    found = next((ln.split()[1:] for ln in out.splitlines() if ln.startswith("versions: ")), [])
    jax, jaxlib, python = (*found, "?", "?", "?")[:3]
    session.log(f"running with jax {jax}, jaxlib {jaxlib}, Python {python}")
    if jax != line.jax:
        session.error(f"expected jax {line.jax} from {line.constraints}, got {jax}")


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
    session: nox.Session,
    line: Line,
    pkg: str,
    *,
    with_tests: bool,
    extra: tuple[str, ...] = (),
) -> None:
    paths = [str(ROOT / "packages" / p) for p in _local_requirements(pkg, with_tests=with_tests)]
    args = ["-c", line.constraints, *paths, *extra]
    if with_tests:
        args += ["--group", f"{ROOT / 'packages' / pkg / 'pyproject.toml'}:test"]
    session.install(*args)


def _install_all_backends(session: nox.Session, line: Line) -> None:
    for pkg in ("tensorcore", "sparsecore", "collectives", "testing"):
        _install(session, line, pkg, with_tests=False)


# Session bodies: each takes the line it runs on. Sessions are registered below, once for the
# newest line here and once per line.


def _tests(session: nox.Session, line: Line, package: str) -> None:
    _install(session, line, package, with_tests=True)
    _report_jax(session, line)
    session.chdir(ROOT / "packages" / package)
    session.run("pytest", "tests", *session.posargs, env=LIBTPU_ENV)


def _demo(session: nox.Session, line: Line) -> None:
    _install_all_backends(session, line)
    _report_jax(session, line)
    session.run("coremesh", "demo", *session.posargs, env=LIBTPU_ENV)


def _aot(session: nox.Session, line: Line) -> None:
    _install_all_backends(session, line)
    _report_jax(session, line)
    session.run("coremesh", "aot-all", *session.posargs, env=LIBTPU_ENV)


def _bench(session: nox.Session, line: Line) -> None:
    _install_all_backends(session, line)
    session.install("-c", line.constraints, "matplotlib>=3.8")
    _report_jax(session, line)
    # Every line writes to bench-results/; the benchmarks name their files after the jax and
    # libtpu they ran on, so the lines' results sit side by side.
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    if not scripts:
        session.error("no benchmarks found under benchmarks/")
    for script in scripts:
        session.run("python", str(script), "--out", str(out), *session.posargs, env=LIBTPU_ENV)
    session.log(f"results in {out}")


def _corpus() -> Path:
    """Where JAX's test trees are: ``$COREMESH_UPSTREAM_TESTS``, else beside the repository."""
    return Path(os.environ.get("COREMESH_UPSTREAM_TESTS") or ROOT.parent / "shared" / "upstream")


def _upstream(session: nox.Session, line: Line) -> None:
    testing = ROOT / "packages" / "testing"
    _install(session, line, "testing", with_tests=True, extra=(f"{testing}[upstream]",))
    _report_jax(session, line)
    # JAX's test trees live beside the repository; the command runs the one nearest this line's
    # jax. Every line writes to upstream-results/, its tables named after its jax.
    corpus = str(_corpus())
    out = ROOT / "upstream-results"
    # One test file per CPU at a time (-- --jobs N overrides).
    jobs = str(os.cpu_count() or 1)
    session.run(
        "coremesh", "upstream", "--jax-tests", corpus, "--out", str(out), "--jobs", jobs,
        *session.posargs, env=LIBTPU_ENV,
    )  # fmt: skip
    # The tree's TPU guides, every code cell at its full size: guides-jax-<version>.{md,json}
    # beside the tests' tables (-- --files ... narrows the tests; the guides always run whole).
    session.run(
        "coremesh", "upstream", "--jax-tests", corpus, "--guides", "--out", str(out),
        env=LIBTPU_ENV,
    )  # fmt: skip
    session.log(f"results in {out}")


def _upstream_subset(session: nox.Session, line: Line) -> None:
    corpus = _corpus()
    if not corpus.is_dir():
        session.error(
            f"no JAX test corpus at {corpus}: point COREMESH_UPSTREAM_TESTS at a folder of JAX "
            "test trees (such as ../shared/upstream)"
        )
    testing = ROOT / "packages" / "testing"
    _install(session, line, "testing", with_tests=True, extra=(f"{testing}[upstream]",))
    _report_jax(session, line)
    # The fixed subset of the tree nearest this line (tests/upstream/ci-subset/<tree>.txt):
    # every listed test must pass on the simulator. The watchdog is for hangs only (the
    # simulator's deadlocks raise): CI runs two jobs on 2 CPUs, and gmm's sharded tests, 72 s
    # alone on jax 0.10.2, went past 120 s there beside a package's test suite (2026-12-06).
    session.run(
        "coremesh", "upstream", "--jax-tests", str(corpus), "--mode", "sim", "--timeout", "300",
        "--subset", str(testing / "tests" / "upstream" / "ci-subset"),
        "--out", str(ROOT / "upstream-results" / f"subset-{line.name}"), *session.posargs,
        env=LIBTPU_ENV,
    )  # fmt: skip


def _typecheck(session: nox.Session, line: Line) -> None:
    paths = [str(ROOT / "packages" / p) for p in PACKAGES]
    session.install("-c", line.constraints, *paths, "mypy>=1.15", "pytest>=8", "nox>=2025.2.9")
    _report_jax(session, line)
    srcs = [str(ROOT / "packages" / p / d) for p in PACKAGES for d in ("src", "tests")]
    # examples/ stays as close to the core_map guide's text as it can, so it is linted, not typed.
    extra = [str(ROOT / d) for d in ("benchmarks", "tests", "noxfile.py")]
    # pyproject's python_version is the oldest supported Python; each line is checked as the
    # Python it runs on, with a cache of its own (lines on one Python hold different jax).
    cache = os.path.join(session.virtualenv.location, "mypy-cache")
    version = ["--python-version", line.python, "--cache-dir", cache]
    session.run("mypy", *version, *srcs, *extra, *session.posargs)


TESTS_DOC = "One package's tests on the CPU simulator and compile-only targets"
DEMO_DOC = (
    "The main job: run the core_map guide's programs on the simulator, compile them for every "
    "TPU generation and show what ran where"
)
AOT_DOC = "Compile every kernel the project ships for every chip; fail on any regression"
BENCH_DOC = (
    "Benchmarks: simulator speed, compile matrix, static cycles against the roofline; tables "
    "(markdown + JSON) and charts (PNG) in bench-results/"
)
TYPECHECK_DOC = "mypy --strict over every package's sources and tests"
UPSTREAM_DOC = (
    "JAX's own Pallas TPU tests (the test tree nearest the line) on the simulator and in stock "
    "interpret mode, then the TPU guides' code cells; per-file and per-cell tables in "
    "upstream-results/ (-- --files NAME ... --mode sim)"
)
UPSTREAM_SUBSET_DOC = (
    "The fixed subset of JAX's tests CI runs (tests/upstream/ci-subset/): each must pass on the "
    "simulator"
)


def _doc(kind: str, text: str, line: Line | None, *, newest: bool) -> str:
    """The session's line in `nox -l`."""
    if line is None:
        return f"{text} (NOT RUN here: no Python for any jax line)"
    if newest:
        return f"{text}; here on the newest line, jax {line.jax} on Python {line.python}"
    where = f"as `{kind}`, on jax {line.jax} and Python {line.python}"
    return where if line.interpreter else f"{where} (NOT RUN here: no Python {line.python})"


def _register_tests(name: str, line: Line | None, *, newest: bool, tags: list[str]) -> None:
    def session_fn(session: nox.Session, package: str) -> None:
        _tests(session, _start(session, line, newest=newest), package)

    session_fn.__doc__ = _doc("tests", TESTS_DOC, line, newest=newest)
    parametrized = nox.parametrize("package", PACKAGES)(session_fn)
    nox.session(name=name, python=_python_of(line), tags=tags)(parametrized)


def _register(
    kind: str,
    name: str,
    body: Callable[[nox.Session, Line], None],
    doc: str,
    line: Line | None,
    *,
    newest: bool,
    tags: list[str],
) -> None:
    def session_fn(session: nox.Session) -> None:
        body(session, _start(session, line, newest=newest))

    session_fn.__doc__ = _doc(kind, doc, line, newest=newest)
    nox.session(name=name, python=_python_of(line), tags=tags)(session_fn)


def _register_all() -> None:
    kinds: list[tuple[str, Callable[[nox.Session, Line], None], str]] = [
        ("demo", _demo, DEMO_DOC),
        ("aot", _aot, AOT_DOC),
        ("typecheck", _typecheck, TYPECHECK_DOC),
        ("bench", _bench, BENCH_DOC),
        ("upstream", _upstream, UPSTREAM_DOC),
        ("upstream_subset", _upstream_subset, UPSTREAM_SUBSET_DOC),
    ]
    _register_tests("tests", DEFAULT, newest=True, tags=[])
    for kind, body, doc in kinds:
        _register(kind, kind, body, doc, DEFAULT, newest=True, tags=[])
    for line in LINES:
        tags = [f"jax-{line.jax}", f"py{line.python}"]
        _register_tests(f"tests-{line.name}", line, newest=False, tags=[*tags, "tests-all-lines"])
        for kind, body, doc in kinds:
            name = f"{kind}-{line.name}"
            _register(kind, name, body, doc, line, newest=False, tags=[*tags, f"{kind}-all-lines"])


_register_all()


@nox.session(python=False)
def lines(session: nox.Session) -> None:
    """The jax lines and the Python each one uses here (`-- --require-all`: fail on a missing one).

    Also says which line the plain sessions (tests, demo, ...) run."""
    for line in LINES:
        where = line.interpreter or line.missing()
        session.log(f"jax {line.jax:<9} Python {line.python:<5} {where}")
    if DEFAULT is not None:
        session.log(
            f"`nox -s tests` (demo, aot, typecheck, bench) runs jax {DEFAULT.jax} on Python "
            f"{DEFAULT.python}; one line: `nox -s tests-{DEFAULT.name}`; every line: "
            "`nox -t tests-all-lines`"
        )
    missing = [line.name for line in LINES if line.interpreter is None]
    if missing and "--require-all" in session.posargs:
        session.error(f"lines without a Python here: {', '.join(missing)}")


@nox.session(python=_python_of(DEFAULT))
def readme(session: nox.Session) -> None:
    """README.md's install commands, quick tour and `coremesh check` run as written, each in a
    fresh environment made from a copy of the packages (tests/test_readme.py)."""
    line = _start(session, DEFAULT, newest=True)
    # pytest's configuration names coremesh's warning class, so coremesh-core is importable here.
    session.install("-c", line.constraints, str(ROOT / "packages" / "core"), "pytest>=8")
    session.install("pytest-timeout>=2.3")
    session.run("pytest", str(ROOT / "tests"), "-p", "no:cacheprovider", *session.posargs)


@nox.session(python=_python_of(DEFAULT))
def tpu_tests(session: nox.Session) -> None:
    """The same suites on real TPU hardware (newest line here); passes, saying so, without one."""
    line = _start(session, DEFAULT, newest=True)
    _install(
        session,
        line,
        "collectives",
        with_tests=True,
        extra=(str(ROOT / "packages" / "sparsecore"),),
    )
    _report_jax(session, line)
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
    session.log(f"Running on {count} x {kind}: the test fixtures hand out the local TPU")
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


@nox.session(python=PYTHON, venv_backend="uv|virtualenv")
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff>=0.11")
    session.run("ruff", "check", ".", *session.posargs)
    session.run("ruff", "format", "--check", ".")


def _probe_venv(session: nox.Session, name: str, python: str) -> str:
    """A fresh environment outside nox's, for install checks; returns its python."""
    venv = os.path.join(session.create_tmp(), name)
    session.run("uv", "venv", "--quiet", "--clear", "--python", python, venv)
    return os.path.join(venv, "bin", "python")


def _install_wheel(session: nox.Session, py: str, dist: Path, *pins: str) -> None:
    """Install coremesh-tensorcore from the wheels in ``dist`` into the environment of ``py``."""
    install = ["uv", "pip", "install", "--quiet", "--python", py, *pins]
    session.run(*install, "--find-links", str(dist), "coremesh-tensorcore")


def _installed(session: nox.Session, py: str) -> str:
    return str(session.run("uv", "pip", "list", "--python", py, silent=True) or "")


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """One wheel and sdist per package in dist/; a backend installs alone and keeps a user's jax.

    coremesh-tensorcore from dist/ must pull only coremesh-core and jax (pinned), and must keep
    the newest tested jax when it is installed first (not pinned)."""
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

    # Installing the TensorCore backend alone must pull coremesh-core and jax, nothing else of
    # ours. On nox's own Python, pinned by the newest line that runs on it.
    own = next((ln for ln in reversed(LINES) if ln.python == PYTHON), DEFAULT or LINES[-1])
    py = _probe_venv(session, "alone", sys.executable)
    _install_wheel(session, py, dist, "-c", own.constraints)
    listing = _installed(session, py)
    ours = sorted(line.split()[0] for line in listing.splitlines() if line.startswith("coremesh"))
    session.log(f"installed with coremesh-tensorcore: {ours}")
    if ours != ["coremesh-core", "coremesh-tensorcore"]:
        session.error(f"coremesh-tensorcore pulled {ours}")
    if "libtpu" in listing:
        session.error("coremesh-tensorcore pulled libtpu; only coremesh-testing may")
    session.run(
        py, "-c", "import coremesh.tensorcore, coremesh.core; print('import ok')", external=True
    )

    # A user who already has the newest jax keeps it: the wheel, installed without our pins,
    # must not move jax to another release.
    newest = [ln for ln in LINES if ln.jax == NEWEST_JAX]
    line = next((ln for ln in newest if ln.interpreter), None)
    if line is None or line.interpreter is None:
        pythons = " or ".join(ln.python for ln in newest)
        session.warn(
            f"NOT RUN: the check that coremesh-tensorcore keeps an installed jax {NEWEST_JAX} "
            f"needs Python {pythons}, and there is none here. "
            + (newest[0].missing().removeprefix("NOT RUN: ") if newest else "")
        )
        return
    py = _probe_venv(session, "keeps-jax", line.interpreter)
    pins = (f"jax=={NEWEST_JAX}", f"jaxlib=={NEWEST_JAX}")
    session.run("uv", "pip", "install", "--quiet", "--python", py, *pins)
    _install_wheel(session, py, dist)
    probe = "import jax, coremesh.tensorcore; print(jax.__version__)"
    out = str(session.run(py, "-c", probe, silent=True, external=True) or "").strip()
    found = out.splitlines()[-1] if out else "?"
    session.log(f"jax {NEWEST_JAX} installed first (Python {line.python}), then the wheel: {found}")
    if found != NEWEST_JAX:
        session.error(f"installing coremesh-tensorcore moved jax {NEWEST_JAX} to {found}")
