"""One test file's run in one mode: what the runner returns and the tables show."""

from __future__ import annotations

import dataclasses
from typing import Literal

from coremesh.testing.upstream.events import STATUSES, Status, TestResult

Mode = Literal["sim", "stock"]


@dataclasses.dataclass
class FileRun:
    """One file run in one mode."""

    file: str
    mode: Mode
    results: list[TestResult] = dataclasses.field(default_factory=list)
    #: Why no test ran (the file's import failed), or None.
    not_run: str | None = None
    elapsed_s: float = 0.0
    #: Child processes started (more than one after a hang or a crash).
    processes: int = 0
    #: Tests left unrun because the run gave up on the file (see ``give_up``), and why.
    unrun: int = 0
    gave_up: str | None = None

    def counts(self) -> dict[Status, int]:
        out: dict[Status, int] = dict.fromkeys(STATUSES, 0)
        for r in self.results:
            out[r.status] += 1
        return out

    def summary(self) -> str:
        if self.not_run is not None:
            return f"not run: {self.not_run}"
        c = self.counts()
        out = f"{len(self.results)} tests: " + ", ".join(f"{c[s]} {s}" for s in STATUSES)
        return out + (f"; {self.unrun} not run: {self.gave_up}" if self.gave_up else "")
