"""``pallas.ops.tpu.megablox.gmm``: a grouped matmul over three groups whose sizes (including an
empty group and one that ends inside a 128-row tile) exercise the group metadata."""

from __future__ import annotations

from typing import Any

import numpy as np

from coremesh.core.dtypes import mxu_operand
from coremesh.testing.shipped.entry import ShippedKernel, single_device

GROUP_SIZES, K, N, TILE = (100, 0, 156), 128, 128, 128


def _inputs(_devices: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(4)
    lhs = rng.standard_normal((sum(GROUP_SIZES), K), dtype=np.float32)
    rhs = rng.standard_normal((len(GROUP_SIZES), K, N), dtype=np.float32)
    return lhs, rhs, np.asarray(GROUP_SIZES, np.int32)


def _gmm(lhs: Any, rhs: Any, group_sizes: Any) -> Any:
    from jax.experimental.pallas.ops.tpu import megablox  # its gmm: the op with its VJP

    return megablox.gmm(lhs, rhs, group_sizes, tiling=(TILE, TILE, TILE))


def _reference(lhs: Any, rhs: Any, group_sizes: Any) -> Any:
    """Row r of lhs times the rhs of the group r falls in (the MXU's operands, exact products)."""
    import jax.numpy as jnp

    group = jnp.searchsorted(jnp.cumsum(group_sizes), jnp.arange(lhs.shape[0]), side="right")
    lhs, rhs = mxu_operand(lhs), mxu_operand(rhs)
    return jnp.einsum("mk,mkn->mn", lhs, rhs[group], precision="highest")


KERNELS = (
    ShippedKernel("megablox_gmm", _inputs, single_device(_gmm), _reference, atol=1e-3, rtol=1e-4),
)
