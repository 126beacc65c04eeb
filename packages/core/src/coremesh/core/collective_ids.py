"""Collective ids: a barrier-semaphore namespace that two kernels must never share by accident.

Mosaic pairs the barrier semaphore of a kernel with its ``collective_id``; two collectives in one
program with the same id race on one barrier (jax PR#27963). The allocator hands out distinct ids
and refuses a second claim of a taken one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from coremesh.core.errors import CollectiveIdError

DEFAULT_CAPACITY = 64


class CollectiveIdAllocator:
    """Hands out ids from ``[first, first + capacity)``; each is owned by a name until released."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, first: int = 0) -> None:
        if capacity < 1 or first < 0:
            raise CollectiveIdError(
                f"invalid id range first={first}, capacity={capacity}",
                rule="ids are non-negative and the pool holds at least one",
                fix="pass first >= 0 and capacity >= 1",
            )
        self.first, self.capacity = first, capacity
        self._owners: dict[int, str] = {}
        self._lock = threading.Lock()

    def allocate(self, owner: str) -> int:
        """The lowest free id, now owned by ``owner``."""
        with self._lock:
            for i in range(self.first, self.first + self.capacity):
                if i not in self._owners:
                    self._owners[i] = owner
                    return i
        raise CollectiveIdError(
            f"no collective id left for {owner!r}: all {self.capacity} ids are taken "
            f"({self._summary()})",
            rule=f"the pool holds ids {self.first}..{self.first + self.capacity - 1}",
            fix="release ids of kernels that are gone (allocator.release / scope()), or make "
            "a larger allocator",
        )

    def id_for(self, owner: str) -> int:
        """The id ``owner`` already holds, or a new one: a kernel traced again keeps its id."""
        with self._lock:
            for cid, who in self._owners.items():
                if who == owner:
                    return cid
        return self.allocate(owner)

    def claim(self, cid: int, owner: str) -> int:
        """Take a specific id, refusing one outside the pool or already owned."""
        with self._lock:
            if not self.first <= cid < self.first + self.capacity:
                raise CollectiveIdError(
                    f"collective id {cid} for {owner!r} is outside the pool",
                    rule=f"ids run {self.first}..{self.first + self.capacity - 1}",
                    fix="use allocate() or an id in that range",
                )
            if cid in self._owners:
                raise CollectiveIdError(
                    f"collective id {cid} is already taken by {self._owners[cid]!r}; "
                    f"{owner!r} asked for it too",
                    rule="two collectives sharing an id share a barrier semaphore and race",
                    fix="let the allocator pick (allocate()), or release the other owner first",
                )
            self._owners[cid] = owner
            return cid

    def release(self, cid: int) -> None:
        with self._lock:
            if self._owners.pop(cid, None) is None:
                raise CollectiveIdError(
                    f"collective id {cid} is not allocated",
                    rule="only allocated ids can be released",
                    fix="release each id once",
                )

    def owner(self, cid: int) -> str | None:
        with self._lock:
            return self._owners.get(cid)

    @property
    def in_use(self) -> dict[int, str]:
        with self._lock:
            return dict(self._owners)

    @contextlib.contextmanager
    def scope(self) -> Iterator[CollectiveIdAllocator]:
        """Release every id allocated inside the block when it ends."""
        before = set(self.in_use)
        try:
            yield self
        finally:
            with self._lock:
                for cid in set(self._owners) - before:
                    del self._owners[cid]

    def _summary(self) -> str:
        items = sorted(self._owners.items())
        shown = ", ".join(f"{i}: {o}" for i, o in items[:4])
        return shown + (f", ... {len(items) - 4} more" if len(items) > 4 else "")


_default = CollectiveIdAllocator()


def default_allocator() -> CollectiveIdAllocator:
    """The process-wide allocator every coremesh package draws from."""
    return _default
