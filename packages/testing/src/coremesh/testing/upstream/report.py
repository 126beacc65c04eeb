"""The upstream run's tables: per file, pass/fail/error/hang/skip in each mode (markdown + JSON),
and the first line of what each test that did not pass said."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from coremesh.testing.upstream.events import STATUSES
from coremesh.testing.upstream.run import FileRun
from coremesh.testing.upstream.tree import TestTree

MODE_TITLES = {"sim": "simulator", "stock": "stock interpret"}


def _cell(run: FileRun | None) -> str:
    if run is None:
        return "not run"
    if run.not_run is not None:
        return f"not run: {run.not_run}"
    c = run.counts()
    return "/".join(str(c[s]) for s in STATUSES)


def _by_file(runs: Sequence[FileRun]) -> dict[str, dict[str, FileRun]]:
    out: dict[str, dict[str, FileRun]] = {}
    for r in runs:
        out.setdefault(r.file, {})[r.mode] = r
    return out


def markdown(runs: Sequence[FileRun], tree: TestTree, jax_version: str) -> str:
    modes = list(dict.fromkeys(r.mode for r in runs))
    by_file = _by_file(runs)
    head = ["file", "tests"]
    head += [f"{MODE_TITLES[m]} {'/'.join(STATUSES)}" for m in modes]
    head += [f"{MODE_TITLES[m]} s" for m in modes]
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
    for name, per_mode in by_file.items():
        for m in modes:
            run = per_mode.get(m)
            bad = [r for r in (run.results if run else []) if r.status != "pass"]
            if not bad:
                continue
            lines += ["", f"### {name.removesuffix('.py')}, {MODE_TITLES[m]}", ""]
            lines += [f"- `{r.nodeid.split('::', 1)[-1]}`: {r.status}: {r.message}" for r in bad]
    return "\n".join(lines) + "\n"


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
                "counts": r.counts(),
                "tests": [t.to_json() for t in r.results],
            }
            for r in runs
        ],
    }  # fmt: skip
    return json.dumps(doc, indent=1)
