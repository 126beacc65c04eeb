"""In-kernel collectives on refs, for the body of a ``pl.kernel`` / ``pl.core_map``.

Each one exchanges data between the participants of an axis (``"core"``, a device axis, or
``("device", "core")``), all of which run the same code in SPMD fashion. Refs are *symmetric*:
every participant passes a ref of the same shape at the same address in its own memory (remote
DMAs address the peer's buffer with the sender's ref). Over the core axis and ``(device,
core)`` the cores of a device share HBM, so refs that receive data must be in VMEM there.

Layouts put the participants first: ``all_gather(src (*c) -> dst (n, *c))``,
``reduce_scatter(src (n, *c) -> dst (*c))``, ``all_reduce(src (n, *c) -> dst (n, *c))``,
``all_to_all(src (n, *c) -> dst (n, *c))``, ``ppermute(src (*c) -> dst (*c))``.

Scratch: by default a collective allocates what it needs with ``pl.run_scoped``. To allocate it
with the kernel instead, add ``scratch_for(...).types`` to the kernel's scratch and pass
``scratch=spec.bind(refs)``. The kernel needs a collective id (its barrier semaphore): build it
with ``coremesh.tensorcore.kernel(..., collective_id="auto")`` or
``pltpu.CompilerParams(collective_id=coremesh.core.default_allocator().allocate(name))``. Run one
handshaking collective per kernel; further ones in the same body take ``handshake=False`` and
kernel-level scratch (see :mod:`coremesh.collectives.sync`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coremesh.collectives import axes, sync
from coremesh.collectives.axes import CORE_AXIS, Axis, AxisName
from coremesh.collectives.layout import in_vmem
from coremesh.collectives.plans import make_plan, plan_barrier
from coremesh.collectives.scratch import Scratch, ScratchSpec
from coremesh.collectives.validate import Algorithm, Collective, Op, check_layout, check_receiver


def _axis(axis: AxisName | Axis, core_axis: str) -> Axis:
    return axis if isinstance(axis, Axis) else axes.in_kernel(axis, core_axis=core_axis)


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
    """The scratch one collective needs, to allocate with the kernel (``spec.types``).

    ``chunk`` is one participant's chunk (``src.shape`` for all_gather and ppermute,
    ``dst.shape`` for reduce_scatter, ``src.shape[1:]`` for all_reduce and all_to_all).
    Call it where the axis sizes are known: inside the kernel body, or where the kernel is
    built (inside ``shard_map`` for device axes) with ``axis`` resolved by
    ``coremesh.collectives.axes.resolve``.
    """
    ax = _axis(axis, core_axis)
    return make_plan(
        collective, ax, tuple(chunk), dtype, op, algorithm, sync, perm, src_in_vmem, dst_in_vmem
    ).spec


def _collective(
    collective: str,
    src: Any,
    dst: Any,
    axis: AxisName | Axis,
    core_axis: str,
    scratch: Scratch | None,
    handshake: bool,
    algorithm: str = "auto",
    sync_mode: str = "per_step",
    op: str = "sum",
    perm: Sequence[tuple[int, int]] = (),
) -> None:
    """The one body of every public collective: check the refs, plan, run the plan."""
    ax = _axis(axis, core_axis)
    n = ax.size
    if collective == "all_gather":
        chunk = tuple(src.shape)
        check_layout(collective, ax, src, dst, chunk, (n, *chunk))
    elif collective == "reduce_scatter":
        chunk = tuple(dst.shape)
        check_layout(collective, ax, src, dst, (n, *chunk), chunk)
    elif collective == "ppermute":
        chunk = tuple(src.shape)
        check_layout(collective, ax, src, dst, chunk, chunk)
    else:
        chunk = tuple(src.shape[1:])
        check_layout(collective, ax, src, dst, (n, *chunk), (n, *chunk))
    if collective != "reduce_scatter":
        check_receiver(collective, ax, dst)
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
    plan_barrier(_axis(axis, core_axis)).execute(None, handshake=True)


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
    _collective("ppermute", src, dst, axis, core_axis, scratch, handshake, perm=perm)


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
    _collective("all_gather", src, dst, axis, core_axis, scratch, handshake, algorithm, sync)


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
    _collective(
        "reduce_scatter", src, dst, axis, core_axis, scratch, handshake, algorithm, sync, op
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
    _collective("all_reduce", src, dst, axis, core_axis, scratch, handshake, algorithm, sync, op)


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
    _collective("all_to_all", src, dst, axis, core_axis, scratch, handshake)
