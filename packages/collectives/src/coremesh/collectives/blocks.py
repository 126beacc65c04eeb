"""In-kernel collectives on refs, for the body of a ``pl.kernel`` / ``pl.core_map``.

Each block exchanges data between the participants of an axis (``"core"``, a device axis, or
``("device", "core")``), all of which run the same block in SPMD fashion. Refs are *symmetric*:
every participant passes a ref of the same shape at the same address in its own memory (remote
DMAs address the peer's buffer with the sender's ref). Over the core axis and ``(device,
core)`` the cores of a device share HBM, so refs that receive data must be in VMEM there.

Layouts put the participants first: ``all_gather(src (*c) -> dst (n, *c))``,
``reduce_scatter(src (n, *c) -> dst (*c))``, ``all_reduce(src (n, *c) -> dst (n, *c))``,
``all_to_all(src (n, *c) -> dst (n, *c))``, ``ppermute(src (*c) -> dst (*c))``.

Scratch: by default a block allocates what it needs with ``pl.run_scoped``. To allocate it with
the kernel instead, add ``scratch_for(...).types`` to the kernel's scratch and pass
``scratch=spec.bind(refs)``. The kernel needs a collective id (its barrier semaphore): build it
with ``coremesh.tensorcore.kernel(..., collective_id="auto")`` or
``pltpu.CompilerParams(collective_id=coremesh.core.default_allocator().allocate(name))``. Run one
handshaking block per kernel; further blocks in the same body take ``handshake=False`` and
kernel-level scratch (see :mod:`coremesh.collectives.sync`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

from coremesh.collectives import bidirectional as bi
from coremesh.collectives import direct, hierarchical, sync
from coremesh.collectives.axes import CORE_AXIS, Axis, AxisName, in_kernel
from coremesh.collectives.layout import in_vmem, memory_space, split
from coremesh.collectives.scratch import Scratch, ScratchSpec
from coremesh.core import CoremeshError, LayoutError, MeshError

Algorithm = Literal["auto", "ring", "bidirectional", "hierarchical", "direct"]
Op = Literal["sum", "max", "min"]
Collective = Literal[
    "barrier", "ppermute", "all_gather", "reduce_scatter", "all_reduce", "all_to_all"
]
RING_OPS: frozenset[str] = frozenset({"all_gather", "reduce_scatter", "all_reduce"})
OPS: tuple[Op, ...] = ("sum", "max", "min")


def _chip_name(axis: Axis) -> str | None:
    return axis.chip.name if axis.chip else None


def resolve_algorithm(
    collective: str, axis: Axis, algorithm: str, chunk: Sequence[int], dtype: Any
) -> str:
    """The algorithm a collective runs: ``algorithm`` checked, or the best one for ``"auto"``."""
    if collective not in RING_OPS:
        if algorithm in ("auto", "direct"):
            return "direct"
        raise CoremeshError(
            f"{collective} has no {algorithm!r} algorithm",
            rule=f"{collective} sends straight to its peers (algorithm='direct')",
            chip=_chip_name(axis),
            fix="pass algorithm='direct' or 'auto'",
        )
    if algorithm not in ("auto", "ring", "bidirectional", "hierarchical"):
        raise CoremeshError(
            f"unknown algorithm {algorithm!r} for {collective}",
            rule="ring collectives run 'ring', 'bidirectional' or, over (device, core), "
            "'hierarchical'",
            chip=_chip_name(axis),
            fix="pass one of those, or 'auto'",
        )
    if algorithm == "hierarchical" and axis.kind != "hierarchical":
        raise MeshError(
            f"algorithm 'hierarchical' over the {axis.describe()}",
            rule="the two-stage schedule runs over the (device axis, core axis) tuple",
            chip=_chip_name(axis),
            fix="collect over (device, core), or use 'ring' / 'bidirectional'",
        )
    if algorithm != "auto":
        return algorithm
    if axis.kind == "hierarchical" and axis.cores > 1 and axis.num_devices > 1:
        return "hierarchical"
    if axis.size > 2 and len(split(chunk, 2, dtype, axis.chip)) == 2:
        return "bidirectional"
    return "ring"


def check_sync(mode: str, axis: Axis) -> sync.Sync:
    if mode not in sync.SYNC_MODES:
        raise CoremeshError(
            f"unknown sync mode {mode!r}",
            rule="rings use a semaphore per step ('per_step') or two reused with a credit "
            "handshake ('credit')",
            chip=_chip_name(axis),
            fix="pass sync='per_step' or sync='credit'",
        )
    return mode


def check_permutation(perm: Sequence[tuple[int, int]], axis: Axis) -> list[tuple[int, int]]:
    """``perm`` as a list of (source, destination) pairs of a (partial) permutation."""
    chip = _chip_name(axis)
    try:
        pairs = [(int(s), int(d)) for s, d in perm]
    except (TypeError, ValueError) as e:
        raise LayoutError(
            f"perm {perm!r} is not a list of (source, destination) pairs",
            rule="ppermute takes pairs of participant indices, as jax.lax.ppermute",
            chip=chip,
            fix="pass e.g. perm=[(0, 1), (1, 0)]",
        ) from e
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    bad = sorted({i for i in srcs + dsts if not 0 <= i < axis.size})
    if bad:
        raise LayoutError(
            f"perm names participant(s) {bad} on the {axis.describe()}",
            rule=f"participants are numbered 0..{axis.size - 1}",
            chip=chip,
            fix="index participants within the axis size",
        )
    for name, seq in (("source", srcs), ("destination", dsts)):
        dup = sorted({i for i in seq if seq.count(i) > 1})
        if dup:
            raise LayoutError(
                f"perm {pairs} is not a permutation: {name}(s) {dup} appear more than once",
                rule="each participant sends at most once and receives at most once",
                chip=chip,
                fix="give every participant at most one destination and one source",
            )
    return pairs


@dataclasses.dataclass
class Plan:
    """What a block needs (scratch), whom it talks to (peers) and what it does (run)."""

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
                    chip=_chip_name(self.axis),
                    fix="allocate scratch_for(...).types with the kernel and pass "
                    "scratch=spec.bind(refs), or keep handshake=True",
                )
            self.spec.run_scoped(body)
            return
        missing = set(self.spec.names) - set(scratch)
        if missing:
            raise CoremeshError(
                f"the scratch given lacks {sorted(missing)}",
                rule="a block's scratch is exactly what scratch_for(...) returns for the same "
                "collective, axis, shape, dtype, algorithm and sync",
                chip=_chip_name(self.axis),
                fix="allocate scratch_for(...) with the same arguments as the block",
            )
        body(scratch)


def _ring_peers(axis: Axis) -> Callable[[], tuple[list[Any], None]]:
    def peers() -> tuple[list[Any], None]:
        r = axis.rank()
        return [axis.shift(r, 1), axis.shift(r, -1)], None

    return peers


def _hier_peers(axis: Axis) -> Callable[[], tuple[list[Any], None]]:
    return lambda: (hierarchical.peers(axis), None)


def _local_sem() -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    return ScratchSpec((("local", pltpu.SemaphoreType.DMA),))


def _copy(src: Any, dst: Any, sem: Any) -> None:
    from jax.experimental.pallas import tpu as pltpu

    copy = pltpu.make_async_copy(src, dst, sem)
    copy.start()
    copy.wait()


def _device_routes(axis: Axis, algorithm: str, chunk: Sequence[int], dtype: Any) -> list[bi.Route]:
    if algorithm == "hierarchical":
        return bi.routes("bidirectional", chunk, dtype, axis.chip, strict=False)
    return bi.routes(algorithm, chunk, dtype, axis.chip)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- plans


def plan_all_gather(
    axis: Axis,
    chunk: Sequence[int],
    dtype: Any,
    algorithm: str = "auto",
    sync_mode: str = "per_step",
) -> Plan:
    """All-gather: ``dst[k]`` gets participant ``k``'s ``src``."""
    algo = resolve_algorithm("all_gather", axis, algorithm, chunk, dtype)
    mode = check_sync(sync_mode, axis)
    route_list = _device_routes(axis, algo, chunk, dtype)
    if algo == "hierarchical":
        spec = hierarchical.gather_scratch(axis, route_list, mode)
        peers = _hier_peers(axis)
    else:
        spec = bi.gather_scratch(axis.size, route_list, mode)
        peers = _ring_peers(axis)
    spec = spec + _local_sem()

    def run(scr: Scratch) -> None:
        src, dst = scr["@src"], scr["@dst"]
        _copy(src, dst.at[axis.rank()], scr["local"])
        if axis.size == 1:
            return
        if algo == "hierarchical":
            hierarchical.gather(axis, route_list, dst, mode, scr)
        else:
            bi.gather(axis, route_list, lambda k: dst.at[k], mode, scr)

    return Plan(axis, algo, spec, peers, run)


def plan_reduce_scatter(
    axis: Axis,
    chunk: Sequence[int],
    dtype: Any,
    op: str = "sum",
    algorithm: str = "auto",
    sync_mode: str = "per_step",
    *,
    src_in_vmem: bool = True,
) -> Plan:
    """Reduce-scatter: ``dst`` gets the reduction over participants of their ``src[rank]``."""
    _check_op(op, axis)
    algo = resolve_algorithm("reduce_scatter", axis, algorithm, chunk, dtype)
    mode = check_sync(sync_mode, axis)
    route_list = _device_routes(axis, algo, chunk, dtype)
    if algo == "hierarchical":
        spec = hierarchical.scatter_scratch(
            axis, route_list, chunk, dtype, mode, src_in_vmem=src_in_vmem
        )
        peers = _hier_peers(axis)
    else:
        spec = bi.scatter_scratch(
            axis.size, route_list, chunk, dtype, mode, src_in_vmem=src_in_vmem
        )
        peers = _ring_peers(axis)
    spec = spec + _local_sem()

    def run(scr: Scratch) -> None:
        src, dst = scr["@src"], scr["@dst"]
        if axis.size == 1:
            _copy(src.at[0], dst, scr["local"])
        elif algo == "hierarchical":
            hierarchical.scatter(axis, route_list, src, dst, op, mode, scr, local=scr["local"])
        else:
            bi.scatter(axis, route_list, lambda k: src.at[k], dst, op, mode, scr)

    return Plan(axis, algo, spec, peers, run)


def plan_all_reduce(
    axis: Axis,
    chunk: Sequence[int],
    dtype: Any,
    op: str = "sum",
    algorithm: str = "auto",
    sync_mode: str = "per_step",
    *,
    src_in_vmem: bool = True,
) -> Plan:
    """All-reduce as reduce-scatter into ``dst[rank]`` then all-gather of ``dst``."""
    rs = plan_reduce_scatter(axis, chunk, dtype, op, algorithm, sync_mode, src_in_vmem=src_in_vmem)
    ag = plan_all_gather(axis, chunk, dtype, rs.algorithm, sync_mode)
    spec = rs.spec.prefixed("rs.") + ag.spec.prefixed("ag.")

    def run(scr: Scratch) -> None:
        src, dst = scr["@src"], scr["@dst"]
        if axis.size == 1:
            _copy(src, dst, scr["rs.local"])
            return
        rs.run(_with(scr.sub("rs."), src, dst.at[axis.rank()]))
        gather = scr.sub("ag.")
        if rs.algorithm == "hierarchical":
            hierarchical.gather(
                axis,
                _device_routes(axis, "hierarchical", chunk, dtype),
                dst,
                check_sync(sync_mode, axis),
                gather,
            )
        else:
            bi.gather(
                axis,
                _device_routes(axis, rs.algorithm, chunk, dtype),
                lambda k: dst.at[k],
                check_sync(sync_mode, axis),
                gather,
            )

    return Plan(axis, rs.algorithm, spec, rs.peers, run)


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


def _check_op(op: str, axis: Axis) -> None:
    if op not in OPS:
        raise CoremeshError(
            f"unknown reduction {op!r}",
            rule="collectives reduce with 'sum', 'max' or 'min'",
            chip=_chip_name(axis),
            fix="pass op='sum', 'max' or 'min'",
        )


# ------------------------------------------------------------------------- public blocks


def scratch_for(
    collective: Collective | str,
    axis: AxisName | Axis,
    chunk: Sequence[int],
    dtype: Any,
    *,
    op: Op = "sum",
    algorithm: Algorithm = "auto",
    sync: sync.Sync = "per_step",
    perm: Sequence[tuple[int, int]] = (),
    src_in_vmem: bool = True,
    dst_in_vmem: bool = True,
    core_axis: str = CORE_AXIS,
) -> ScratchSpec:
    """The scratch one block needs, to allocate with the kernel (``spec.types``).

    ``chunk`` is one participant's chunk (``src.shape`` for all_gather and ppermute,
    ``dst.shape`` for reduce_scatter, ``src.shape[1:]`` for all_reduce and all_to_all).
    Call it where the axis sizes are known: inside the kernel body, or where the kernel is
    built (inside ``shard_map`` for device axes) with ``axis`` resolved by
    ``coremesh.collectives.axes.resolve``.
    """
    ax = axis if isinstance(axis, Axis) else in_kernel(axis, core_axis=core_axis)
    return make_plan(
        collective, ax, tuple(chunk), dtype, op, algorithm, sync, perm, src_in_vmem, dst_in_vmem
    ).spec


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
    """The plan of one collective over ``ax`` (what the blocks and the array kernels run)."""
    if collective == "all_gather":
        return plan_all_gather(ax, chunk, dtype, algorithm, sync_mode)
    if collective == "reduce_scatter":
        return plan_reduce_scatter(
            ax, chunk, dtype, op, algorithm, sync_mode, src_in_vmem=src_in_vmem
        )
    if collective == "all_reduce":
        return plan_all_reduce(ax, chunk, dtype, op, algorithm, sync_mode, src_in_vmem=src_in_vmem)
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
        chip=_chip_name(ax),
        fix="name one of those",
    )


def _check_layout(
    collective: str,
    ax: Axis,
    src: Any,
    dst: Any,
    want_src: tuple[int, ...],
    want_dst: tuple[int, ...],
) -> None:
    if tuple(src.shape) != want_src or tuple(dst.shape) != want_dst or src.dtype != dst.dtype:
        raise LayoutError(
            f"{collective} over the {ax.describe()}: src is {src.dtype}{list(src.shape)}, dst "
            f"is {dst.dtype}{list(dst.shape)}",
            rule=_LAYOUT_RULES[collective].format(n=ax.size),
            chip=_chip_name(ax),
            fix=f"make src {src.dtype}{list(want_src)} and dst {src.dtype}{list(want_dst)}",
        )


def _check_receiver(collective: str, ax: Axis, ref: Any) -> None:
    if ax.spans_cores and ax.size > 1 and not in_vmem(ref):
        raise LayoutError(
            f"{collective} over the {ax.describe()} writes into a ref in "
            f"{memory_space(ref) or 'HBM'}",
            rule="the cores of a device share HBM, so a ref written by other cores' DMAs must "
            "be per-core memory (VMEM) to be the same buffer on every participant",
            chip=_chip_name(ax),
            fix="stage the data in a VMEM scratch ref and copy it to HBM after the collective",
        )


_LAYOUT_RULES = {
    "all_gather": "all_gather takes src (*c) and dst (n, *c) with n = {n} participants",
    "reduce_scatter": "reduce_scatter takes src (n, *c) and dst (*c) with n = {n}",
    "all_reduce": "all_reduce takes src and dst of the same shape (n, *c) with n = {n}",
    "all_to_all": "all_to_all takes src and dst of the same shape (n, *c) with n = {n}",
    "ppermute": "ppermute takes src and dst of one shape and dtype",
}


def _block(
    collective: str,
    src: Any,
    dst: Any,
    axis: AxisName | Axis,
    core_axis: str,
    *,
    op: str = "sum",
    algorithm: str = "auto",
    sync_mode: str = "per_step",
    perm: Sequence[tuple[int, int]] = (),
    scratch: Scratch | None,
    handshake: bool,
) -> None:
    ax = axis if isinstance(axis, Axis) else in_kernel(axis, core_axis=core_axis)
    n = ax.size
    if collective == "all_gather":
        chunk = tuple(src.shape)
        _check_layout(collective, ax, src, dst, chunk, (n, *chunk))
    elif collective == "reduce_scatter":
        chunk = tuple(dst.shape)
        _check_layout(collective, ax, src, dst, (n, *chunk), chunk)
    elif collective == "ppermute":
        chunk = tuple(src.shape)
        _check_layout(collective, ax, src, dst, chunk, chunk)
    else:
        chunk = tuple(src.shape[1:])
        _check_layout(collective, ax, src, dst, (n, *chunk), (n, *chunk))
    if collective != "reduce_scatter":
        _check_receiver(collective, ax, dst)
    plan = make_plan(
        collective,
        ax,
        chunk,
        src.dtype,
        op,
        algorithm,
        sync_mode,
        perm,
        in_vmem(src),
        in_vmem(dst),
    )
    plan.on(src, dst).execute(scratch, handshake=handshake)


def barrier(
    axis: AxisName | Axis = "device",
    *,
    core_axis: str = CORE_AXIS,
) -> None:
    """Wait until every participant of ``axis`` has reached this point (barrier semaphore)."""
    ax = axis if isinstance(axis, Axis) else in_kernel(axis, core_axis=core_axis)
    plan_barrier(ax).execute(None, handshake=True)


def ppermute(
    src: Any,
    dst: Any,
    perm: Sequence[tuple[int, int]],
    *,
    axis: AxisName | Axis = "device",
    scratch: Scratch | None = None,
    handshake: bool = True,
    core_axis: str = CORE_AXIS,
) -> None:
    """``dst`` of participant ``d`` gets ``src`` of ``s`` for every ``(s, d)`` in ``perm``;
    participants that receive nothing get zeros (``jax.lax.ppermute``)."""
    _block("ppermute", src, dst, axis, core_axis, perm=perm, scratch=scratch, handshake=handshake)


def all_gather(
    src: Any,
    dst: Any,
    *,
    axis: AxisName | Axis = "device",
    algorithm: Algorithm = "auto",
    sync: sync.Sync = "per_step",
    scratch: Scratch | None = None,
    handshake: bool = True,
    core_axis: str = CORE_AXIS,
) -> None:
    """``dst[k]`` gets ``src`` of participant ``k``."""
    _block(
        "all_gather",
        src,
        dst,
        axis,
        core_axis,
        algorithm=algorithm,
        sync_mode=sync,
        scratch=scratch,
        handshake=handshake,
    )


def reduce_scatter(
    src: Any,
    dst: Any,
    *,
    axis: AxisName | Axis = "device",
    op: Op = "sum",
    algorithm: Algorithm = "auto",
    sync: sync.Sync = "per_step",
    scratch: Scratch | None = None,
    handshake: bool = True,
    core_axis: str = CORE_AXIS,
) -> None:
    """``dst`` gets ``op`` over participants ``i`` of ``src[rank]`` of ``i``."""
    _block(
        "reduce_scatter",
        src,
        dst,
        axis,
        core_axis,
        op=op,
        algorithm=algorithm,
        sync_mode=sync,
        scratch=scratch,
        handshake=handshake,
    )


def all_reduce(
    src: Any,
    dst: Any,
    *,
    axis: AxisName | Axis = "device",
    op: Op = "sum",
    algorithm: Algorithm = "auto",
    sync: sync.Sync = "per_step",
    scratch: Scratch | None = None,
    handshake: bool = True,
    core_axis: str = CORE_AXIS,
) -> None:
    """``dst`` gets ``op`` over participants of ``src`` (chunked ``(n, *c)``; no aliasing)."""
    _block(
        "all_reduce",
        src,
        dst,
        axis,
        core_axis,
        op=op,
        algorithm=algorithm,
        sync_mode=sync,
        scratch=scratch,
        handshake=handshake,
    )


def all_to_all(
    src: Any,
    dst: Any,
    *,
    axis: AxisName | Axis = "device",
    scratch: Scratch | None = None,
    handshake: bool = True,
    core_axis: str = CORE_AXIS,
) -> None:
    """``dst[i]`` gets ``src[rank]`` of participant ``i``."""
    _block("all_to_all", src, dst, axis, core_axis, scratch=scratch, handshake=handshake)
