"""The child that runs one guide's cells: ``python -m coremesh.testing.upstream.guide_child PLAN``.

The plan (JSON, written by :mod:`~coremesh.testing.upstream.guide_run`) names the chip, the
device count, the events file and the cells. The simulator is entered before any cell runs, so
its host device count holds for the guide's first ``jax.local_device_count()``; then the cells
run in order in one namespace, as a notebook's kernel would run them, each one's stdout both
kept (for the runner's checks) and passed on to the log. A cell that raises is a failure and the
next cell still runs. Events are flushed as they happen (:class:`EventWriter`): a cell that hangs
is one with ``start`` and no ``result`` when the runner stops the process. SIGUSR1 dumps every
thread's stack to the log first, so a hang shows where it was.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from coremesh.testing.upstream.events import EventWriter, first_line

#: Characters kept of a failure's first line (the simulator's errors name the kernel line last).
MESSAGE_LIMIT = 700
#: The file name cells are compiled under (tracebacks name it, with the cell's line).
CELL_FILE = "<guide {guide} cell {index}>"


class _Tee(io.TextIOBase):
    """Writes go to a buffer and to the real stream."""

    def __init__(self, real: TextIO) -> None:
        self._real = real
        self.buffer_text = io.StringIO()

    def write(self, s: str) -> int:
        self.buffer_text.write(s)
        self._real.write(s)
        return len(s)

    def flush(self) -> None:
        self._real.flush()


def failure(exc: BaseException, filename: str) -> str:
    """``Type: first line``, and the cell line it was raised from when the cell's own code is on
    the stack."""
    text = first_line(str(exc), limit=MESSAGE_LIMIT)
    head = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    return f"{head} (cell line {lines[-1]})" if lines else head


def run_cells(plan: dict[str, Any], events: EventWriter) -> None:
    import coremesh.testing

    namespace: dict[str, Any] = {"__name__": "__main__"}
    with coremesh.testing.simulate(chip=plan["chip"], devices=plan["devices"]):
        for cell in plan["cells"]:
            index = cell["index"]
            filename = CELL_FILE.format(guide=plan["guide"], index=index)
            sys.stdout.write(f"\n===== cell {index} (line {cell['line']}) =====\n")
            sys.stdout.flush()
            events.write("start", index=index)
            tee = _Tee(sys.stdout)
            started = time.perf_counter()
            status, message = "pass", ""
            try:
                code = compile(cell["source"], filename, "exec")
                with contextlib.redirect_stdout(tee):
                    exec(code, namespace)
            except Exception as exc:  # a cell's failure is a result, not the end of the guide
                traceback.print_exc()
                status, message = "fail", failure(exc, filename)
            seconds = time.perf_counter() - started
            events.write(
                "result", index=index, status=status, message=message,
                seconds=round(seconds, 3), stdout=tee.buffer_text.getvalue(),
            )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    events = EventWriter(Path(plan["events"]))
    try:
        run_cells(plan, events)
        events.write("done")
    finally:
        events.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
