"""Run a TPU guide's code cells on the simulator: one fresh child per guide, a watchdog per cell.

The child (:mod:`~coremesh.testing.upstream.guide_child`) runs the cells in order in one
namespace inside ``simulate(guide.chip, guide.devices)``. A cell still running ``timeout``
seconds after it started is a hang: its stacks are dumped to the log, the child is stopped, and
a new child runs the cells before it again (their results are kept from the first run) and
goes on after it, so one hang does not cost the rest of the guide. A child that dies in a cell
fails that cell the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from coremesh.core.chips import get_chip
from coremesh.core.errors import CoremeshError
from coremesh.testing.upstream.guide_cells import Cell, extract
from coremesh.testing.upstream.guide_checks import compare_output, difference_failure
from coremesh.testing.upstream.guides import Guide, apply_changes
from coremesh.testing.upstream.run import last_line, quiet_environment
from coremesh.testing.upstream.tree import TestTree

CellStatus = Literal["pass", "fail", "hang", "skip"]
CELL_STATUSES: tuple[CellStatus, ...] = ("pass", "fail", "hang", "skip")
#: Seconds between SIGUSR1 (stack dump) and SIGKILL when a cell hangs.
DUMP_GRACE_S = 3.0


@dataclasses.dataclass(frozen=True)
class CellResult:
    index: int
    line: int
    status: CellStatus
    #: The first line of what a non-pass said (or why a cell was skipped).
    message: str = ""
    seconds: float = 0.0
    #: The guide's text changes this cell ran with (see :mod:`.guides`), and what was left out.
    changes: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    #: How the printed output compares with the guide's recorded one (None: nothing recorded).
    output: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class GuideRun:
    guide: str
    chip: str
    devices: int
    path: str
    cells: list[CellResult] = dataclasses.field(default_factory=list)
    elapsed_s: float = 0.0
    processes: int = 0
    as_written: bool = False

    def counts(self) -> dict[CellStatus, int]:
        out: dict[CellStatus, int] = dict.fromkeys(CELL_STATUSES, 0)
        for c in self.cells:
            out[c.status] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        return f"{len(self.cells)} cells: " + ", ".join(f"{c[s]} {s}" for s in CELL_STATUSES)


def guide_cells(tree: TestTree, guide: Guide) -> list[Cell]:
    path = guide.path(tree)
    if not path.is_file():
        raise CoremeshError(
            f"the guide {guide.name} is not in the tree at {tree.root}",
            rule=f"a tree holds JAX's TPU guides under {path.parent.relative_to(tree.root)}/",
            fix="pass a JAX tree cut with its docs (../shared/upstream/jax-0.10.2)",
        )
    return extract(path.read_text(encoding="utf-8"))


def _read_events(path: Path) -> tuple[dict[int, dict[str, Any]], int | None]:
    """(results by cell, the cell started and not finished)."""
    results: dict[int, dict[str, Any]] = {}
    started: int | None = None
    if not path.exists():
        return results, None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # cut short by the process ending
        if e.get("event") == "start":
            started = int(e["index"])
        elif e.get("event") == "result":
            results[int(e["index"])] = e
            started = None
    return results, started


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Dump the child's stacks to its log, then end its process group."""
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGUSR1)
        proc.wait(DUMP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _watch(proc: subprocess.Popen[bytes], events: Path, timeout: float) -> int | None:
    """Wait for the child; the cell it was stopped in for running past ``timeout``, or None."""
    current: int | None = None
    since = time.monotonic()
    while proc.poll() is None:
        _, started = _read_events(events)
        if started != current:
            current, since = started, time.monotonic()
        elif current is not None and time.monotonic() - since > timeout:
            _stop(proc)
            return current
        time.sleep(0.5)
    return None


def _finish(cell: Cell, event: dict[str, Any], changes: tuple[str, ...]) -> CellResult:
    status: CellStatus = event["status"]
    message: str = event.get("message", "")
    stdout: str = event.get("stdout", "")
    if status == "pass":
        wrong = difference_failure(stdout)
        if wrong is not None:
            status, message = "fail", wrong
    output = None
    if cell.recorded is not None and not cell.dropped:
        output = compare_output(cell.recorded, stdout)
    return CellResult(
        cell.index, cell.line, status, message, float(event.get("seconds", 0.0)),
        changes, cell.dropped, output,
    )  # fmt: skip


def run_guide(
    tree: TestTree,
    guide: Guide,
    out_dir: Path,
    *,
    timeout: float = 1800.0,
    first: int | None = None,
    as_written: bool = False,
    python: str = sys.executable,
) -> GuideRun:
    """Every cell of ``guide`` (or its ``first`` cells) on the simulator, in order."""
    cells = guide_cells(tree, guide)[:first]
    kind = get_chip(guide.chip).device_kind
    planned: dict[int, tuple[Cell, str, tuple[str, ...]]] = {}
    for c in cells:
        source, changes = (c.source, ()) if as_written else apply_changes(c.source, guide, kind)
        planned[c.index] = (c, source, changes)
    work, logs = Path(out_dir) / "work" / "guides", Path(out_dir) / "logs" / "guides"
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    log_path, events, plan_path = (
        logs / f"{guide.name}.log", work / f"{guide.name}.events", work / f"{guide.name}.plan.json",
    )  # fmt: skip
    log_path.write_text("")
    run = GuideRun(
        guide.name, guide.chip, guide.devices, str(guide.path(tree)), as_written=as_written
    )
    done: dict[int, CellResult] = {
        c.index: CellResult(c.index, c.line, "skip", c.skip, dropped=c.dropped)
        for c in cells
        if c.skip is not None
    }
    lost: set[int] = set()  # cells that hung or took their child down: not run again
    started = time.perf_counter()
    env = quiet_environment()
    while True:
        todo = [c for c in cells if c.index not in done]
        if not todo:
            break
        # A restart runs again every earlier cell that ran, for the namespace it built.
        rerun = [c.index for c in cells if c.index < todo[0].index and c.skip is None]
        indices = [i for i in rerun if i not in lost] + [c.index for c in todo]
        plan = {
            "guide": guide.name, "chip": guide.chip, "devices": guide.devices,
            "events": str(events),
            "cells": [
                {"index": i, "line": planned[i][0].line, "source": planned[i][1]}
                for i in indices
            ],
        }  # fmt: skip
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        events.unlink(missing_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [python, "-m", "coremesh.testing.upstream.guide_child", str(plan_path)],
                cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            hung = _watch(proc, events, timeout)
        run.processes += 1
        results, unfinished = _read_events(events)
        for i, e in results.items():
            if i not in done:
                cell, _, changes = planned[i]
                done[i] = _finish(cell, e, changes)
        if hung is not None:
            cell, _, changes = planned[hung]
            done[hung] = CellResult(
                cell.index, cell.line, "hang", f"still running after {timeout:g} s",
                timeout, changes, cell.dropped,
            )  # fmt: skip
            lost.add(hung)
        elif unfinished is not None:
            cell, _, changes = planned[unfinished]
            done[unfinished] = CellResult(
                cell.index, cell.line, "fail",
                f"the guide's process ended in this cell (exit code {proc.returncode})",
                0.0, changes, cell.dropped,
            )  # fmt: skip
            lost.add(unfinished)
        elif any(c.index not in done for c in todo):
            missing = [c.index for c in todo if c.index not in done]
            for i in missing:
                cell, _, changes = planned[i]
                done[i] = CellResult(
                    cell.index, cell.line, "fail",
                    f"not run: the guide's process ended first (exit code {proc.returncode}): "
                    + last_line(log_path.read_text(errors="replace")),
                    0.0, changes, cell.dropped,
                )  # fmt: skip
    run.cells = [done[c.index] for c in cells]
    run.elapsed_s = time.perf_counter() - started
    return run
