"""The SparseCore ops as compile-matrix programs (entry point group ``coremesh.programs``).

``coremesh aot-all`` compiles every registered program for every chip: SparseCore programs are
expected to compile on v5p, v6e and TPU7x and to be refused as unsupported on v4 and v5e.
``coremesh profile`` sets each beside its ``xla_reference``, the op's XLA reference
(``<op>_reference``) over the same arguments. Building them needs coremesh-testing (the ``aot``
extra), imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def programs() -> list[Any]:
    """One small-shape program per op and dtype; indices are split over the device axis."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from coremesh.sparsecore import ops
    from coremesh.testing.aot import Arg, target_program

    def program(
        name: str, kernel: Callable[..., Any], reference: Callable[..., Any], args: Any
    ) -> Any:
        xla = target_program(reference, args, name=f"sparsecore.{name}[xla]")
        return target_program(
            kernel, args, name=f"sparsecore.{name}", uses_sparsecore=True, xla_reference=xla
        )

    vec = P("device")
    rows = P("device", None)
    i32 = jnp.int32

    def gather_args(dtype: Any) -> Callable[[int], list[Arg]]:
        return lambda n: [Arg((1024, 128), dtype), Arg((256 * n,), i32, vec)]

    progs = [
        program(
            f"gather_{jnp.dtype(dt).name}",
            lambda t, i: ops.gather(t, i, mode="clip"),
            lambda t, i: ops.gather_reference(t, i, mode="clip"),
            gather_args(dt),
        )
        for dt in (jnp.float32, jnp.bfloat16, jnp.int32)
    ]
    progs += [
        program(
            "scatter_add_float32",
            lambda t, i, u: ops.scatter_add(t, i, u, mode="drop"),
            lambda t, i, u: ops.scatter_add_reference(t, i, u, mode="drop"),
            lambda n: [
                Arg((512, 128), jnp.float32),
                Arg((256 * n,), i32, vec),
                Arg((256 * n, 128), jnp.float32, rows),
            ],
        ),
        program(
            "segment_sum_float32",
            lambda v, s: ops.segment_sum(v, s, 256),
            lambda v, s: ops.segment_sum_reference(v, s, 256),
            lambda n: [Arg((256 * n, 128), jnp.float32, rows), Arg((256 * n,), i32, vec)],
        ),
        program(
            "embedding_bag_mean",
            lambda t, i, o: ops.embedding_bag(t, i, o, combiner="mean", mode="clip"),
            lambda t, i, o: ops.embedding_bag_reference(t, i, o, combiner="mean", mode="clip"),
            lambda n: [Arg((1024, 128), jnp.float32), Arg((256,), i32), Arg((32,), i32)],
        ),
    ]
    return progs
