"""``pallas.ops.tpu.flash_attention`` and ``splash_attention``: causal attention over two
128-row blocks of queries and keys (the smallest blocks either kernel takes), so the kernels'
block skipping above the diagonal runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from coremesh.core.dtypes import mxu_operand
from coremesh.testing.shipped.entry import ShippedKernel, single_device

HEADS, SEQ, HEAD_DIM, BLOCK = 2, 256, 128, 128


def causal_attention(q: Any, k: Any, v: Any, scale: float) -> Any:
    """softmax(scale * q k^T, keys after the query masked) v over the last two axes, of the
    MXU's operands (the kernels' dots are at the default precision). The kernels also round
    their softmax weights to bfloat16, unnormalized and block by block (an online softmax): the
    reference keeps them float32, and the tolerance covers that (simulated on v5p: 2.0e-3 for
    flash and 2.9e-3 for splash attention, on outputs up to 4.1)."""
    import jax
    import jax.numpy as jnp

    hi = jax.lax.Precision.HIGHEST
    q, k, v = (mxu_operand(a) for a in (q, k, v))
    logits = jnp.einsum("...qd,...kd->...qk", q, k, precision=hi) * scale
    seq_q, seq_k = logits.shape[-2:]
    keep = jnp.arange(seq_q)[:, None] >= jnp.arange(seq_k)[None, :]
    logits = jnp.where(keep, logits, -jnp.inf)
    return jnp.einsum("...qk,...kd->...qd", jax.nn.softmax(logits, axis=-1), v, precision=hi)


def _qkv(shape: tuple[int, ...]) -> tuple[Any, ...]:
    rng = np.random.default_rng(1)
    return tuple(rng.standard_normal(shape, dtype=np.float32) for _ in range(3))


SCALE = 1.0 / math.sqrt(HEAD_DIM)


def _flash(q: Any, k: Any, v: Any) -> Any:
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    blocks = fa.BlockSizes(block_q=BLOCK, block_k_major=BLOCK, block_k=BLOCK, block_b=1)
    return fa.flash_attention(q, k, v, causal=True, sm_scale=SCALE, block_sizes=blocks)


def _flash_reference(q: Any, k: Any, v: Any) -> Any:
    return causal_attention(q, k, v, SCALE)


def _splash(q: Any, k: Any, v: Any) -> Any:
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((SEQ, SEQ)) for _ in range(HEADS)])
    blocks = sa.BlockSizes(block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK)
    kernel = sa.make_splash_mha_single_device(mask, block_sizes=blocks)
    return kernel(q, k, v)


def _splash_reference(q: Any, k: Any, v: Any) -> Any:
    return causal_attention(q, k, v, 1.0)  # splash takes q already scaled


KERNELS = (
    ShippedKernel(
        "flash_attention",
        lambda _n: _qkv((1, HEADS, SEQ, HEAD_DIM)),
        single_device(_flash),
        _flash_reference,
        atol=5e-3,
        rtol=5e-3,
    ),
    ShippedKernel(
        "splash_attention",
        lambda _n: _qkv((HEADS, SEQ, HEAD_DIM)),
        single_device(_splash),
        _splash_reference,
        atol=5e-3,
        rtol=5e-3,
    ),
)
