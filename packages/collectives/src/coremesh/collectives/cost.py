"""Bytes per link and the ``CostEstimate`` of every collective kernel.

The model counts what the schedules in this package send, per participant, over *logical*
links (one per ordered pair of participants that exchange data):

* ``sent``: bytes one participant sends in total;
* ``busiest_link``: bytes on its busiest outgoing link, which bounds the time when links are
  the bottleneck (a bidirectional ring halves it: each direction carries half of every chunk);
* ``lower_bound``: bytes any algorithm must bring to each participant: ``(n - 1) / n`` of the
  data for all-gather, reduce-scatter and all-to-all, twice that for all-reduce, the whole
  payload for ppermute.

Sizes are for one participant's chunk ``c`` (bytes) and ``n`` participants; the data of an
all-gather or reduce-scatter is ``n * c``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from coremesh.core import CostEstimate


@dataclasses.dataclass(frozen=True)
class Traffic:
    """What one participant of a collective moves, by the algorithm's schedule."""

    collective: str
    algorithm: str
    participants: int
    data_bytes: int
    sent: int
    busiest_link: int
    lower_bound: int
    steps: int
    #: Bytes over ICI per device (all its cores), for device and hierarchical axes.
    ici_bytes: int = 0
    #: Bytes between the cores of a device, per device.
    core_link_bytes: int = 0

    @property
    def efficiency(self) -> float:
        """``lower_bound / sent``: 1.0 means the algorithm sends no byte more than needed."""
        return 1.0 if self.sent == 0 else self.lower_bound / self.sent

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "efficiency": round(self.efficiency, 4)}


def traffic(
    collective: str,
    algorithm: str,
    n: int,
    chunk_bytes: int,
    *,
    devices: int = 1,
    cores: int = 1,
    axis_kind: str = "device",
    perm: Sequence[tuple[int, int]] = (),
) -> Traffic:
    """The bytes ``algorithm`` moves for ``collective`` over ``n`` participants.

    ``devices`` and ``cores`` describe the axis (``axis_kind`` ``"core"``, ``"device"`` or
    ``"hierarchical"``) so that ICI and core-link bytes can be told apart; ``perm`` is a
    ppermute's permutation (default: every participant sends).
    """
    c = chunk_bytes
    data = n * c
    ring_bound = (n - 1) * c
    halves = 2 if algorithm == "bidirectional" else 1
    if collective in ("all_gather", "reduce_scatter"):
        if algorithm == "hierarchical":
            t = _hierarchical(collective, devices, cores, c)
        else:
            t = Traffic(
                collective,
                algorithm,
                n,
                data,
                ring_bound,
                -(-ring_bound // halves),
                ring_bound,
                n - 1,
            )
    elif collective == "all_reduce":
        half = traffic(
            "reduce_scatter", algorithm, n, c, devices=devices, cores=cores, axis_kind=axis_kind
        )
        t = Traffic(
            collective,
            algorithm,
            n,
            data,
            2 * half.sent,
            2 * half.busiest_link,
            2 * ring_bound,
            2 * half.steps,
            2 * half.ici_bytes,
            2 * half.core_link_bytes,
        )
    elif collective == "all_to_all":
        t = Traffic(
            collective,
            algorithm,
            n,
            data,
            ring_bound,
            c if n > 1 else 0,
            ring_bound,
            1 if n > 1 else 0,
        )
    elif collective == "ppermute":
        t = Traffic(collective, algorithm, n, c, c, c, c, 1)
    elif collective == "barrier":
        t = Traffic(collective, algorithm, n, 0, 0, 0, 0, 1)
    else:
        raise ValueError(f"unknown collective {collective!r}")
    if algorithm == "hierarchical" or collective == "all_reduce":
        return t
    if collective == "ppermute" and axis_kind == "hierarchical":
        pairs = list(perm) or [(i, (i + 1) % n) for i in range(n)]
        crossing = sum(1 for s, d in pairs if s // cores != d // cores)
        per_device = devices or 1
        return dataclasses.replace(
            t,
            sent=c if pairs else 0,
            ici_bytes=crossing * c // per_device,
            core_link_bytes=(len(pairs) - crossing) * c // per_device,
        )
    return _split_links(t, axis_kind, devices, cores)


def _hierarchical(collective: str, devices: int, cores: int, c: int) -> Traffic:
    """Two stages: a device ring per core over ``devices``, an exchange between ``cores``."""
    n = devices * cores
    ici = (devices - 1) * c  # per core
    core_link = (cores - 1) * devices * c  # per core
    return Traffic(
        collective,
        "hierarchical",
        n,
        n * c,
        ici + core_link,
        max(ici, devices * c if cores > 1 else 0),
        (n - 1) * c,
        (devices - 1) + (1 if cores > 1 else 0),
        ici_bytes=ici * cores,
        core_link_bytes=core_link * cores,
    )


def _split_links(t: Traffic, axis_kind: str, devices: int, cores: int) -> Traffic:
    """Attribute a flat schedule's bytes to ICI or core links, per device."""
    if axis_kind == "core":
        return dataclasses.replace(t, core_link_bytes=t.sent * cores)
    if axis_kind == "device":
        return dataclasses.replace(t, ici_bytes=t.sent * cores)
    # A flat ring over (device, core): of the n hops of each direction, `devices` cross ICI.
    n = t.participants
    if n <= 1:
        return t
    if t.collective in ("all_gather", "reduce_scatter"):
        # Per device: every core sends (n - 1) chunks; core hops stay inside, device hops cross.
        total = t.sent * cores
        ici = total * devices // n
        return dataclasses.replace(t, ici_bytes=ici, core_link_bytes=total - ici)
    # Direct exchanges: a participant's n - 1 peers are cores - 1 on its device, the rest off it.
    per_peer = t.sent // max(1, n - 1)
    return dataclasses.replace(
        t,
        ici_bytes=per_peer * (n - cores) * cores,
        core_link_bytes=per_peer * (cores - 1) * cores,
    )


def estimate(
    collective: str,
    *,
    chunk_bytes: int,
    chunk_elems: int,
    n: int,
    cores_working: int,
    hbm_bytes: int,
    algorithm: str = "ring",
    reduces: bool = False,
    devices: int = 1,
    cores: int = 1,
    axis_kind: str = "device",
) -> CostEstimate:
    """The kernel's ``CostEstimate`` for one device.

    ``cores_working`` participants of this device run the schedule (each with its own chunk);
    ``hbm_bytes`` is what the kernel reads and writes in HBM; reductions do one flop per
    element received in the reduce-scatter phase.
    """
    t = traffic(
        collective, algorithm, n, chunk_bytes, devices=devices, cores=cores, axis_kind=axis_kind
    )
    # Every element a participant receives in the reduce-scatter phase is combined once.
    combined = t.sent if collective != "all_reduce" else t.sent // 2
    itemsize = max(1, chunk_bytes // max(1, chunk_elems))
    flops = combined // itemsize * cores_working if reduces else 0
    return CostEstimate(
        flops=int(flops),
        bytes_accessed=int(hbm_bytes),
        remote_bytes=int(t.sent * cores_working),
    )


def nbytes(shape: Any, dtype: Any) -> int:
    from coremesh.core.dtypes import itemsize

    return int(math.prod(shape)) * itemsize(dtype)
