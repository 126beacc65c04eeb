"""What a child pytest tells the runner, one JSON line per event, flushed as it happens.

A test that hangs ends its process (pytest-timeout's thread method exits it), so results are
not left for the end: each test writes ``start`` before it runs and ``result`` after, and a
collection failure writes ``not_run``. A ``start`` without a ``result`` is the test that hung or
took the process down.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

Status = Literal["pass", "fail", "error", "hang", "skip"]
STATUSES: tuple[Status, ...] = ("pass", "fail", "error", "hang", "skip")


@dataclasses.dataclass(frozen=True)
class TestResult:
    """One test's outcome; ``message`` is the first line of what a non-pass said."""

    __test__ = False  # not a pytest test class

    nodeid: str
    status: Status
    message: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def first_line(text: str, limit: int = 300) -> str:
    for raw in str(text).splitlines():
        if raw.strip():
            line = " ".join(raw.split())
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


class EventWriter:
    """Appends events to a file, one flushed line each."""

    def __init__(self, path: Path) -> None:
        self._f = Path(path).open("a", encoding="utf-8")  # noqa: SIM115  # closed by close()

    def write(self, event: str, **fields: Any) -> None:
        self._f.write(json.dumps({"event": event, **fields}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


@dataclasses.dataclass
class Events:
    """What a child wrote: finished tests, a test started and not finished, a collection error."""

    results: list[TestResult] = dataclasses.field(default_factory=list)
    unfinished: str | None = None
    not_run: str | None = None
    #: The node ids the child collected to run, or None if it never got that far.
    collected: list[str] | None = None


def read_events(path: Path) -> Events:
    out = Events()
    path = Path(path)
    if not path.exists():
        return out
    started: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the process ending
        kind = e.get("event")
        if kind == "start":
            started = e["nodeid"]
        elif kind == "result":
            out.results.append(
                TestResult(e["nodeid"], e["status"], e.get("message", ""), e.get("seconds", 0.0))
            )
            started = None
        elif kind == "not_run":
            out.not_run = e["message"]
        elif kind == "collected":
            out.collected = list(e["nodeids"])
    out.unfinished = started
    return out
