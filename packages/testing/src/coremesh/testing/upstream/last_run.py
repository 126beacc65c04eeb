"""What an earlier run's JSON table says of time: each file's seconds and each test's.

The runner reads it once per run: the files' seconds start the longest first
(:func:`~coremesh.testing.upstream.run.start_order`), the tests' seconds split a long file
(:mod:`~coremesh.testing.upstream.parts`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

#: A file's key in both maps: (test file name, mode).
FileKey = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class LastRun:
    """``seconds``: each file's job seconds; ``tests``: each file's [(node id, seconds)] in the
    order the table lists them."""

    seconds: dict[FileKey, float] = dataclasses.field(default_factory=dict)
    tests: dict[FileKey, list[tuple[str, float]]] = dataclasses.field(default_factory=dict)


def read_last_run(table: Path) -> LastRun:
    """The timings in a JSON table an earlier run wrote (empty if there is none or it cannot be
    read)."""
    try:
        files = json.loads(table.read_text())["files"]
        return LastRun(
            seconds={(f["file"], f["mode"]): float(f["elapsed_s"]) for f in files},
            tests={
                (f["file"], f["mode"]): [
                    (t["nodeid"], float(t.get("seconds", 0.0))) for t in f["tests"]
                ]
                for f in files
            },
        )
    except (OSError, ValueError, KeyError, TypeError):
        return LastRun()
