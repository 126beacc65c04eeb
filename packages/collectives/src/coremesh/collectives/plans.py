"""Plans: what one collective over one axis needs, whom it talks to, and what it runs.

A plan is built where the axis sizes are known (in the kernel body, or where the kernel is
built) from checked arguments: its ``spec`` is the scratch it needs, ``peers`` the ranks its
handshake meets, ``run`` the schedule (rings and the hierarchical schedule from
:mod:`~coremesh.collectives.bidirectional` and :mod:`~coremesh.collectives.hierarchical`, direct
exchanges from :mod:`~coremesh.collectives.direct`). The in-kernel collectives
(:mod:`coremesh.collectives.in_kernel`) and the array kernels (:mod:`coremesh.collectives.kernels`)
run the same plans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from coremesh.collectives import bidirectional as bi
from coremesh.collectives import direct, hierarchical, sync
from coremesh.collectives.axes import Axis
from coremesh.collectives.scratch import Scratch, ScratchSpec
from coremesh.collectives.validate import (
    RING_OPS,
    check_op,
    check_permutation,
    check_sync,
    chip_name,
    resolve_algorithm,
)
from coremesh.core import CoremeshError


@dataclasses.dataclass
class Plan:
    """What a collective needs (scratch), whom it talks to (peers) and what it does (run)."""

    axis: Axis
    algorithm: str
    spec: ScratchSpec
    peers: Callable[[], tuple[list[Any], list[Any] | None]]
    run: Callable[[Scratch], None]

    def on(self, src: Any, dst: Any) -> Plan:
        """This plan with its operands bound (``run`` reads them as ``@src`` / ``@dst``)."""
        run = self.run

        def with_refs(scr: Scratch) -> None:
            run(_with(scr, src, dst))

        return dataclasses.replace(self, run=with_refs)

    def execute(self, scratch: Scratch | None, *, handshake: bool) -> None:
        def body(scr: Scratch) -> None:
            if handshake and self.axis.size > 1:
                peers, valid = self.peers()
                sync.handshake(self.axis, peers, valid=valid)
            self.run(scr)

        if scratch is None:
            if not handshake and self.axis.size > 1 and self.spec.entries:
                raise CoremeshError(
                    "a collective without handshake must be given kernel-level scratch",
                    rule="a peer may write into this participant's scratch as soon as it has "
                    "passed an earlier handshake; scoped scratch (pl.run_scoped) is not there "
                    "yet, and its memory may belong to another buffer",
                    chip=chip_name(self.axis),
                    fix="allocate scratch_for(...).types with the kernel and pass "
                    "scratch=spec.bind(refs), or keep handshake=True",
                )
            self.spec.run_scoped(body)
            return
        missing = set(self.spec.names) - set(scratch)
        if missing:
            raise CoremeshError(
                f"the scratch given lacks {sorted(missing)}",
                rule="a collective's scratch is exactly what scratch_for(...) returns for the same "
                "collective, axis, shape, dtype, algorithm and sync",
                chip=chip_name(self.axis),
                fix="allocate scratch_for(...) with the same arguments as the collective",
            )
        body(scratch)


def ring_peers(axis: Axis) -> Callable[[], tuple[list[Any], None]]:
    """The ranks a ring's handshake meets: this participant's two neighbours."""

    def peers() -> tuple[list[Any], None]:
        r = axis.rank()
        return [axis.shift(r, 1), axis.shift(r, -1)], None

    return peers


def _hier_peers(axis: Axis) -> Callable[[], tuple[list[Any], None]]:
    return lambda: (hierarchical.peers(axis), None)


def local_sem() -> ScratchSpec:
    """The DMA semaphore (``"local"``) of a participant's copy within its own memory."""
    from jax.experimental.pallas import tpu as pltpu

    return ScratchSpec((("local", pltpu.SemaphoreType.DMA),))


def local_copy(src: Any, dst: Any, sem: Any) -> None:
    """Copy ``src`` to ``dst`` in this participant's memory, waiting on ``sem``."""
    from jax.experimental.pallas import tpu as pltpu

    copy = pltpu.make_async_copy(src, dst, sem)
    copy.start()
    copy.wait()


def _device_routes(axis: Axis, algorithm: str, chunk: Sequence[int], dtype: Any) -> list[bi.Route]:
    if algorithm == "hierarchical":
        return bi.routes("bidirectional", chunk, dtype, axis.chip, strict=False)
    return bi.routes(algorithm, chunk, dtype, axis.chip)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class _Ring:
    """A ring collective's checked schedule: algorithm, sync mode and routes over ``axis``."""

    axis: Axis
    chunk: Sequence[int]
    dtype: Any
    algorithm: str
    mode: sync.Sync
    routes: list[bi.Route]

    @property
    def hierarchical(self) -> bool:
        return self.algorithm == "hierarchical"

    @property
    def peers(self) -> Callable[[], tuple[list[Any], None]]:
        return _hier_peers(self.axis) if self.hierarchical else ring_peers(self.axis)

    def gather(self, dst: Any, scr: Scratch) -> None:
        """Every participant's ``dst[rank]`` into everyone's ``dst``."""
        if self.hierarchical:
            hierarchical.gather(self.axis, self.routes, dst, self.mode, scr)
        else:
            bi.gather(self.axis, self.routes, lambda k: dst.at[k], self.mode, scr)


def _ring(
    collective: str, axis: Axis, chunk: Sequence[int], dtype: Any, algorithm: str, sync_mode: str
) -> _Ring:
    algo = resolve_algorithm(collective, axis, algorithm, chunk, dtype)
    mode = check_sync(sync_mode, axis)
    return _Ring(axis, chunk, dtype, algo, mode, _device_routes(axis, algo, chunk, dtype))


def plan_all_gather(ring: _Ring) -> Plan:
    """All-gather: ``dst[k]`` gets participant ``k``'s ``src``."""
    axis = ring.axis
    if ring.hierarchical:
        spec = hierarchical.gather_scratch(axis, ring.routes, ring.mode)
    else:
        spec = bi.gather_scratch(axis.size, ring.routes, ring.mode)

    def run(scr: Scratch) -> None:
        src, dst = scr["@src"], scr["@dst"]
        local_copy(src, dst.at[axis.rank()], scr["local"])
        if axis.size > 1:
            ring.gather(dst, scr)

    return Plan(axis, ring.algorithm, spec + local_sem(), ring.peers, run)


def plan_reduce_scatter(ring: _Ring, op: str, *, src_in_vmem: bool) -> Plan:
    """Reduce-scatter: ``dst`` gets the reduction over participants of their ``src[rank]``."""
    axis, routes, mode = ring.axis, ring.routes, ring.mode
    if ring.hierarchical:
        spec = hierarchical.scatter_scratch(
            axis, routes, ring.chunk, ring.dtype, mode, src_in_vmem=src_in_vmem
        )
    else:
        spec = bi.scatter_scratch(
            axis.size, routes, ring.chunk, ring.dtype, mode, src_in_vmem=src_in_vmem
        )

    def run(scr: Scratch) -> None:
        src, dst = scr["@src"], scr["@dst"]
        if axis.size == 1:
            local_copy(src.at[0], dst, scr["local"])
        elif ring.hierarchical:
            hierarchical.scatter(axis, routes, src, dst, op, mode, scr, local=scr["local"])
        else:
            bi.scatter(axis, routes, lambda k: src.at[k], dst, op, mode, scr)

    return Plan(axis, ring.algorithm, spec + local_sem(), ring.peers, run)


def plan_all_reduce(ring: _Ring, op: str, *, src_in_vmem: bool) -> Plan:
    """All-reduce as reduce-scatter into ``dst[rank]`` then all-gather of ``dst``."""
    axis = ring.axis
    rs = plan_reduce_scatter(ring, op, src_in_vmem=src_in_vmem)
    spec = rs.spec.prefixed("rs.") + plan_all_gather(ring).spec.prefixed("ag.")

    def run(scr: Scratch) -> None:
        src, dst = scr["@src"], scr["@dst"]
        if axis.size == 1:
            local_copy(src, dst, scr["rs.local"])
            return
        rs.run(_with(scr.sub("rs."), src, dst.at[axis.rank()]))
        ring.gather(dst, scr.sub("ag."))

    return Plan(axis, ring.algorithm, spec, rs.peers, run)


def plan_all_to_all(axis: Axis, chunk: Sequence[int], dtype: Any, algorithm: str = "auto") -> Plan:
    del dtype
    algo = resolve_algorithm("all_to_all", axis, algorithm, chunk, None)
    spec = direct.all_to_all_scratch(axis.size)

    def run(scr: Scratch) -> None:
        src, dst = scr["@src"], scr["@dst"]
        direct.all_to_all(axis, lambda k: src.at[k], lambda k: dst.at[k], scr)

    return Plan(axis, algo, spec, lambda: (direct.all_to_all_peers(axis), None), run)


def plan_ppermute(
    axis: Axis,
    perm: Sequence[tuple[int, int]],
    chunk: Sequence[int],
    dtype: Any,
    algorithm: str = "auto",
    *,
    dst_in_vmem: bool = True,
) -> Plan:
    from jax.experimental.pallas import tpu as pltpu

    algo = resolve_algorithm("ppermute", axis, algorithm, chunk, dtype)
    pairs = check_permutation(perm, axis)
    spec = direct.ppermute_scratch()
    partial = len({d for _, d in pairs}) < axis.size
    if partial and not dst_in_vmem:
        spec = spec + ScratchSpec((("zero", pltpu.VMEM(tuple(chunk), dtype)),))

    def run(scr: Scratch) -> None:
        zero = scr.get("zero")
        direct.ppermute(axis, scr["@src"], scr["@dst"], pairs, scr, zero=zero)

    def peers() -> tuple[list[Any], list[Any] | None]:
        p, v = direct.ppermute_peers(axis, pairs)
        return p, v

    return Plan(axis, algo, spec, peers, run)


def plan_barrier(axis: Axis) -> Plan:
    return Plan(
        axis,
        "direct",
        direct.barrier_scratch(),
        lambda: (direct.barrier_peers(axis), None),
        lambda scr: direct.depart(axis, scr),
    )


def _with(scr: Scratch, src: Any, dst: Any) -> Scratch:
    return Scratch({**scr.refs, "@src": src, "@dst": dst})


def make_plan(
    collective: str,
    ax: Axis,
    chunk: tuple[int, ...],
    dtype: Any,
    op: str,
    algorithm: str,
    sync_mode: str,
    perm: Sequence[tuple[int, int]],
    src_in_vmem: bool,
    dst_in_vmem: bool,
) -> Plan:
    """The plan of one collective over ``ax``: what in-kernel collectives and array kernels run."""
    if collective in RING_OPS:
        if collective != "all_gather":
            check_op(op, ax)
        # all_reduce checks its algorithm as the reduce-scatter it starts with
        name = "reduce_scatter" if collective == "all_reduce" else collective
        ring = _ring(name, ax, chunk, dtype, algorithm, sync_mode)
        if collective == "all_gather":
            return plan_all_gather(ring)
        if collective == "reduce_scatter":
            return plan_reduce_scatter(ring, op, src_in_vmem=src_in_vmem)
        return plan_all_reduce(ring, op, src_in_vmem=src_in_vmem)
    if collective == "all_to_all":
        return plan_all_to_all(ax, chunk, dtype, algorithm)
    if collective == "ppermute":
        return plan_ppermute(ax, perm, chunk, dtype, algorithm, dst_in_vmem=dst_in_vmem)
    if collective == "barrier":
        return plan_barrier(ax)
    raise CoremeshError(
        f"unknown collective {collective!r}",
        rule="collectives are barrier, ppermute, all_gather, reduce_scatter, all_reduce and "
        "all_to_all",
        chip=chip_name(ax),
        fix="name one of those",
    )
