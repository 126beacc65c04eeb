"""Two-stage collectives over ``(device, core)``: the cheap core links first, then ICI.

Over the hierarchical axis (participant ``g = device * C + core``) a flat ring alternates core
and chip links and leaves all ICI traffic to one core per device. The two-stage schedule instead
runs one device ring *per core* (both cores' DMA engines drive ICI, each carrying its own
chunks) and an exchange between the cores of a device, VMEM to VMEM (no pass through HBM):

* all-gather: device rings gather chunks ``(*, core)``, then the cores swap them;
* reduce-scatter: the cores first reduce what each will own (chunks ``(*, core)``), so ICI
  carries data already summed over the device, then a device ring finishes the reduction;
* all-reduce: the reduce-scatter then the all-gather, one handshake for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from coremesh.collectives import bidirectional as bi
from coremesh.collectives.axes import Axis
from coremesh.collectives.layout import combiner, in_vmem
from coremesh.collectives.scratch import Scratch, ScratchSpec
from coremesh.collectives.sync import Sync


def stages(axis: Axis) -> tuple[Axis, Axis]:
    """The device axis (one participant per device, per core) and the core axis of ``axis``."""
    devices = dataclasses.replace(axis, kind="device")
    cores = dataclasses.replace(axis, kind="core", device_axis=None, num_devices=1)
    return devices, cores


def peers(axis: Axis) -> list[Any]:
    """Global ranks of this core's device-ring neighbours and of the other cores of its device."""
    devices, cores = stages(axis)
    C, d, c = axis.cores, devices.rank(), cores.rank()
    out: list[Any] = []
    if devices.size > 1:
        out += [devices.shift(d, 1) * C + c, devices.shift(d, -1) * C + c]
    out += [d * C + cores.shift(c, j) for j in range(1, cores.size)]
    return out


# ----------------------------------------------------------------------------- all-gather


def gather_scratch(axis: Axis, route_list: Sequence[bi.Route], sync: Sync) -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    devices, cores = stages(axis)
    spec = bi.gather_scratch(devices.size, route_list, sync).prefixed("dev.")
    if cores.size > 1:
        shape = (cores.size - 1, devices.size)
        spec = spec + ScratchSpec(
            (
                ("core.send", pltpu.SemaphoreType.DMA(shape)),
                ("core.recv", pltpu.SemaphoreType.DMA(shape)),
            )
        )
    return spec


def gather(
    axis: Axis, route_list: Sequence[bi.Route], dst: Any, sync: Sync, scratch: Scratch
) -> None:
    """All-gather over ``(device, core)``; ``dst[g]`` must already hold this core's chunk."""
    devices, cores = stages(axis)
    C, D = cores.size, devices.size
    core = cores.rank()
    if D > 1:
        bi.gather(devices, route_list, lambda k: dst.at[k * C + core], sync, scratch.sub("dev."))
    if C > 1:
        _swap(cores, [dst.at[k * C + core] for k in range(D)], scratch.sub("core."))


def _swap(cores: Axis, mine: Sequence[Any], scratch: Scratch) -> None:
    """Send this core's chunks to every other core of the device (at the same addresses)."""
    from jax.experimental.pallas import tpu as pltpu

    from coremesh.tensorcore import exchange

    c = cores.rank()
    copies = [
        pltpu.make_async_remote_copy(
            ref,
            ref,
            scratch["send"].at[j - 1, k],
            scratch["recv"].at[j - 1, k],
            device_id=cores.device_id(cores.shift(c, j)),
        )
        for j in range(1, cores.size)
        for k, ref in enumerate(mine)
    ]
    exchange.start(copies)
    exchange.finish(copies)


# ------------------------------------------------------------------------- reduce-scatter


def scatter_scratch(
    axis: Axis,
    route_list: Sequence[bi.Route],
    chunk: Sequence[int],
    dtype: Any,
    sync: Sync,
    *,
    src_in_vmem: bool,
) -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    devices, cores = stages(axis)
    C, D = cores.size, devices.size
    shape = tuple(chunk)
    spec = ScratchSpec()
    if C > 1:
        spec = ScratchSpec(
            (
                ("core.inbox", pltpu.VMEM((C - 1, D, *shape), dtype)),
                ("core.partial", pltpu.VMEM((D, *shape), dtype)),
                ("core.send", pltpu.SemaphoreType.DMA((C - 1, D))),
                ("core.recv", pltpu.SemaphoreType.DMA((C - 1, D))),
            )
        )
    if D > 1:
        spec = spec + bi.scatter_scratch(
            D, route_list, chunk, dtype, sync, src_in_vmem=C > 1 or src_in_vmem
        ).prefixed("dev.")
    return spec


def scatter(
    axis: Axis,
    route_list: Sequence[bi.Route],
    src: Any,
    out: Any,
    op: str,
    sync: Sync,
    scratch: Scratch,
    *,
    local: Any,
) -> None:
    """Reduce-scatter over ``(device, core)``: ``out`` = reduction of chunk ``g`` of ``src``.

    ``local`` is a DMA semaphore for copies that stay on this core.
    """
    from jax.experimental.pallas import tpu as pltpu

    devices, cores = stages(axis)
    C, D = cores.size, devices.size
    core = cores.rank()

    def view(k: Any) -> Any:
        return src.at[k * C + core]

    if C > 1:
        view = _reduce_over_cores(cores, D, src, op, scratch.sub("core."), local)
    if D > 1:
        bi.scatter(devices, route_list, view, out, op, sync, scratch.sub("dev."))
        return
    own = view(0)
    if in_vmem(own) and in_vmem(out):
        out[...] = own[...]
    else:
        copy = pltpu.make_async_copy(own, out, local)
        copy.start()
        copy.wait()


def _reduce_over_cores(cores: Axis, D: int, src: Any, op: str, scratch: Scratch, local: Any) -> Any:
    """Each core ends with ``partial[k]``: chunk ``k * C + core`` reduced over its device's
    cores."""
    from jax.experimental.pallas import tpu as pltpu

    C, c = cores.size, cores.rank()
    partial, inbox = scratch["partial"], scratch["inbox"]
    copies = []
    for j in range(1, C):
        to = cores.shift(c, j)
        for k in range(D):
            copy = pltpu.make_async_remote_copy(
                src.at[k * C + to],
                inbox.at[j - 1, k],
                scratch["send"].at[j - 1, k],
                scratch["recv"].at[j - 1, k],
                device_id=cores.device_id(to),
            )
            copy.start()
            copies.append(copy)
    mine = [src.at[k * C + c] for k in range(D)]
    if not in_vmem(src):
        for k in range(D):
            load = pltpu.make_async_copy(mine[k], partial.at[k], local)
            load.start()
            load.wait()
        mine = [partial.at[k] for k in range(D)]
    for copy in copies:
        copy.wait_recv()
    combine = combiner(op, partial.dtype)
    for k in range(D):
        value = mine[k][...]
        for j in range(1, C):
            value = combine(value, inbox[j - 1, k])
        partial[k] = value
    for copy in copies:
        copy.wait_send()
    return lambda k: partial.at[k]
