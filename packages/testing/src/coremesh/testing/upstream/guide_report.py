"""The guides' tables: per guide, per cell, pass / fail / hang / skip with its time and first line
(markdown + JSON), and the text changes each cell ran with."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from coremesh.testing.upstream.guide_run import CELL_STATUSES, CellResult, GuideRun
from coremesh.testing.upstream.report import tree_json
from coremesh.testing.upstream.tree import TestTree


def _note(cell: CellResult) -> str:
    parts = [cell.message] if cell.message else []
    if cell.output is not None:
        parts.append(f"output {cell.output}")
    if cell.changes:
        parts.append("ran with: " + "; ".join(c.split(":", 1)[0] for c in cell.changes))
    if cell.dropped and cell.status != "skip":
        parts.append("left out: " + "; ".join(cell.dropped))
    return " / ".join(parts).replace("|", "\\|")


def markdown(runs: Sequence[GuideRun], tree: TestTree, jax_version: str) -> str:
    lines = [f"JAX TPU guides of {tree.label} on jax {jax_version}, on the simulator", ""]
    lines += [
        "| guide | slice | cells | " + "/".join(CELL_STATUSES) + " | s |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        c = r.counts()
        lines.append(
            f"| {r.guide}{' (as written)' if r.as_written else ''} | {r.devices} x {r.chip} | "
            f"{len(r.cells)} | {'/'.join(str(c[s]) for s in CELL_STATUSES)} | {r.elapsed_s:.0f} |"
        )
    for r in runs:
        lines += ["", f"### {r.guide}: {r.devices} x {r.chip}", ""]
        lines += ["| cell | line | result | s | note |", "|---|---|---|---|---|"]
        for cell in r.cells:
            seconds = f"{cell.seconds:.1f}" if cell.status != "skip" else ""
            lines.append(
                f"| {cell.index} | {cell.line} | {cell.status} | {seconds} | {_note(cell)} |"
            )
        changes = sorted({ch for cell in r.cells for ch in cell.changes})
        if changes:
            lines += ["", "Text changes:", ""] + [f"- {ch}" for ch in changes]
    return "\n".join(lines) + "\n"


def to_json(runs: Sequence[GuideRun], tree: TestTree, jax_version: str) -> str:
    doc: dict[str, Any] = {
        "jax": jax_version,
        "tree": tree_json(tree),
        "guides": [
            {
                "guide": r.guide, "chip": r.chip, "devices": r.devices, "path": r.path,
                "as_written": r.as_written, "elapsed_s": round(r.elapsed_s, 2),
                "processes": r.processes, "counts": r.counts(),
                "cells": [c.to_json() for c in r.cells],
            }
            for r in runs
        ],
    }  # fmt: skip
    return json.dumps(doc, indent=1)
