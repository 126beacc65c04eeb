"""``pallas.ops.tpu.matmul``: the blocked matmul, on tiles of the smallest (128) the MXU takes."""

from __future__ import annotations

from typing import Any

import numpy as np

from coremesh.core.dtypes import mxu_operand
from coremesh.testing.shipped.entry import ShippedKernel, single_device


def _inputs(_devices: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256), dtype=np.float32)
    y = rng.standard_normal((256, 256), dtype=np.float32)
    return x, y


def _kernel(x: Any, y: Any) -> Any:
    from jax.experimental.pallas.ops.tpu import matmul

    return matmul.matmul(x, y, block_shape=(128, 128), block_k=128)


def _reference(x: Any, y: Any) -> Any:
    """The kernel's default-precision dots: the MXU's ``bfloat16`` operands, exact products."""
    import jax
    import jax.numpy as jnp

    return jnp.dot(mxu_operand(x), mxu_operand(y), precision=jax.lax.Precision.HIGHEST)


KERNELS = (
    ShippedKernel("matmul", _inputs, single_device(_kernel), _reference, atol=1e-3, rtol=1e-4),
)
