"""One shipped kernel of ``jax.experimental.pallas.ops.tpu`` as a corpus entry.

An entry holds what the simulator test and the compile matrix both need: small inputs the kernel
accepts, the call of the kernel as JAX ships it, an independent ``jax.numpy`` reference of the
same result, and the chips the kernel is written for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

#: Every TPU generation coremesh models.
ALL_CHIPS: tuple[str, ...] = ("v4", "v5e", "v5p", "v6e", "TPU7x")


@dataclasses.dataclass(frozen=True)
class ShippedKernel:
    """``kernel(mesh)(*inputs(num_devices))`` equals ``reference(*inputs(num_devices))``.

    ``kernel`` takes the device mesh: a collective (all_gather) is built over it, and a
    one-device kernel runs on each of its devices (:func:`single_device`). ``inputs`` are numpy
    arrays, replicated unless ``specs`` gives a ``PartitionSpec`` over the mesh axis
    ``"device"`` per input. ``devices`` is the device count the simulator test runs it on.
    """

    name: str
    inputs: Callable[[int], tuple[Any, ...]]
    kernel: Callable[[Any], Callable[..., Any]]
    reference: Callable[..., Any]
    chips: tuple[str, ...] = ALL_CHIPS
    devices: int = 1
    specs: Callable[[], Sequence[Any]] | None = None
    atol: float = 1e-5
    rtol: float = 1e-5

    def partition_specs(self, count: int) -> tuple[Any, ...]:
        """One ``PartitionSpec`` per input: ``specs`` or replicated."""
        from jax.sharding import PartitionSpec

        return tuple(self.specs()) if self.specs is not None else (PartitionSpec(),) * count


def single_device(call: Callable[..., Any]) -> Callable[[Any], Callable[..., Any]]:
    """A ``kernel`` for a one-device kernel: every device of the mesh runs it on its own full
    copy of the inputs (a Mosaic call must sit inside a ``shard_map``; XLA does not partition
    it)."""

    def build(mesh: Any) -> Callable[..., Any]:
        import jax
        from jax.sharding import PartitionSpec

        replicated = PartitionSpec()
        per_device: Callable[..., Any] = jax.shard_map(
            call, mesh=mesh, in_specs=replicated, out_specs=replicated, check_vma=False
        )
        return per_device

    return build
