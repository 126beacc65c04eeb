"""The upstream run's tables: per file, pass/fail/error/hang/skip in each mode (markdown + JSON),
the tests stock passes and the simulator does not, the simulator's non-passes grouped by what
they said, and the first line of what each test that did not pass said."""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Sequence
from typing import Any

from coremesh.testing.upstream import beyond_cpu
from coremesh.testing.upstream.events import STATUSES
from coremesh.testing.upstream.file_run import FileRun
from coremesh.testing.upstream.tree import TestTree

MODE_TITLES = {"sim": "simulator", "stock": "stock interpret"}


def _cell(run: FileRun | None) -> str:
    if run is None:
        return "not run"
    if run.not_run is not None:
        return f"not run: {run.not_run}"
    c = run.counts()
    cell = "/".join(str(c[s]) for s in STATUSES)
    return cell + (f" (+{run.unrun} not run: gave up after hangs)" if run.gave_up else "")


def _by_file(runs: Sequence[FileRun]) -> dict[str, dict[str, FileRun]]:
    out: dict[str, dict[str, FileRun]] = {}
    for r in runs:
        out.setdefault(r.file, {})[r.mode] = r
    return out


def regressions(runs: Sequence[FileRun]) -> list[tuple[str, str, str]]:
    """(node id, status, message) of each test stock interpret mode passes and the simulator
    does not, where both ran."""
    stock = {
        r.nodeid for run in runs if run.mode == "stock" for r in run.results if r.status == "pass"
    }
    return [
        (r.nodeid, r.status, r.message)
        for run in runs
        if run.mode == "sim"
        for r in run.results
        if r.status != "pass" and r.nodeid in stock
    ]


#: The pass rate each file must reach on the simulator (issue's target).
TARGET = 0.9


def counted(run: FileRun) -> tuple[int, int, int]:
    """(passes, tests, tests left out) of ``run`` for the pass rate: the tests counted are those
    neither skipped nor failing on what only a TPU compile or device gives (:mod:`.beyond_cpu`;
    such a test that passes, as some of their parameterizations do, counts as a pass)."""
    passes = tests = out = 0
    for r in run.results:
        if _left_out(r):
            out += 1
        elif r.status != "skip":
            tests += 1
            passes += r.status == "pass"
    return passes, tests, out


def _left_out(r: Any) -> bool:
    return r.status not in ("pass", "skip") and beyond_cpu.reason(r.nodeid) is not None


def _rate(passes: int, tests: int) -> str:
    return f"{100 * passes / tests:.1f}%" if tests else ""


#: Parts of a message that differ between tests of one cause: numbers, quoted names, paths.
_VARYING = re.compile(r"'[^']*'|\"[^\"]*\"|\S+\.py:\d+|0x[0-9a-f]+|\d+(\.\d+)?(e-?\d+)?")


def cause(message: str, limit: int = 110) -> str:
    """``message`` with what varies between tests of one cause blanked, cut to ``limit``."""
    text = _VARYING.sub("_", message)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def causes(runs: Sequence[FileRun], mode: str = "sim") -> list[tuple[int, str, str]]:
    """(count, status, cause) of the non-passes other than skips in ``mode``, most first."""
    counter = collections.Counter(
        (r.status, cause(r.message))
        for run in runs
        if run.mode == mode
        for r in run.results
        if r.status not in ("pass", "skip")
    )
    return [(n, status, what) for (status, what), n in counter.most_common()]


def markdown(
    runs: Sequence[FileRun], tree: TestTree, jax_version: str, wall_s: float | None = None
) -> str:
    modes = list(dict.fromkeys(r.mode for r in runs))
    by_file = _by_file(runs)
    head = ["file", "tests"]
    head += [f"{MODE_TITLES[m]} {'/'.join(STATUSES)}" for m in modes]
    head += [f"{MODE_TITLES[m]} s" for m in modes]
    if "sim" in modes:
        head += ["needs a TPU compile or device", "simulator pass rate"]
    lines = [
        f"JAX test tree {tree.label} on jax {jax_version}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, per_mode in by_file.items():
        tests = max(len(r.results) for r in per_mode.values())
        row = [name.removesuffix(".py"), str(tests)]
        row += [_cell(per_mode.get(m)) for m in modes]
        row += [f"{per_mode[m].elapsed_s:.0f}" if m in per_mode else "" for m in modes]
        if "sim" in modes:
            sim = per_mode.get("sim")
            passes, tests, out = counted(sim) if sim is not None else (0, 0, 0)
            row += [str(out) if out else "", _rate(passes, tests)]
        lines.append("| " + " | ".join(row) + " |")
    totals = [sum(r.counts()[s] for r in runs if r.mode == m) for m in modes for s in STATUSES]
    lines.append("")
    for i, m in enumerate(modes):
        part = totals[i * len(STATUSES) : (i + 1) * len(STATUSES)]
        seconds = sum(r.elapsed_s for r in runs if r.mode == m)
        lines.append(
            f"{MODE_TITLES[m]}: {sum(part)} tests, "
            + ", ".join(f"{n} {s}" for n, s in zip(part, STATUSES, strict=True))
            + f" ({seconds:.0f} s)"
        )
    for i, m in enumerate(modes):
        c = dict(zip(STATUSES, totals[i * len(STATUSES) : (i + 1) * len(STATUSES)], strict=True))
        ran = sum(c.values()) - c["skip"]
        if ran:
            lines.append(
                f"{MODE_TITLES[m]}: {c['pass']} of the {ran} tests that were not skipped pass "
                f"({100 * c['pass'] / ran:.1f}%)"
            )
    if "sim" in modes:
        rates = {r.file: counted(r) for r in runs if r.mode == "sim"}
        passes, tests, out = (sum(c[i] for c in rates.values()) for i in range(3))
        under = [
            f"{name.removesuffix('.py')} ({_rate(p, n)})"
            for name, (p, n, _) in rates.items()
            if n and p < TARGET * n
        ]
        lines.append(
            f"simulator: {passes} of the {tests} tests neither skipped nor needing a TPU "
            f"compile or device ({out} left out) pass ({_rate(passes, tests)}); files under "
            f"{TARGET:.0%}: {', '.join(under) or 'none'}"
        )
    if wall_s is not None:
        lines.append(f"wall time: {wall_s:.0f} s")
    if "sim" in modes and "stock" in modes:
        worse = regressions(runs)
        lines += ["", f"### Stock passes, the simulator does not: {len(worse)}", ""]
        lines += [f"- `{n.split('::', 1)[-1]}`: {status}: {msg}" for n, status, msg in worse]
    if "sim" in modes:
        lines += ["", "### The simulator's non-passes by cause (skips left out)", ""]
        lines += ["| tests | status | what they said |", "|---|---|---|"]
        lines += [
            f"| {n} | {status} | {what.replace('|', '/')} |" for n, status, what in causes(runs)
        ]
    for name, per_mode in by_file.items():
        for m in modes:
            run = per_mode.get(m)
            bad = [r for r in (run.results if run else []) if r.status != "pass"]
            if not bad:
                continue
            lines += ["", f"### {name.removesuffix('.py')}, {MODE_TITLES[m]}", ""]
            lines += [_listed(r) for r in bad]
    return "\n".join(lines) + "\n"


def _listed(r: Any) -> str:
    note = f" (not counted: it {beyond_cpu.reason(r.nodeid)})" if _left_out(r) else ""
    return f"- `{r.nodeid.split('::', 1)[-1]}`: {r.status}: {r.message}{note}"


def tree_json(tree: TestTree) -> dict[str, Any]:
    """A test tree as the JSON tables record it."""
    return {
        "root": str(tree.root),
        "commit": tree.commit,
        "release": tree.release,
        "post": tree.post,
    }


def to_json(runs: Sequence[FileRun], tree: TestTree, jax_version: str) -> str:
    doc: dict[str, Any] = {
        "jax": jax_version,
        "tree": tree_json(tree),
        "files": [
            {
                "file": r.file,
                "mode": r.mode,
                "elapsed_s": round(r.elapsed_s, 2),
                "processes": r.processes,
                "not_run": r.not_run,
                "unrun": r.unrun,
                "gave_up": r.gave_up,
                "counts": r.counts(),
                "rate": dict(zip(("passes", "tests", "left_out"), counted(r), strict=True)),
                "tests": [t.to_json() for t in r.results],
            }
            for r in runs
        ],
    }  # fmt: skip
    return json.dumps(doc, indent=1)
