"""A long test file split across processes, by how long each of its tests took last time.

With one process per file, a run can take no less than its longest file: JAX's paged-attention
file is 71 minutes in one process on 2 CPUs. When a file took longer last time than the run's
fair share per job (all files' seconds over ``jobs``), and the last run timed its tests, its
tests are dealt into parts of about equal seconds, each run by its own process. Every part but
the last runs the tests dealt to it; the last runs every other test of the file, so a test
added since then runs once, there. The parts' results make one row of the table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

from coremesh.testing.upstream.file_run import FileRun
from coremesh.testing.upstream.last_run import FileKey

#: (test file name, mode) -> [(node id, seconds)] of each test, from an earlier run's table.
Timed = Mapping[FileKey, Sequence[tuple[str, float]]]

Key = TypeVar("Key")


@dataclasses.dataclass(frozen=True)
class Part:
    """One process's share of a file: ``index`` of ``count``. ``only``: the node ids it runs
    (None: all but ``others``); ``others``: node ids the other parts run."""

    index: int
    count: int
    only: frozenset[str] | None = None
    others: frozenset[str] = frozenset()
    seconds: float = 0.0

    @property
    def suffix(self) -> str:
        """What the part's logs and work files add to the file's stem ('' for a whole file)."""
        return "" if self.count == 1 else f".part{self.index + 1}of{self.count}"


WHOLE = Part(0, 1)


def deal(tests: Sequence[tuple[str, float]], count: int) -> list[list[str]]:
    """``tests`` in ``count`` hands of about equal seconds: the longest first, each to the hand
    with the fewest seconds so far; each hand keeps the file's order."""
    hands: list[list[int]] = [[] for _ in range(count)]
    totals = [0.0] * count
    for k in sorted(range(len(tests)), key=lambda k: -tests[k][1]):
        h = min(range(count), key=lambda h: (totals[h], h))
        hands[h].append(k)
        totals[h] += tests[k][1]
    return [[tests[k][0] for k in sorted(hand)] for hand in hands]


def plan(
    keys: Sequence[Key],
    seconds: Mapping[Key, float],
    tests: Mapping[Key, Sequence[tuple[str, float]]],
    jobs: int,
) -> dict[Key, list[Part]]:
    """The parts of each of ``keys`` (a file in a mode): one whole part, or, for a file that took
    longer than ``sum(seconds) / jobs`` and has timed tests, up to ``jobs`` parts of about equal
    seconds."""
    share = sum(seconds.get(k, 0.0) for k in keys) / max(jobs, 1)
    out: dict[Key, list[Part]] = {}
    for key in keys:
        took, timed = seconds.get(key, 0.0), list(tests.get(key, ()))
        count = min(jobs, len(timed), math.ceil(took / share)) if share > 0 and took > share else 1
        if count <= 1:
            out[key] = [dataclasses.replace(WHOLE, seconds=took)]
            continue
        by_id = dict(timed)
        hands = deal(timed, count)
        known = frozenset(by_id)
        parts = [
            Part(k, count, only=frozenset(hand), seconds=sum(by_id[t] for t in hand))
            for k, hand in enumerate(hands[:-1])
        ]
        last = frozenset(hands[-1])
        parts.append(
            Part(count - 1, count, others=known - last, seconds=sum(by_id[t] for t in last))
        )
        out[key] = parts
    return out


def joined(pieces: Sequence[FileRun], order: Sequence[str]) -> FileRun:
    """One file's run from its parts' runs: their tests in ``order`` (the last run's; new tests
    after), their job seconds and processes added."""
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    rank = {nodeid: k for k, nodeid in enumerate(order)}
    out = FileRun(first.file, first.mode)
    out.results = sorted(
        (r for p in pieces for r in p.results), key=lambda r: rank.get(r.nodeid, len(rank))
    )
    out.elapsed_s = sum(p.elapsed_s for p in pieces)
    out.processes = sum(p.processes for p in pieces)
    out.unrun = sum(p.unrun for p in pieces)
    notes = [p.gave_up for p in pieces if p.gave_up]
    notes += [f"a part did not run: {p.not_run}" for p in pieces if p.not_run is not None]
    if all(p.not_run is not None for p in pieces):
        out.not_run = first.not_run
    elif notes:
        out.gave_up = "; ".join(notes)
    return out
