"""Direct exchanges: each participant sends straight to the peers that need its data.

* ``ppermute``: one DMA from every source to its destination, the permutation known statically.
* ``all_to_all``: chunk ``k`` of participant ``i`` goes to slot ``i`` of participant ``k``; all
  ``n - 1`` DMAs are in flight at once, each with its own semaphore pair (a semaphore per peer).
  Each participant sends ``(n - 1) / n`` of its data, the lower bound.
* ``barrier``: every participant signals every other one on the barrier semaphore.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from coremesh.collectives.axes import Axis
from coremesh.collectives.scratch import Scratch, ScratchSpec


def _lookup(rank: Any, table: Sequence[int]) -> Any:
    """``table[rank]`` for a traced rank and a static table (a shift when the table is one)."""
    import jax
    import jax.numpy as jnp

    n = len(table)
    shift = (table[0] - 0) % n
    if all(t == (i + shift) % n for i, t in enumerate(table)):
        return jax.lax.rem(rank + shift, n) if shift else rank
    out = jnp.int32(table[0])
    for i in range(1, n):
        out = jnp.where(rank == i, jnp.int32(table[i]), out)
    return out


def permutation_tables(perm: Sequence[tuple[int, int]], n: int) -> tuple[list[int], list[int]]:
    """``dest[i]`` and ``source[i]`` for every participant (-1: none)."""
    dest, source = [-1] * n, [-1] * n
    for s, d in perm:
        dest[s], source[d] = d, s
    return dest, source


def ppermute_scratch() -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    return ScratchSpec(
        (
            ("send", pltpu.SemaphoreType.DMA),
            ("recv", pltpu.SemaphoreType.DMA),
            ("done", pltpu.SemaphoreType.REGULAR),
        )
    )


def ppermute_peers(axis: Axis, perm: Sequence[tuple[int, int]]) -> tuple[list[Any], list[Any]]:
    """(peers, valid) for the handshake: my destination and my source, where they exist."""
    dest, source = permutation_tables(perm, axis.size)
    rank = axis.rank()
    d, s = _lookup(rank, dest), _lookup(rank, source)
    return [d, s], [d >= 0, s >= 0]


def ppermute(
    axis: Axis,
    src: Any,
    dst: Any,
    perm: Sequence[tuple[int, int]],
    scratch: Scratch,
    *,
    zero: Any = None,
) -> None:
    """Send ``src`` to ``dst`` of this participant's destination; receive into ``dst``.

    Participants that receive nothing get zeros in ``dst`` (``jax.lax.ppermute``), written from
    ``zero`` (a zero-filled VMEM buffer of ``dst``'s shape) when ``dst`` is not in VMEM.

    A receiver tells its source when the data is in (``done``); a sender leaves only then. So no
    sender can finish, enter the next kernel with the same collective id and signal a receiver
    still in this kernel's handshake (see :mod:`coremesh.collectives.sync`).
    """
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    dest, source = permutation_tables(perm, axis.size)
    rank = axis.rank()
    d, s = _lookup(rank, dest), _lookup(rank, source)
    copy = pltpu.make_async_remote_copy(
        src, dst, scratch["send"], scratch["recv"], device_id=axis.device_id(jnp.maximum(d, 0))
    )
    partial = any(x < 0 for x in source)
    sends_all = all(x >= 0 for x in dest)

    def start() -> None:
        copy.start()

    if sends_all:
        start()
    else:
        pl.when(d >= 0)(start)

    def receive() -> None:
        copy.wait_recv()
        pl.semaphore_signal(scratch["done"], 1, device_id=axis.device_id(s))

    if all(x >= 0 for x in source):
        receive()
    else:
        pl.when(s >= 0)(receive)

    if partial:

        @pl.when(s < 0)
        def _zeros() -> None:
            if zero is None:
                dst[...] = jnp.zeros(dst.shape, dst.dtype)
            else:
                zero[...] = jnp.zeros(zero.shape, zero.dtype)
                fill = pltpu.make_async_copy(zero, dst, scratch["recv"])
                fill.start()
                fill.wait()

    def finish_send() -> None:
        copy.wait_send()
        pl.semaphore_wait(scratch["done"], 1)

    if sends_all:
        finish_send()
    else:
        pl.when(d >= 0)(finish_send)


def all_to_all_scratch(n: int) -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    k = max(1, n - 1)
    return ScratchSpec(
        (
            ("send", pltpu.SemaphoreType.DMA((k,))),
            ("recv", pltpu.SemaphoreType.DMA((k,))),
            ("local", pltpu.SemaphoreType.DMA),
        )
    )


def all_to_all_peers(axis: Axis) -> list[Any]:
    rank = axis.rank()
    return [axis.shift(rank, j) for j in range(1, axis.size)]


def all_to_all(
    axis: Axis, src: Callable[[Any], Any], dst: Callable[[Any], Any], scratch: Scratch
) -> None:
    """``dst(i) <- src(rank)`` of participant ``i``: chunk ``k`` of ``src`` goes to peer ``k``.

    At offset ``j`` this participant sends to ``rank + j`` and receives from ``rank - j``, both on
    semaphore pair ``j - 1``: the two DMAs that meet on a semaphore have the same size.
    """
    from jax.experimental.pallas import tpu as pltpu

    from coremesh.tensorcore import exchange

    n, rank = axis.size, axis.rank()
    local = pltpu.make_async_copy(src(rank), dst(rank), scratch["local"])
    local.start()
    copies = []
    for j in range(1, n):
        to = axis.shift(rank, j)
        copies.append(
            pltpu.make_async_remote_copy(
                src(to),
                dst(rank),
                scratch["send"].at[j - 1],
                scratch["recv"].at[j - 1],
                device_id=axis.device_id(to),
            )
        )
    exchange.start(copies)
    local.wait()
    exchange.finish(copies)


def barrier_peers(axis: Axis) -> list[Any]:
    return all_to_all_peers(axis)


def barrier_scratch() -> ScratchSpec:
    from jax.experimental.pallas import tpu as pltpu

    return ScratchSpec((("depart", pltpu.SemaphoreType.REGULAR),))


def depart(axis: Axis, scratch: Scratch) -> None:
    """The barrier's second phase, after the handshake (its arrival phase).

    Every participant tells every other it has passed the arrival, and waits to hear the same.
    A participant thus leaves only once all have arrived, so none can reach the next barrier on
    the same collective id while another still counts this one's arrivals.
    """
    from jax.experimental import pallas as pl

    n = axis.size
    if n == 1:
        return
    rank = axis.rank()
    for j in range(1, n):
        pl.semaphore_signal(scratch["depart"], 1, device_id=axis.device_id(axis.shift(rank, j)))
    pl.semaphore_wait(scratch["depart"], n - 1)
