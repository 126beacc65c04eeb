"""The exchange between the participants of one kernel: handshake, then copies all in flight.

A remote DMA or signal may only target a peer that has entered the kernel (and allocated the
buffer it writes into), so an exchange opens with a handshake on the kernel's barrier semaphore
(its collective id): signal every peer once, wait for as many signals. Then every copy is
started before any is waited for, and a participant waits for all its receives before all its
sends: it leaves only once every peer's data has landed in its memory and its own has landed in
theirs, and its source buffers stay untouched until every send is done. ``reduce`` combines the
cores' partials this way, and the collectives open and run their direct exchanges with it.

Peers are ``device_id`` values, as ``pl.semaphore_signal`` and ``pltpu.make_async_remote_copy``
take them (e.g. ``{"core": other}`` for another core of the same device).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def handshake(peers: Sequence[Any], valid: Sequence[Any] | None = None) -> None:
    """Signal the barrier semaphore of each peer once, then wait for as many signals.

    ``valid`` (traced booleans, one per peer) skips the peers this participant does not exchange
    with; the relation must be symmetric (``p`` is my valid peer iff I am ``p``'s), so every
    wait is matched exactly.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if not peers:
        return
    barrier = pltpu.get_barrier_semaphore()
    if valid is None:
        for p in peers:
            pl.semaphore_signal(barrier, 1, device_id=p)
        pl.semaphore_wait(barrier, len(peers))
        return
    import jax.numpy as jnp

    count = jnp.int32(0)
    for p, ok in zip(peers, valid, strict=True):

        @pl.when(ok)
        def _signal(p: Any = p) -> None:
            pl.semaphore_signal(barrier, 1, device_id=p)

        count = count + ok.astype(jnp.int32)

    @pl.when(count > 0)
    def _wait() -> None:
        pl.semaphore_wait(barrier, count)


def start(copies: Sequence[Any]) -> None:
    """Start every copy (``pltpu.make_async_remote_copy`` descriptors), in order."""
    for copy in copies:
        copy.start()


def finish(copies: Sequence[Any]) -> None:
    """Wait for every copy's receive, then for every copy's send."""
    for copy in copies:
        copy.wait_recv()
    for copy in copies:
        copy.wait_send()
