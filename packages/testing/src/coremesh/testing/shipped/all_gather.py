"""``pallas.ops.tpu.all_gather``: the bidirectional ring all-gather over 4 devices, each
sending half of every shard each way with remote DMAs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from coremesh.testing.shipped.entry import ShippedKernel

DEVICES, ROWS, LANES = 4, 16, 128


def _inputs(devices: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(5)
    return (rng.standard_normal((devices * ROWS, LANES), dtype=np.float32),)


def _kernel(mesh: Any) -> Callable[..., Any]:
    from jax.experimental.pallas.ops.tpu import all_gather

    def gather(x: Any) -> Any:
        return all_gather.all_gather(x, mesh=mesh, axis_name="device")

    return gather


def _reference(x: Any) -> Any:
    """Every device ends with the whole array: the gathered result is ``x``, replicated."""
    import jax.numpy as jnp

    return jnp.asarray(x)


def _specs() -> tuple[Any, ...]:
    from jax.sharding import PartitionSpec

    return (PartitionSpec("device", None),)


KERNELS = (
    ShippedKernel(
        "all_gather", _inputs, _kernel, _reference, devices=DEVICES, specs=_specs, atol=0, rtol=0
    ),
)
