"""The testing README's patch table is the simulator's patch list: every patch has one row, and
each jax line's column says ``applied`` where the patch applies there (``Patch.needed``) and
``upstream`` where that release fixed the gap itself. Read from the source tree; a row missing
or a column gone stale is a README that no longer tells the truth."""

from __future__ import annotations

import re
from pathlib import Path

from coremesh.testing.sim.patches import PATCHES

README = Path(__file__).resolve().parents[2] / "README.md"


def patch_table() -> tuple[list[str], dict[str, list[str]]]:
    """(the jax releases the table has columns for, patch name -> its cells for them)."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| patch | stock gap |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    releases = header[2:]
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0])
        assert name is not None, line[:80]
        assert name.group(1) not in rows, f"two rows for {name.group(1)}"
        rows[name.group(1)] = cells[-len(releases) :]
    return releases, rows


def test_every_patch_has_one_row_and_nothing_else_does() -> None:
    _, rows = patch_table()
    assert sorted(rows) == sorted(p.name for p in PATCHES)


def test_each_column_says_where_the_patch_applies() -> None:
    releases, rows = patch_table()
    assert releases == ["0.10.2", "0.11.2", "0.12.0.1"]
    for patch in PATCHES:
        for release, cell in zip(releases, rows[patch.name], strict=True):
            word = "applied" if patch.needed(release) else "upstream"
            assert cell.split()[0] == word, (patch.name, release, cell)
