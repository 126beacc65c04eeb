"""``pallas.ops.tpu.paged_attention`` (decode: one query per sequence) and
``ragged_paged_attention`` (prefill and decode mixed), over a KV cache of 16-row pages whose
page tables are shuffled, and sequences that end inside a page."""

from __future__ import annotations

from typing import Any

import numpy as np

from coremesh.testing.shipped.entry import ShippedKernel, single_device

PAGE, HEAD_DIM = 16, 128
#: Queries come scaled by 1/sqrt(head_dim), as attention uses them: the kernels' f32 dots run at
#: the chip's default precision (bf16 passes), whose error grows with the logits' size.
SCALE = np.float32(HEAD_DIM**-0.5)
HI = "highest"


def masked_attention(q: Any, k: Any, v: Any, keep: Any) -> Any:
    """softmax(q k^T where ``keep``) v per head: q [..., h, d], k and v [..., t, h, d]."""
    import jax
    import jax.numpy as jnp

    logits = jnp.einsum("...hd,...thd->...ht", q, k, precision=HI)
    logits = jnp.where(keep, logits, -jnp.inf)
    return jnp.einsum("...ht,...thd->...hd", jax.nn.softmax(logits, axis=-1), v, precision=HI)


# paged_attention: 2 sequences of 4 pages, 1 KV head shared by 2 query heads.
BATCH, PAGES_PER_SEQ, Q_HEADS = 2, 4, 2
LENGTHS = (37, 64)


def _paged_inputs(_devices: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(2)
    total = BATCH * PAGES_PER_SEQ
    q = rng.standard_normal((BATCH, Q_HEADS, HEAD_DIM), dtype=np.float32) * SCALE
    k_pages = rng.standard_normal((1, total, PAGE, HEAD_DIM), dtype=np.float32)
    v_pages = rng.standard_normal((1, total, PAGE, HEAD_DIM), dtype=np.float32)
    lengths = np.asarray(LENGTHS, np.int32)
    page_indices = rng.permutation(total).astype(np.int32).reshape(BATCH, PAGES_PER_SEQ)
    return q, k_pages, v_pages, lengths, page_indices


def _paged(q: Any, k_pages: Any, v_pages: Any, lengths: Any, page_indices: Any) -> Any:
    from jax.experimental.pallas.ops.tpu import paged_attention

    return paged_attention.paged_attention(
        q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block=2
    )


def _paged_reference(q: Any, k_pages: Any, v_pages: Any, lengths: Any, page_indices: Any) -> Any:
    import jax.numpy as jnp

    def keys(pages: Any) -> Any:  # [kv_heads, pages, page, d] -> [batch, t, q_heads, d]
        kv_heads = pages.shape[0]
        seq = pages[:, page_indices].reshape(kv_heads, BATCH, -1, HEAD_DIM)
        return jnp.repeat(seq.transpose(1, 2, 0, 3), Q_HEADS // kv_heads, axis=2)

    t = jnp.arange(PAGES_PER_SEQ * PAGE)
    keep = (t[None, :] < lengths[:, None])[:, None, :]  # [batch, 1, t]
    return masked_attention(q, keys(k_pages), keys(v_pages), keep)


# ragged_paged_attention: 3 sequences (a decode step and two prefills) of up to 2 pages; K and V
# heads interleaved in one cache (K at even, V at odd combined heads), 1 KV head, 2 query heads.
Q_LENS, KV_LENS, RAGGED_PAGES_PER_SEQ = (1, 5, 10), (9, 20, 30), 2


def _ragged_inputs(_devices: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(3)
    seqs = len(Q_LENS)
    total = seqs * RAGGED_PAGES_PER_SEQ + 2  # two pages nobody reads
    q = rng.standard_normal((sum(Q_LENS), Q_HEADS, HEAD_DIM), dtype=np.float32) * SCALE
    kv_pages = rng.standard_normal((total, PAGE, 2, HEAD_DIM), dtype=np.float32)
    kv_lens = np.asarray(KV_LENS, np.int32)
    order = rng.permutation(total)[: seqs * RAGGED_PAGES_PER_SEQ]
    page_indices = order.astype(np.int32).reshape(seqs, RAGGED_PAGES_PER_SEQ)
    cu_q_lens = np.concatenate([[0], np.cumsum(Q_LENS)]).astype(np.int32)
    num_seqs = np.asarray([seqs], np.int32)
    return q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs


def _ragged(*args: Any) -> Any:
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel

    return kernel.ragged_paged_attention(*args, num_kv_pages_per_block=1, num_queries_per_block=8)


def _ragged_reference(
    q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any
) -> Any:
    """Each query token attends to its own sequence's keys up to its position in it."""
    import jax.numpy as jnp

    del num_seqs  # every sequence is live
    tokens = jnp.arange(q.shape[0])
    seq = jnp.searchsorted(cu_q_lens[1:], tokens, side="right")
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    position = kv_lens[seq] - q_len + (tokens - cu_q_lens[seq])
    cache = kv_pages[page_indices].reshape(page_indices.shape[0], -1, 2, HEAD_DIM)
    k = jnp.repeat(cache[seq][:, :, 0:1], Q_HEADS, axis=2)  # [tokens, t, q_heads, d]
    v = jnp.repeat(cache[seq][:, :, 1:2], Q_HEADS, axis=2)
    t = jnp.arange(cache.shape[1])
    keep = (t[None, :] <= position[:, None])[:, None, :]
    return masked_attention(q, k, v, keep)


KERNELS = (
    ShippedKernel(
        "paged_attention",
        _paged_inputs,
        single_device(_paged),
        _paged_reference,
        atol=5e-3,
        rtol=1e-2,
    ),
    ShippedKernel(
        "ragged_paged_attention",
        _ragged_inputs,
        single_device(_ragged),
        _ragged_reference,
        atol=5e-3,
        rtol=1e-2,
    ),
)
