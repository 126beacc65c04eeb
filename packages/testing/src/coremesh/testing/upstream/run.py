"""Run a JAX test tree's files: one child pytest per file and mode, a watchdog per test.

Each child loads the shims (:mod:`~coremesh.testing.upstream.shims`) and pytest-timeout with its
thread method: a test that runs past ``timeout`` seconds has its stacks dumped and its process
ended, so a hang is reported as a hang and not as a failure of whatever ran next. The runner
then starts the file again without the tests already done, until every test has an outcome. A
second watchdog here ends a child that writes nothing for ``timeout`` plus a grace period (a
hang in collection, or one pytest-timeout cannot see).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fnmatch
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from coremesh.core.errors import CoremeshError
from coremesh.testing.upstream.events import Status, TestResult, first_line, read_events
from coremesh.testing.upstream.file_run import FileRun, Mode
from coremesh.testing.upstream.last_run import FileKey
from coremesh.testing.upstream.live import Live
from coremesh.testing.upstream.memory_budget import MemoryBudget
from coremesh.testing.upstream.needs import most_devices
from coremesh.testing.upstream.parts import WHOLE, Part, Timed, joined, plan
from coremesh.testing.upstream.tree import TestTree
from coremesh.testing.upstream.typical import SLOW_TEST_SECONDS, watchdog_seconds

#: Test files a run takes when not told which.
DEFAULT_GLOB = "tpu_*_test.py"
#: Host CPU devices of a simulator child (as the coremesh pytest plugin arranges).
SIM_HOST_DEVICES = 16
#: XLA:CPU's optimization level for a child, unless its XLA_FLAGS name one. Most of a test's
#: time on the simulator is XLA compiling the call's program and its cores'; level 1 keeps
#: float semantics (no fast math at any level) and made JAX's tests faster than the default
#: (2026-12-04, jax 0.12.0.1, 2 CPUs): 551 roll tests of tpu_pallas_test 200 s to 180 s, three
#: paged-attention tests 23.6 s to 19.4 s, three splash-attention tests 67 s to 54 s. Level 0
#: made paged attention 21% slower.
XLA_CPU_LEVEL = "--xla_backend_optimization_level=1"
#: Seconds a child may write nothing beyond the per-test timeout before it is stopped.
STALL_GRACE_S = 120.0
#: Seconds between two readings of a running child's events for the heartbeat (:mod:`~.live`).
LIVE_READ_S = 5.0

_TIMEOUT_BANNER = re.compile(r"\+{3,} Timeout \+{3,}")
_DEVICE_FLAG = re.compile(r"--xla_force_host_platform_device_count=\d+")


def select_files(tree: TestTree, patterns: Sequence[str] = ()) -> list[Path]:
    """The tree's test files matching any of ``patterns`` (names or globs, ``.py`` optional)."""
    files = sorted(tree.tests.glob(DEFAULT_GLOB))
    if not patterns:
        return files
    wanted = [p if p.endswith(".py") or "*" in p else f"{p}.py" for p in patterns]
    return [f for f in files if any(fnmatch.fnmatchcase(f.name, p) for p in wanted)]


def quiet_environment() -> dict[str, str]:
    """A child's environment: libtpu quiet, CPU only, no host device count of this process's
    (the child, or the ``simulate()`` in it, sets its own)."""
    from coremesh.testing import libtpu_env

    env = libtpu_env.child_environment()
    flags = _DEVICE_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
    if "--xla_backend_optimization_level=" not in flags:
        flags = f"{flags} {XLA_CPU_LEVEL}".strip()
    env["XLA_FLAGS"] = flags
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return bytecode_cache(env)


def bytecode_cache(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Python's bytecode kept outside the sources (``PYTHONPYCACHEPREFIX``: the
    user's, else ``~/.cache/coremesh/pycache``), never beside the test tree, which may be shared
    or read-only, and never turned off: with ``PYTHONDONTWRITEBYTECODE`` every child compiled
    jax from source again, about 3 s of each start on 2 CPUs."""
    if not env.get("PYTHONPYCACHEPREFIX"):
        cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        env["PYTHONPYCACHEPREFIX"] = str(cache / "coremesh" / "pycache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def child_environment(mode: Mode, file_name: str) -> dict[str, str]:
    """A test file's child: :func:`quiet_environment` with its host device count fixed before
    jax starts (the simulator's 16, or as many as the file's tests need in stock mode)."""
    env = quiet_environment()
    count = SIM_HOST_DEVICES if mode == "sim" else most_devices(file_name)
    env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} --xla_force_host_platform_device_count={count}".strip()
    return env


def child_command(
    tree: TestTree,
    file: Path,
    mode: Mode,
    *,
    timeout: float,
    events: Path,
    done: Path,
    ini: Path,
    keyword: str | None = None,
    only: Sequence[str] = (),
    only_file: Path | None = None,
    budgets_file: Path | None = None,
    recycle_bytes: int | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The child's pytest command line; ``only``: node ids of ``file`` to run (default all);
    ``only_file``: a file of node ids to run, those the file no longer has ignored;
    ``budgets_file``: lines of node id and seconds, tests whose watchdog is not ``timeout``;
    ``recycle_bytes``: the child stops after a test when it holds more (the runner goes on in
    a new one)."""
    targets = [f"{file}::{nodeid.split('::', 1)[1]}" for nodeid in only] or [str(file)]
    cmd = [python, "-m", "pytest", *targets, "-c", str(ini), "--rootdir", str(tree.tests)]
    cmd += ["-p", "coremesh.testing.upstream.shims", "-p", "no:cacheprovider", "-q"]
    cmd += [f"--timeout={timeout:g}", "--timeout-method=thread"]
    cmd += ["--upstream-mode", mode, "--upstream-tree", str(tree.root)]
    cmd += ["--upstream-events", str(events), "--upstream-done", str(done)]
    if only_file is not None:
        cmd += ["--upstream-only", str(only_file)]
    if budgets_file is not None:
        cmd += ["--upstream-budgets", str(budgets_file)]
    if recycle_bytes is not None:
        cmd += ["--upstream-recycle-bytes", str(recycle_bytes)]
    if mode == "stock":
        cmd += ["-p", "no:coremesh"]  # stock jax: no simulator, no host-device arrangement
    if keyword:
        cmd += ["-k", keyword]
    return cmd


def host_memory() -> int | None:
    """Bytes of RAM this host has (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


Stop = Literal["stall", "memory"]


def _wait(
    proc: subprocess.Popen[bytes],
    events: Path,
    stall_s: float,
    memory: MemoryBudget | None,
    heard: Callable[[], None] | None = None,
) -> Stop | None:
    """Wait for ``proc``; stop it when ``events`` has not grown for ``stall_s``, or when
    ``memory`` says it holds too much (a test that would take the host's memory and have the OS
    kill more than it). ``heard`` is called when ``events`` has grown, at most every
    :data:`LIVE_READ_S` (it reads the whole file: ``tpu_pallas_test``'s grows to 1 MB)."""
    last_size, last_change = -1, time.monotonic()
    heard_size, heard_at = 0, float("-inf")
    with memory.watching(proc.pid) if memory is not None else contextlib.nullcontext():
        while proc.poll() is None:
            size = events.stat().st_size if events.exists() else 0
            now = time.monotonic()
            stop: Stop | None = None
            if heard is not None and size != heard_size and now - heard_at >= LIVE_READ_S:
                heard_size, heard_at = size, now
                heard()
            if size != last_size:
                last_size, last_change = size, now
            elif now - last_change > stall_s:
                stop = "stall"
            if memory is not None and memory.over(proc.pid):
                stop = "memory"
            if stop is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return stop
            time.sleep(0.5)
    return None


def run_file(
    tree: TestTree,
    file: Path,
    mode: Mode,
    out_dir: Path,
    *,
    timeout: float = 180.0,
    keyword: str | None = None,
    only: Sequence[str] = (),
    python: str = sys.executable,
    memory: MemoryBudget | None = None,
    give_up: int | None = None,
    part: Part = WHOLE,
    slow: Mapping[str, float] = SLOW_TEST_SECONDS,
    live: Live | None = None,
) -> FileRun:
    """Every test of ``file`` in ``mode`` (of ``part`` of it), restarting the child after a hang,
    a crash or ``memory`` stopping it, and after it stopped between tests holding more than
    ``memory.recycle_bytes`` (the memory jax keeps for the tests it ran); after ``give_up`` hangs
    in a row, the rest is left unrun (stock interpret mode deadlocks on whole files: 859 tests
    of 180 s would take 43 hours). A test ``slow`` names (node id -> seconds it was measured to
    take) has a watchdog of twice that where ``timeout`` is less. ``live`` hears how many of the
    part's tests have finished while it runs."""
    work = Path(out_dir) / "work" / mode
    logs = Path(out_dir) / "logs" / mode
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    ini = Path(out_dir) / "work" / "pytest.ini"
    ini.write_text("[pytest]\n")
    stem = file.stem + part.suffix
    only_file = None
    if part.only is not None:
        only_file = work / f"{stem}.only"
        only_file.write_text("\n".join(sorted(part.only)) + "\n")
    log_path, events, done_path = (
        logs / f"{stem}.log",
        work / f"{stem}.events",
        work / f"{stem}.done",
    )
    log_path.write_text("")
    run = FileRun(file.name, mode)
    done: list[str] = sorted(part.others)
    started = time.perf_counter()
    env = child_environment(mode, file.name)
    budgets = watchdog_seconds(file.name, timeout, slow)
    budgets_file = None
    if budgets:
        budgets_file = work / f"{stem}.budgets"
        budgets_file.write_text("".join(f"{n} {s:g}\n" for n, s in sorted(budgets.items())))
    stall_s = max([timeout, *budgets.values()]) + STALL_GRACE_S

    def heard() -> None:
        if live is not None:
            now = read_events(events)
            total = None if now.collected is None else len(run.results) + len(now.collected)
            live.update(stem, len(run.results) + len(now.results), total)

    while True:
        if live is not None:  # a new child: what the earlier ones finished, the total kept
            live.update(stem, len(run.results), None)
        done_path.write_text("\n".join(done) + "\n")
        events.unlink(missing_ok=True)
        cmd = child_command(
            tree, file, mode, timeout=timeout, events=events, done=done_path, ini=ini,
            keyword=keyword, only=only, only_file=only_file, budgets_file=budgets_file,
            recycle_bytes=None if memory is None else memory.recycle_bytes, python=python,
        )  # fmt: skip
        offset = log_path.stat().st_size
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            stopped = _wait(proc, events, stall_s, memory, heard if live is not None else None)
        run.processes += 1
        got = read_events(events)
        run.results += got.results
        done += [r.nodeid for r in got.results]
        if got.unfinished is None:
            if got.results and got.collected is not None and not set(got.collected) <= set(done):
                continue  # the child stopped between tests, holding too much memory
            if not run.results and got.not_run is not None:
                run.not_run = got.not_run
            elif got.collected is None and not run.results:
                tail = _log_text(log_path, offset)
                why = "stopped: no output" if stopped else f"exit code {proc.returncode}"
                run.not_run = f"pytest ended before collecting ({why}): {last_line(tail)}"
            break
        text = _log_text(log_path, offset)
        if stopped == "memory":
            assert memory is not None  # _wait stops for memory only under a budget
            status: Status = "error"
            message = memory.message()
        elif stopped:
            status = "hang"
            message = f"no progress in {stall_s:g} s; the runner stopped it"
        elif _TIMEOUT_BANNER.search(text):
            budget = budgets.get(got.unfinished, timeout)
            status, message = "hang", f"no result within {budget:g} s (pytest-timeout)"
        else:
            status = "error"
            message = f"the test process ended (exit code {proc.returncode}): {last_line(text)}"
        run.results.append(TestResult(got.unfinished, status, message))
        done.append(got.unfinished)
        if got.collected is not None and set(got.collected) <= set(done):
            break  # the test that ended the process was the last one
        streak = 0
        for r in reversed(run.results):
            if r.status != "hang":
                break
            streak += 1
        if give_up is not None and streak >= give_up and got.collected is not None:
            run.unrun = len(set(got.collected) - set(done))
            run.gave_up = f"the runner gave up on the file after {streak} hangs in a row"
            break
    run.elapsed_s = time.perf_counter() - started
    if live is not None:
        live.ended(stem)
    return run


def _log_text(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace")


def last_line(text: str) -> str:
    """The last non-blank line of a child's output, as a one-line message."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return first_line(lines[-1]) if lines else "no output"


def run_tree(
    tree: TestTree,
    files: Sequence[Path],
    modes: Sequence[Mode],
    out_dir: Path,
    *,
    timeout: float = 180.0,
    keyword: str | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
    progress: Callable[[FileRun], None] | None = None,
    python: str = sys.executable,
    jobs: int = 1,
    memory_limit: int | None = None,
    give_up: int | None = None,
    previous_seconds: Mapping[FileKey, float] | None = None,
    previous_tests: Timed | None = None,
    slow: Mapping[str, float] = SLOW_TEST_SECONDS,
    live: Live | None = None,
) -> list[FileRun]:
    """Each file in each mode, ``jobs`` processes at a time; the result in file, then mode,
    order; ``progress`` hears of each as it finishes. ``only``: per file name, the node ids
    to run (a subset); files it does not name run whole. ``give_up`` applies to stock runs.
    ``previous_seconds``: how long each (file name, mode) took last time; with several jobs the
    longest start first (files not timed before first of all), so a long file does not start
    last and run alone. ``previous_tests``: each test's seconds last time; with several jobs a
    file longer than its share is split across processes (:mod:`~.parts`). Both come from
    :func:`~coremesh.testing.upstream.last_run.read_last_run`. ``slow``: tests measured to take
    longer than ``timeout`` (:data:`~.typical.SLOW_TEST_SECONDS`), which get their own watchdog.
    ``memory_limit``: bytes the test processes may hold together (:mod:`~.memory_budget`).
    ``live``: how far each running file has got, and how many files are done."""
    if not files:
        raise CoremeshError(
            f"no test files selected in {tree.tests}",
            fix=f"check --files against the names there (default {DEFAULT_GLOB})",
        )
    if jobs < 1:
        raise CoremeshError(f"--jobs {jobs}", rule="at least one run at a time", fix="--jobs 1")
    pairs = [(file, mode) for file in files for mode in modes]
    last = previous_seconds or {}
    keys = {pair: (pair[0].name, str(pair[1])) for pair in pairs}
    split: dict[FileKey, list[Part]] = (
        plan(list(keys.values()), last, previous_tests, jobs)
        if jobs > 1 and previous_tests and not only and not keyword
        else {}
    )
    units = [(pair, part) for pair in pairs for part in split.get(keys[pair], [WHOLE])]
    if jobs > 1:
        units = start_order(units, last)
    memory = None if memory_limit is None else MemoryBudget(memory_limit, jobs)
    lock = threading.Lock()
    pieces: dict[tuple[Path, Mode], list[FileRun]] = {pair: [] for pair in pairs}
    runs: dict[tuple[Path, Mode], FileRun] = {}

    def one(unit: tuple[tuple[Path, Mode], Part]) -> None:
        (file, mode), part = unit
        run = run_file(
            tree,
            file,
            mode,
            out_dir,
            timeout=timeout,
            keyword=keyword,
            only=(only or {}).get(file.name, ()),
            python=python,
            memory=memory,
            # A simulator run's hang is a slow test (its deadlocks raise): it never gives up.
            give_up=give_up if mode == "stock" else None,
            part=part,
            slow=slow,
            live=live,
        )
        with lock:
            got = pieces[(file, mode)]
            got.append(run)
            if len(got) < part.count:
                return
            order = [t for t, _ in (previous_tests or {}).get(keys[(file, mode)], ())]
            whole = runs[(file, mode)] = joined(got, order)
            if live is not None:
                live.file_done()
            if progress is not None:
                progress(whole)

    if jobs == 1:
        for unit in units:
            one(unit)
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, units))
    return [runs[pair] for pair in pairs]


def start_order(
    units: Sequence[tuple[tuple[Path, Mode], Part]], last: Mapping[FileKey, float]
) -> list[tuple[tuple[Path, Mode], Part]]:
    """``units`` (a file in a mode, and a part of it) longest first: a part of a split file by
    its own seconds, a whole file by ``last`` (seconds per file name and mode), those it does not
    time before all of them; ties keep their order."""

    def took(unit: tuple[tuple[Path, Mode], Part]) -> float:
        (file, mode), part = unit
        return part.seconds if part.count > 1 else last.get((file.name, mode), float("inf"))

    return sorted(units, key=lambda u: -took(u))
