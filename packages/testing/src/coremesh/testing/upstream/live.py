"""The heartbeat of a run in progress: which files are running and how far each has got.

A file's line is printed when the file finishes, and JAX's longest files take most of an hour,
so a whole tree printed nothing for its first half hour (32 minutes on jax 0.12.0.1, until
splash attention ended). :class:`Live` holds what each
running file (or part of one) has finished, as its runner last read the child's events, and
:func:`heartbeat` prints it at a fixed interval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

#: Seconds between two heartbeat lines of ``coremesh upstream``.
EVERY_S = 60.0


@dataclasses.dataclass
class _Running:
    finished: int = 0
    total: int | None = None  # None until the child has collected its tests


class Live:
    """Tests finished per running unit (a file in a mode, or a part of one), and files done."""

    def __init__(self, files: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._files = files
        self._done = 0
        self._clock = clock
        self._started = clock()
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()

    def update(self, unit: str, finished: int, total: int | None) -> None:
        """``unit`` has finished ``finished`` of its ``total`` tests (``total`` None: unknown
        yet; a known total is kept when a later update does not know it)."""
        with self._lock:
            now = self._running.setdefault(unit, _Running())
            now.finished = finished
            if total is not None:
                now.total = total

    def ended(self, unit: str) -> None:
        with self._lock:
            self._running.pop(unit, None)

    def file_done(self) -> None:
        with self._lock:
            self._done += 1

    def line(self) -> str:
        """``[12m00s] 3 of 28 files done; running: name 212/872, other (collecting)``."""
        with self._lock:
            seconds = int(self._clock() - self._started)
            parts = [
                f"{unit} {r.finished}/{r.total}" if r.total is not None else f"{unit} (collecting)"
                for unit, r in self._running.items()
            ]
            head = f"[{seconds // 60}m{seconds % 60:02d}s] {self._done} of {self._files} files done"
        return f"{head}; running: {', '.join(parts)}" if parts else head


@contextlib.contextmanager
def heartbeat(live: Live, stream: TextIO, every_s: float = EVERY_S) -> Iterator[None]:
    """Print ``live.line()`` to ``stream`` every ``every_s`` seconds while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            stream.write(live.line() + "\n")
            stream.flush()

    thread = threading.Thread(target=beat, name="coremesh-upstream-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
