"""The SparseCore ops as compile-matrix programs (entry point group ``coremesh.programs``).

``coremesh aot-all`` compiles every registered program for every chip: SparseCore programs are
expected to compile on v5p, v6e and TPU7x and to be refused as unsupported on v4 and v5e.
Building them needs coremesh-testing (the ``aot`` extra), imported only when asked for.
"""

from __future__ import annotations

from typing import Any


def programs() -> list[Any]:
    """One small-shape program per op and dtype; indices are split over the device axis."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from coremesh.sparsecore.ops.bag import embedding_bag
    from coremesh.sparsecore.ops.gather import gather, gather_reference
    from coremesh.sparsecore.ops.scatter import scatter_add, segment_sum
    from coremesh.testing.aot import Arg, jitted_program

    vec = P("device")
    rows = P("device", None)
    i32 = jnp.int32

    def take(table: jax.Array, idx: jax.Array) -> jax.Array:
        return gather_reference(table, idx, mode="clip")

    def gather_args(dtype: Any) -> Any:
        return lambda n: [Arg((1024, 128), dtype), Arg((256 * n,), i32, vec)]

    progs = [
        jitted_program(
            lambda t, i: gather(t, i, mode="clip"),
            gather_args(dt),
            name=f"sparsecore.gather_{jnp.dtype(dt).name}",
            uses_sparsecore=True,
            xla_reference=jitted_program(
                take, gather_args(dt), name=f"jnp.take_{jnp.dtype(dt).name}"
            ),
        )
        for dt in (jnp.float32, jnp.bfloat16, jnp.int32)
    ]
    progs += [
        jitted_program(
            lambda t, i, u: scatter_add(t, i, u, mode="drop"),
            lambda n: [
                Arg((512, 128), jnp.float32),
                Arg((256 * n,), i32, vec),
                Arg((256 * n, 128), jnp.float32, rows),
            ],
            name="sparsecore.scatter_add_float32",
            uses_sparsecore=True,
        ),
        jitted_program(
            lambda v, s: segment_sum(v, s, 256),
            lambda n: [Arg((256 * n, 128), jnp.float32, rows), Arg((256 * n,), i32, vec)],
            name="sparsecore.segment_sum_float32",
            uses_sparsecore=True,
        ),
        jitted_program(
            lambda t, i, o: embedding_bag(t, i, o, combiner="mean", mode="clip"),
            lambda n: [Arg((1024, 128), jnp.float32), Arg((256,), i32), Arg((32,), i32)],
            name="sparsecore.embedding_bag_mean",
            uses_sparsecore=True,
        ),
    ]
    return progs
