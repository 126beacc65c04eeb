"""Synchronisation between participants: the entry handshake and slot credits.

* **Handshake.** A remote DMA or signal may only target a peer that has entered the kernel
  (and allocated the scratch it writes into). Each collective opens by signalling the kernel's
  barrier semaphore (its collective id) on every peer it exchanges with and waiting for the same
  number of signals back. The peer relation is symmetric, so every wait is matched exactly.
  The barrier semaphore is counted, not phased: JAX's own guidance is one handshake per kernel.
  A kernel body that runs several collectives handshakes in the first and passes
  ``handshake=False`` to the others, with scratch allocated for the whole kernel.
* **Collective ids.** The barrier semaphore of a kernel is its collective id; kernels that
  share an id share the semaphore. That is safe when a participant cannot finish one kernel
  while a peer is still in the handshake of the previous one: then no signal of the next kernel
  can be counted as one of this kernel's. All-gather, reduce-scatter, all-reduce and
  all-to-all have that property over an axis (every participant needs data every other one
  sends after its handshake); the barrier gets it from a second (departure) phase and
  ppermute from a receipt the receiver sends back. So the array functions take one id per
  axis, plus one per permutation for ppermute (whose peers differ), from the process
  allocator; JAX's guide states the same rule (kernels with the same communication pattern
  may share an id) and a TPU has only a few dozen barrier semaphores.
* **Credits.** With ``sync="credit"`` a ring keeps two receive slots and two DMA semaphores
  instead of one per step. A sender may reuse slot ``s % 2`` at step ``s`` only once its
  receiver has finished step ``s - 2``; the receiver says so by signalling a REGULAR semaphore
  on the sender. Without that wait, a sender running ahead lands two DMAs on one semaphore and
  the receiver forwards or adds a chunk that has not arrived (the simulator's ``on_wait`` DMA
  mode and race detector catch exactly this).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from coremesh.collectives.axes import Axis

Sync = Literal["per_step", "credit"]
SYNC_MODES: tuple[Sync, ...] = ("per_step", "credit")


def handshake(axis: Axis, peers: Sequence[Any], valid: Sequence[Any] | None = None) -> None:
    """Signal the barrier semaphore of each peer rank, then wait for as many signals.

    ``valid`` (traced booleans, one per peer) skips peers this participant does not exchange
    with; the relation must stay symmetric (``p`` is my valid peer iff I am ``p``'s). The
    handshake is the cross-core exchange's (:func:`coremesh.tensorcore.exchange.handshake`),
    on ranks of ``axis``.
    """
    from coremesh.tensorcore import exchange

    exchange.handshake([axis.device_id(p) for p in peers], valid)


def grant(axis: Axis, credit: Any, to_rank: Any) -> None:
    """Give ``to_rank`` one credit: "the slot you wrote two steps ago is free again"."""
    from jax.experimental import pallas as pl

    pl.semaphore_signal(credit, 1, device_id=axis.device_id(to_rank))


def take(credit: Any) -> None:
    """Wait for one credit from the receiver before reusing its slot."""
    from jax.experimental import pallas as pl

    pl.semaphore_wait(credit, 1)
