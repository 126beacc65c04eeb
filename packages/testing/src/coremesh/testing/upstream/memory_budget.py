"""Host memory the test processes of one run share: when together they hold more than the run's
limit, the largest is stopped.

A fixed share per job stopped tests that need much for a moment beside one that needs little:
at ``--jobs 2`` on a 24 GiB host each process had 8.8 GiB, and 4 of JAX's splash-attention
backward tests on jax 0.10.2 were stopped there, though each passes alone (up to 10.1 GiB: at
their peak 6.3 GiB are XLA:CPU's temporaries for the test's reference, in two of its threads,
beside a 537 MB float32 ``(8, 4096, 4096)`` result), while the paged-attention process beside
them held 1 to 4 GiB. One budget for all lets a process take what the others leave, and still
keeps the run inside the memory it was given.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def resident_bytes(pid: int) -> int | None:
    """Resident bytes of process ``pid`` (Linux's /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryBudget:
    """``limit`` bytes for the test processes of a run of ``jobs`` at a time."""

    def __init__(self, limit: int, jobs: int = 1) -> None:
        self.limit = limit
        self.jobs = jobs
        self._lock = threading.Lock()
        self._pids: set[int] = set()

    @property
    def recycle_bytes(self) -> int:
        """A process holding more than half its share when a test ends stops there (jax keeps
        what it traced and compiled for each test it ran), and the file goes on in a new one."""
        return self.limit // (2 * self.jobs)

    @contextmanager
    def watching(self, pid: int) -> Iterator[None]:
        """Count process ``pid`` against the budget while the block runs."""
        with self._lock:
            self._pids.add(pid)
        try:
            yield
        finally:
            with self._lock:
                self._pids.discard(pid)

    def over(self, pid: int) -> bool:
        """Whether process ``pid`` is to be stopped: it alone holds more than the limit, or the
        processes together do and it holds the most (ties: the lowest pid)."""
        with self._lock:
            pids = sorted(self._pids | {pid})
        held = {p: resident_bytes(p) or 0 for p in pids}
        if held[pid] > self.limit:
            return True
        return sum(held.values()) > self.limit and max(pids, key=lambda p: held[p]) == pid

    def message(self) -> str:
        """What a stopped test's result says."""
        gib = self.limit / 2**30
        if self.jobs == 1:
            return f"over {gib:.1f} GiB of host memory; the runner stopped it"
        return (
            f"the run's test processes together held over {gib:.1f} GiB of host memory, this "
            "one the most; the runner stopped it"
        )
