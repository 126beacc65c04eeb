"""``coremesh upstream``: run a JAX test tree on the simulator and/or stock interpret mode."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from coremesh.core import jax_versions
from coremesh.testing.upstream import guide_report, guides, report
from coremesh.testing.upstream.file_run import FileRun, Mode
from coremesh.testing.upstream.guide_run import GuideRun, run_guide
from coremesh.testing.upstream.last_run import read_last_run
from coremesh.testing.upstream.live import Live, heartbeat
from coremesh.testing.upstream.run import DEFAULT_GLOB, host_memory, run_tree, select_files
from coremesh.testing.upstream.subset import Subset, read_subset, subset_file
from coremesh.testing.upstream.tree import CORPUS_ENV, TestTree, resolve
from coremesh.testing.upstream.typical import typical_seconds

MODE_CHOICES = ("sim", "stock", "both")
#: Default seconds before a test, or a guide cell, is a hang.
TEST_TIMEOUT_S = 180.0
GUIDE_TIMEOUT_S = 1800.0


def add_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--jax-tests",
        metavar="PATH",
        required=True,
        help="a JAX test tree (holding tests/pallas), or a folder of trees: the one nearest the "
        f"installed jax is used (e.g. ../shared/upstream; {CORPUS_ENV} in the tests)",
    )
    sp.add_argument(
        "--files",
        nargs="+",
        metavar="GLOB",
        default=[],
        help=f"test files by name or glob (default: every {DEFAULT_GLOB})",
    )
    sp.add_argument("--mode", choices=MODE_CHOICES, default="both", help="default: both")
    sp.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per test before it is a hang ({TEST_TIMEOUT_S:g}); per guide cell "
        f"with --guides ({GUIDE_TIMEOUT_S:g})",
    )
    sp.add_argument(
        "--out", metavar="DIR", default="upstream-results", help="where tables and logs go"
    )
    sp.add_argument("-k", dest="keyword", metavar="EXPR", default=None, help="pytest's -k")
    sp.add_argument(
        "--subset",
        metavar="PATH",
        default=None,
        help="run only the node ids listed in PATH (or in PATH/<tree folder>.txt) and exit 1 "
        "unless every one passes on the simulator (what CI runs)",
    )
    sp.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="test files (each in its own pytest, per mode) run N at a time (default 1; "
        "each uses about one CPU); a file that took longer last time than the run's seconds "
        "over N is split across up to N processes by its tests' last seconds",
    )
    sp.add_argument(
        "--memory-limit",
        type=float,
        default=None,
        metavar="GIB",
        help="when the test processes together hold more than GIB of memory, the largest is "
        "stopped, its test an error (default: 3/4 of the host's memory)",
    )
    sp.add_argument(
        "--give-up",
        type=int,
        default=3,
        metavar="N",
        help="in stock mode, after N hangs in a row, leave the rest of the file unrun and say so "
        "(default 3; 0: never); a simulator run never gives up (its deadlocks raise: a hang there "
        "is a slow test)",
    )
    sp.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr (a line per file as it ends, and a line a minute naming "
        "the files running and how far each has got)",
    )
    sp.add_argument(
        "--guides",
        nargs="*",
        metavar="NAME",
        default=None,
        help=f"run the tree's TPU guides instead of its tests: every code cell on the simulator "
        f"(names: {', '.join(guides.NAMES)}; none given: all)",
    )
    sp.add_argument(
        "--first", type=int, default=None, metavar="N", help="with --guides: only the first N cells"
    )
    sp.add_argument(
        "--as-written",
        action="store_true",
        help="with --guides: without the declared device-gate and jax-spelling changes",
    )


def _progress(stream: TextIO) -> Callable[[FileRun], None]:
    def show(run: FileRun) -> None:
        stream.write(
            f"{run.file.removesuffix('.py'):<44} {run.mode:<5} {run.summary()} "
            f"({run.elapsed_s:.1f} s)\n"
        )
        stream.flush()

    return show


def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """Run, write ``upstream-jax-<version>.{md,json}`` under ``--out``, print the table."""
    version = jax_versions.installed()
    tree = resolve(Path(args.jax_tests).resolve(), version)
    if args.guides is not None:
        return _run_guides(args, tree, version, stdout, stderr)
    chosen = None
    if args.subset is not None:
        chosen = read_subset(subset_file(Path(args.subset).resolve(), tree))
        files = select_files(tree, list(chosen.by_file))
    else:
        files = select_files(tree, args.files)
    modes: list[Mode] = ["sim", "stock"] if args.mode == "both" else [args.mode]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.quiet:
        stderr.write(
            f"JAX test tree {tree.label} at {tree.root} for jax {version}: "
            f"{len(files)} files, modes {', '.join(modes)}, {args.jobs} at a time\n"
        )
    table_json = out / f"upstream-jax-{version}.json"
    # This machine's last timings, else the typical ones, order the files longest first.
    earlier = read_last_run(table_json)
    last = {**typical_seconds(files, modes), **earlier.seconds}
    started = time.perf_counter()
    done: list[FileRun] = []

    def finished(run: FileRun) -> None:
        # The tables so far, after each file: a run stopped part way keeps what it measured.
        done.append(run)
        _write_tables(out, done, tree, version, wall_s=None)
        if not args.quiet:
            _progress(stderr)(run)

    # A line a minute while files run: the longest take most of an hour before their own line.
    live = None if args.quiet else Live(len(files) * len(modes))
    with heartbeat(live, stderr) if live is not None else contextlib.nullcontext():
        runs = run_tree(
            tree,
            files,
            modes,
            out,
            timeout=TEST_TIMEOUT_S if args.timeout is None else args.timeout,
            keyword=args.keyword,
            only=chosen.by_file if chosen is not None else None,
            progress=finished,
            jobs=args.jobs,
            memory_limit=_memory_limit(args.memory_limit),
            give_up=args.give_up or None,
            previous_seconds=last,
            previous_tests=earlier.tests,
            live=live,
        )
    table = _write_tables(out, runs, tree, version, wall_s=time.perf_counter() - started)
    stdout.write(table)
    if chosen is not None:
        return _check_subset(chosen, runs, stdout)
    return 0


def _write_tables(
    out: Path, runs: Sequence[FileRun], tree: TestTree, version: str, wall_s: float | None
) -> str:
    """Write ``upstream-jax-<version>.{md,json}`` under ``out`` for ``runs`` (in file order);
    return the markdown."""
    ordered = sorted(runs, key=lambda r: (r.file, r.mode))
    table = report.markdown(ordered, tree, version, wall_s=wall_s)
    (out / f"upstream-jax-{version}.md").write_text(table)
    (out / f"upstream-jax-{version}.json").write_text(report.to_json(ordered, tree, version) + "\n")
    return table


def _memory_limit(gib: float | None) -> int | None:
    """Bytes the run's test processes may hold together: ``gib``, or 3/4 of the host's."""
    if gib is not None:
        return int(gib * 2**30)
    total = host_memory()
    return None if total is None else total * 3 // 4


def _check_subset(chosen: Subset, runs: list[FileRun], stdout: TextIO) -> int:
    """0 if every test of the subset passed on the simulator; else 1, naming the others."""
    results = [r for run in runs if run.mode == "sim" for r in run.results]
    missed = chosen.missed(results)
    total = len(chosen.nodeids)
    if not missed:
        stdout.write(f"\nsubset {chosen.path.name}: all {total} tests passed on the simulator\n")
        return 0
    stdout.write(f"\nsubset {chosen.path.name}: {len(missed)} of {total} tests did not pass:\n")
    stdout.writelines(f"  {nodeid}: {what}\n" for nodeid, what in missed)
    return 1


def _show_guide(stream: TextIO, run: GuideRun) -> None:
    for c in run.cells:
        note = f": {c.message}" if c.message else ""
        stream.write(f"{run.guide:<12} cell {c.index:<3} {c.status:<5} {c.seconds:7.1f} s{note}\n")
    stream.write(f"{run.guide:<12} {run.summary()} ({run.elapsed_s:.1f} s)\n")
    stream.flush()


def _run_guides(
    args: argparse.Namespace, tree: TestTree, version: str, stdout: TextIO, stderr: TextIO
) -> int:
    """Run the guides, write ``guides-jax-<version>.{md,json}`` under ``--out``."""
    chosen = [guides.get_guide(n) for n in args.guides] if args.guides else list(guides.GUIDES)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    timeout = GUIDE_TIMEOUT_S if args.timeout is None else args.timeout
    if not args.quiet:
        stderr.write(
            f"TPU guides of {tree.label} at {tree.root} for jax {version}: "
            f"{', '.join(g.name for g in chosen)}, {timeout:g} s per cell\n"
        )
    runs = []
    for g in chosen:
        run = run_guide(tree, g, out, timeout=timeout, first=args.first, as_written=args.as_written)
        runs.append(run)
        if not args.quiet:
            _show_guide(stderr, run)
    table = guide_report.markdown(runs, tree, version)
    (out / f"guides-jax-{version}.md").write_text(table)
    (out / f"guides-jax-{version}.json").write_text(
        guide_report.to_json(runs, tree, version) + "\n"
    )
    stdout.write(table)
    return 0
