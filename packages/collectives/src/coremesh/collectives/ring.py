"""Ring schedules: all-gather and reduce-scatter in ``n - 1`` neighbour steps.

A ring moves every chunk over one link per step, so each link carries ``(n - 1) / n`` of the
data: the lower bound for all-gather and reduce-scatter. A ring has a direction (+1: send to
the next rank, receive from the previous; -1: the reverse) and works on one *part* of every
chunk, so a bidirectional ring is two rings on two halves, and the cores of a device each run
rings on their own share.

Each ring is driven step by step (``start(s)`` then ``finish(s)``) so several rings interleave:
all their step-``s`` DMAs are in flight together.

Synchronisation (see :mod:`coremesh.collectives.sync`): ``per_step`` gives every step its own
DMA semaphores (and, for reduce-scatter, its own receive slot), so nothing is reused;
``credit`` keeps two of each and makes the sender wait for the receiver's credit before it
reuses one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from coremesh.collectives import sync as sync_
from coremesh.collectives.axes import Axis
from coremesh.collectives.layout import combiner, in_vmem
from coremesh.collectives.scratch import Scratch, ScratchSpec

View = Callable[[Any], Any]  # chunk index (traced) -> ref of this ring's part of that chunk


def _slots(n: int, sync: sync_.Sync) -> int:
    return max(1, n - 1) if sync == "per_step" else min(2, max(1, n - 1))


def _sems(prefix: str, n: int, sync: sync_.Sync) -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    k = _slots(n, sync)
    entries: list[tuple[str, Any]] = [
        (f"{prefix}send", pltpu.SemaphoreType.DMA((k,))),
        (f"{prefix}recv", pltpu.SemaphoreType.DMA((k,))),
    ]
    if sync == "credit" and n > 3:
        entries.append((f"{prefix}credit", pltpu.SemaphoreType.REGULAR))
    return ScratchSpec(tuple(entries))


@dataclasses.dataclass
class Ring:
    """State shared by the ring schedules: participants, direction and synchronisation."""

    axis: Axis
    direction: int
    sync: sync_.Sync
    scratch: Scratch
    rank: Any = None

    @property
    def n(self) -> int:
        return self.axis.size

    def begin(self) -> None:
        self.rank = self.axis.rank()

    def peers(self) -> list[Any]:
        """Ranks this ring exchanges with (for the handshake): next and previous."""
        r = self.axis.rank()
        return [self.axis.shift(r, self.direction), self.axis.shift(r, -self.direction)]

    def to(self) -> Any:
        return self.axis.shift(self.rank, self.direction)

    def source(self) -> Any:
        return self.axis.shift(self.rank, -self.direction)

    def chunk(self, steps_back: int) -> Any:
        """The chunk index ``steps_back`` ring positions behind this participant."""
        return self.axis.shift(self.rank, -self.direction * steps_back)

    def slot(self, s: int) -> int:
        return s % _slots(self.n, self.sync)

    def wait_credit(self, s: int) -> None:
        if self.sync == "credit" and s >= 2:
            sync_.take(self.scratch["credit"])

    def give_credit(self, s: int) -> None:
        if self.sync == "credit" and s + 2 <= self.n - 2:
            sync_.grant(self.axis, self.scratch["credit"], self.source())

    def start(self, s: int) -> None:
        raise NotImplementedError

    def finish(self, s: int) -> None:
        raise NotImplementedError

    def remote(self, src: Any, dst: Any, s: int) -> Any:
        from jax.experimental.pallas import tpu as pltpu

        k = self.slot(s)
        return pltpu.make_async_remote_copy(
            src,
            dst,
            self.scratch["send"].at[k],
            self.scratch["recv"].at[k],
            device_id=self.axis.device_id(self.to()),
        )


@dataclasses.dataclass
class AllGatherRing(Ring):
    """Forward the chunk received last step; after ``n - 1`` steps ``dst`` has every chunk.

    ``dst(k)`` is this ring's part of chunk ``k`` of the output; it must already hold this
    participant's own chunk. Nothing is staged: the DMAs go from ``dst`` to the peer's ``dst``.
    """

    dst: View = dataclasses.field(default=lambda k: k)
    _copies: dict[int, Any] = dataclasses.field(default_factory=dict)

    @staticmethod
    def scratch_spec(n: int, sync: sync_.Sync) -> ScratchSpec:
        return _sems("", n, sync)

    def start(self, s: int) -> None:
        self.wait_credit(s)
        ref = self.dst(self.chunk(s))
        copy = self.remote(ref, ref, s)
        copy.start()
        self._copies[s] = copy

    def finish(self, s: int) -> None:
        copy = self._copies.pop(s)
        copy.wait_recv()
        copy.wait_send()
        self.give_credit(s)


@dataclasses.dataclass
class ReduceScatterRing(Ring):
    """Pass a running partial along the ring, adding this participant's chunk at each step.

    At step ``s`` a participant sends its partial of chunk ``rank - d*(s+1)`` and receives the
    partial of chunk ``rank - d*(s+2)``; after ``n - 1`` steps it holds the full reduction of
    its own chunk. Partials travel VMEM to VMEM; ``src(k)`` may live in HBM (read once, a step
    ahead, into a VMEM buffer) or VMEM.
    """

    src: View = dataclasses.field(default=lambda k: k)
    out: Any = None
    op: str = "sum"
    _copies: dict[int, Any] = dataclasses.field(default_factory=dict)
    _loads: dict[int, Any] = dataclasses.field(default_factory=dict)

    @staticmethod
    def scratch_spec(
        n: int, part: Sequence[int], dtype: Any, sync: sync_.Sync, *, src_in_vmem: bool
    ) -> ScratchSpec:
        from jax.experimental.pallas import tpu as pltpu

        shape = tuple(part)
        entries: list[tuple[str, Any]] = [
            ("inbox", pltpu.VMEM((_slots(n, sync), *shape), dtype)),
            ("acc", pltpu.VMEM((2, *shape), dtype)),
        ]
        if not src_in_vmem:
            entries.append(("own", pltpu.VMEM((2, *shape), dtype)))
        entries.append(("own_sem", pltpu.SemaphoreType.DMA((2,))))
        return ScratchSpec(tuple(entries)) + _sems("", n, sync)

    def _load(self, s: int) -> None:
        """Start reading this participant's part of the chunk it adds at step ``s``."""
        from jax.experimental.pallas import tpu as pltpu

        if in_vmem(self.src(0)):
            return
        copy = pltpu.make_async_copy(
            self.src(self.chunk(s + 2)),
            self.scratch["own"].at[s % 2],
            self.scratch["own_sem"].at[s % 2],
        )
        copy.start()
        self._loads[s] = copy

    def _own(self, s: int) -> Any:
        if s in self._loads:
            self._loads.pop(s).wait()
            return self.scratch["own"][s % 2]
        return self.src(self.chunk(s + 2))[...]

    def start(self, s: int) -> None:
        self.wait_credit(s)
        payload = self.src(self.chunk(1)) if s == 0 else self.scratch["acc"].at[(s - 1) % 2]
        self._load(s)
        copy = self.remote(payload, self.scratch["inbox"].at[self.slot(s)], s)
        copy.start()
        self._copies[s] = copy

    def finish(self, s: int) -> None:
        from jax.experimental.pallas import tpu as pltpu

        copy = self._copies.pop(s)
        copy.wait_recv()
        inbox = self.scratch["inbox"].at[self.slot(s)]
        combine = combiner(self.op, inbox.dtype)
        value = combine(self._own(s), inbox[...])
        self.give_credit(s)
        last = s == self.n - 2
        if last and in_vmem(self.out):
            self.out[...] = value
        else:
            acc = self.scratch["acc"].at[s % 2]
            acc[...] = value
            if last:
                store = pltpu.make_async_copy(acc, self.out, self.scratch["own_sem"].at[0])
                store.start()
                store.wait()
        copy.wait_send()


def drive(rings: Sequence[Ring], steps: int) -> None:
    """Run ``steps`` steps of every ring, their step-``s`` DMAs in flight together."""
    for ring in rings:
        ring.begin()
    for s in range(steps):
        for ring in rings:
            ring.start(s)
        for ring in rings:
            ring.finish(s)
