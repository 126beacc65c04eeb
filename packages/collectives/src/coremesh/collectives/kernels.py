"""The kernels behind the array functions: one per (collective, axis kind), built per shape.

* **Device axis**: operands stay in HBM. Every core of a device takes a share of each chunk
  (cut along the chunk's first dim, see :mod:`coremesh.collectives.layout`) and runs the
  schedule on it with the same-numbered core of the other devices, so all DMA engines work.
  All-gather, all-to-all and ppermute go HBM to remote HBM with nothing staged; reductions
  add in VMEM and send partials VMEM to VMEM.
* **Core and (device, core) axes**: the cores of a device share HBM, so whatever other cores
  write into is staged in VMEM (symmetric per core) and stored to HBM at the end; the
  plans of :mod:`coremesh.collectives.plans` (those of the in-kernel collectives) do the work.

Every kernel carries a ``CostEstimate`` and a collective id from the process allocator.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from coremesh.collectives import bidirectional as bi
from coremesh.collectives import direct, plans, sync, validate
from coremesh.collectives.axes import Axis
from coremesh.collectives.cost import estimate, nbytes
from coremesh.collectives.layout import Part, split
from coremesh.collectives.scratch import Scratch, ScratchSpec


@dataclasses.dataclass(frozen=True)
class Request:
    """One collective over one axis for one canonical shape (``src``/``dst`` per participant)."""

    collective: str
    axis: Axis
    chunk: tuple[int, ...]
    dtype: Any
    algorithm: str = "auto"
    sync: str = "per_step"
    op: str = "sum"
    perm: tuple[tuple[int, int], ...] = ()

    @property
    def n(self) -> int:
        return self.axis.size

    @property
    def src_shape(self) -> tuple[int, ...]:
        if self.collective in ("all_gather", "ppermute", "barrier"):
            return self.chunk
        return (self.n, *self.chunk)

    @property
    def dst_shape(self) -> tuple[int, ...]:
        if self.collective in ("reduce_scatter", "ppermute", "barrier"):
            return self.chunk
        return (self.n, *self.chunk)

    @property
    def name(self) -> str:
        axis = "x".join(self.axis.name) if isinstance(self.axis.name, tuple) else self.axis.name
        extra = f"_{self.op}" if self.collective in ("reduce_scatter", "all_reduce") else ""
        return f"coremesh_{self.collective}{extra}_{axis}_{self.resolved_algorithm}"

    @property
    def id_owner(self) -> str:
        """Who holds this kernel's collective id: its communication pattern (see ``sync``)."""
        axis = "x".join(self.axis.name) if isinstance(self.axis.name, tuple) else self.axis.name
        if self.collective == "ppermute":
            return f"coremesh.collectives[{axis}] ppermute {list(self.perm)}"
        return f"coremesh.collectives[{axis}]"

    @property
    def resolved_algorithm(self) -> str:
        chunk = self.chunk
        if self.axis.kind == "device" and self.collective in validate.RING_OPS:
            # Each core runs the rings on its share: decide on the first core's share.
            share = split(chunk, self.axis.cores, self.dtype, self.axis.chip)[0]
            chunk = share.shape(chunk)
        return validate.resolve_algorithm(
            self.collective, self.axis, self.algorithm, chunk, self.dtype
        )


def build(req: Request, *, collective_id: int) -> Callable[[Any], Any]:
    """The per-device function running ``req``: ``src`` (leading core dim over cores) -> ``dst``."""
    import jax

    from coremesh.tensorcore import kernel

    if req.axis.kind == "device":
        body, spec, stage = _device_body(req)
    else:
        body, spec, stage = _staged_body(req)
    cores = req.axis.cores
    lead = () if req.axis.kind == "device" else (cores,)
    out_type = jax.ShapeDtypeStruct((*lead, *req.dst_shape), req.dtype)
    uses_barrier = req.n > 1
    cost = _cost(req)

    def run(src: Any) -> Any:
        k = kernel(
            body,
            out_type=out_type,
            scratch=[*stage, *spec.types],
            name=req.name,
            collective_id=collective_id if uses_barrier else None,
            cost_estimate=cost,
        )
        return k(src)

    return run


def _cost(req: Request) -> Any:
    elems = 1
    for d in req.chunk:
        elems *= d
    chunk_bytes = nbytes(req.chunk, req.dtype)
    working = req.axis.cores
    hbm = (nbytes(req.src_shape, req.dtype) + nbytes(req.dst_shape, req.dtype)) * (
        1 if req.axis.kind == "device" else working
    )
    per_participant = chunk_bytes // working if req.axis.kind == "device" else chunk_bytes
    return estimate(
        req.collective,
        chunk_bytes=per_participant,
        chunk_elems=elems // working if req.axis.kind == "device" else elems,
        n=req.n,
        cores_working=working,
        hbm_bytes=hbm,
        algorithm=req.resolved_algorithm,
        reduces=req.collective in ("reduce_scatter", "all_reduce"),
        devices=req.axis.num_devices,
        cores=req.axis.cores,
        axis_kind=req.axis.kind,
    )


# ------------------------------------------------------------------------- device axis


@dataclasses.dataclass(frozen=True)
class _Share:
    """What one core of a device does: its part of every chunk, and the routes over it."""

    part: Part
    routes: list[bi.Route]


def _shares(req: Request) -> list[_Share | None]:
    ax, chip = req.axis, req.axis.chip
    parts = split(req.chunk, ax.cores, req.dtype, chip)
    algo = req.resolved_algorithm
    out: list[_Share | None] = []
    for c in range(ax.cores):
        if c >= len(parts):
            out.append(None)
            continue
        if req.collective in validate.RING_OPS:
            strict = req.algorithm == "bidirectional"
            rts = bi.routes(algo, req.chunk, req.dtype, chip, within=parts[c], strict=strict)  # type: ignore[arg-type]
        else:
            rts = [(1, parts[c])]
        out.append(_Share(parts[c], rts))
    return out


def _share_spec(req: Request, share: _Share) -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    n, mode = req.n, validate.check_sync(req.sync, req.axis)
    c = req.collective
    local = plans.local_sem()
    if c == "all_gather":
        return bi.gather_scratch(n, share.routes, mode) + local
    if c == "reduce_scatter":
        return bi.scatter_scratch(n, share.routes, req.chunk, req.dtype, mode, src_in_vmem=False)
    if c == "all_reduce":
        rs = bi.scatter_scratch(n, share.routes, req.chunk, req.dtype, mode, src_in_vmem=False)
        return rs.prefixed("rs.") + bi.gather_scratch(n, share.routes, mode).prefixed("ag.")
    if c == "all_to_all":
        return direct.all_to_all_scratch(n)
    if c == "ppermute":
        spec = direct.ppermute_scratch()
        if len({d for _, d in req.perm}) < n:
            spec = spec + ScratchSpec(
                (("zero", pltpu.VMEM(share.part.shape(req.chunk), req.dtype)),)
            )
        return spec
    return local + direct.barrier_scratch()


def _peers(req: Request) -> Callable[[], tuple[list[Any], list[Any] | None]]:
    ax = req.axis
    if req.collective in validate.RING_OPS:
        return plans.ring_peers(ax)
    if req.collective == "ppermute":
        return lambda: direct.ppermute_peers(ax, req.perm)
    return lambda: (direct.all_to_all_peers(ax), None)


def _device_body(req: Request) -> tuple[Callable[..., None], ScratchSpec, list[Any]]:
    import jax
    from jax.experimental import pallas as pl

    ax = req.axis
    shares = _shares(req)
    spec = ScratchSpec()
    for c, share in enumerate(shares):
        if share is not None:
            spec = spec + _share_spec(req, share).prefixed(f"c{c}.")
    mode = validate.check_sync(req.sync, ax)
    peers = _peers(req)

    def body(src: Any, dst: Any, *refs: Any) -> None:
        scr = spec.bind(refs)
        core = jax.lax.axis_index(ax.core_axis)

        def on_core(c: int, fn: Callable[[], None]) -> None:
            if ax.cores == 1:
                fn()
            else:
                pl.when(core == c)(fn)

        rank = ax.rank()
        if req.collective == "all_gather":
            for c, share in enumerate(shares):
                if share is not None:
                    mine, into = share.part.of(src), share.part.of(dst.at[rank])
                    on_core(c, functools.partial(plans.local_copy, mine, into, scr[f"c{c}.local"]))
        for c, share in enumerate(shares):
            if share is not None:  # idle cores (no share on any device) stay out entirely
                on_core(c, lambda: sync.handshake(ax, *peers()))
        for c, share in enumerate(shares):
            if share is None:
                continue
            s = scr.sub(f"c{c}.")
            on_core(c, _device_step(req, share, src, dst, s, mode))

    return body, spec, []


def _device_step(
    req: Request, share: _Share, src: Any, dst: Any, scr: Scratch, mode: sync.Sync
) -> Callable[[], None]:
    ax, part = req.axis, share.part

    def run() -> None:
        c = req.collective
        if c == "all_gather":
            bi.gather(ax, share.routes, lambda k: dst.at[k], mode, scr)
        elif c == "reduce_scatter":
            bi.scatter(ax, share.routes, lambda k: src.at[k], dst, req.op, mode, scr)
        elif c == "all_reduce":
            rank = ax.rank()
            bi.scatter(
                ax, share.routes, lambda k: src.at[k], dst.at[rank], req.op, mode, scr.sub("rs.")
            )
            bi.gather(ax, share.routes, lambda k: dst.at[k], mode, scr.sub("ag."))
        elif c == "all_to_all":
            direct.all_to_all(ax, lambda k: part.of(src.at[k]), lambda k: part.of(dst.at[k]), scr)
        elif c == "ppermute":
            zero = scr.get("zero")
            direct.ppermute(ax, part.of(src), part.of(dst), req.perm, scr, zero=zero)
        else:  # barrier: the handshake was the arrival; depart, then pass the data through
            direct.depart(ax, scr)
            plans.local_copy(part.of(src), part.of(dst), scr["local"])

    return run


# --------------------------------------------------------------------- core axes (staged)


def _staged_body(req: Request) -> tuple[Callable[..., None], ScratchSpec, list[Any]]:
    """Core or (device, core) axis: per-core operands in HBM, receivers staged in VMEM."""
    import jax
    from jax.experimental.pallas import tpu as pltpu

    ax = req.axis
    plan = plans.make_plan(
        req.collective,
        ax,
        req.chunk,
        req.dtype,
        req.op,
        req.algorithm,
        req.sync,
        req.perm,
        False,
        True,
    )
    staged = req.collective in ("all_gather", "all_reduce", "all_to_all", "ppermute")
    stage = [pltpu.SemaphoreType.DMA]
    if staged:
        stage.append(pltpu.VMEM(req.dst_shape, req.dtype))
    spec = plan.spec

    def body(src: Any, dst: Any, *refs: Any) -> None:
        core = jax.lax.axis_index(ax.core_axis)
        mine, out = src.at[core], dst.at[core]
        sem, rest = refs[0], refs[1:]
        if staged:
            buf, rest = rest[0], rest[1:]
        target = buf if staged else out
        scr = spec.bind(rest)
        if req.collective == "barrier":
            plan.execute(scr, handshake=True)
            plans.local_copy(mine, out, sem)
            return
        plan.on(mine, target).execute(scr, handshake=True)
        if staged:
            plans.local_copy(buf, out, sem)

    return body, spec, stage
