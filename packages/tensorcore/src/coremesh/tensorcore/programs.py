"""The TensorCore ops as compile-matrix programs (entry point group ``coremesh.programs``).

``coremesh aot-all`` (``nox -s aot``) compiles every registered program for every chip, so a
change that breaks an op on one generation fails there. Building the programs needs
coremesh-testing (the ``aot`` extra); it is imported only when the programs are asked for.
"""

from __future__ import annotations

from typing import Any


def programs() -> list[Any]:
    """Small-shape programs for every op (and both matmul plans), sharded over the device axis."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from coremesh.tensorcore.ops.gather_blocks import gather_blocks
    from coremesh.tensorcore.ops.map_blocks import map_blocks
    from coremesh.tensorcore.ops.matmul import matmul
    from coremesh.tensorcore.ops.reduce import reduce
    from coremesh.testing.aot import Arg, jitted_program

    rows = P("device", None)
    f32, bf16 = jnp.float32, jnp.bfloat16
    return [
        jitted_program(
            lambda x, y: map_blocks(lambda u, v: u * 2 + v, x, y),
            lambda n: [Arg((512 * n, 1024), f32, rows)] * 2,
            name="tensorcore.map_blocks",
        ),
        jitted_program(
            lambda x: reduce(x, 0, "sum"),
            lambda n: [Arg((512 * n, 768), bf16, rows)],
            name="tensorcore.reduce_rows",
        ),
        jitted_program(
            lambda x: reduce(x, 1, "max"),
            lambda n: [Arg((512 * n, 768), f32, rows)],
            name="tensorcore.reduce_columns",
        ),
        jitted_program(
            matmul,
            lambda n: [Arg((256 * n, 512), bf16, rows), Arg((512, 384), bf16)],
            name="tensorcore.matmul",
        ),
        jitted_program(  # b (8 MiB) resident: raises the scoped VMEM limit on v4, v5e and v5p
            matmul,
            lambda n: [Arg((1024 * n, 2048), bf16, rows), Arg((2048, 2048), bf16)],
            name="tensorcore.matmul_resident_large",
        ),
        jitted_program(
            lambda a, b: matmul(a, b, blocks=(64, 256, 128)),
            lambda n: [Arg((256 * n, 512), bf16, rows), Arg((512, 384), bf16)],
            name="tensorcore.matmul_blocked",
        ),
        jitted_program(
            gather_blocks,
            lambda n: [Arg((1024, 512), f32), Arg((16 * n,), jnp.int32, P("device"))],
            name="tensorcore.gather_blocks",
        ),
        jitted_program(
            lambda x, i: gather_blocks(x, i, f=lambda b: b * 2),
            lambda n: [Arg((1024, 512), bf16), Arg((16 * n,), jnp.int32, P("device"))],
            name="tensorcore.gather_map_blocks",
        ),
    ]
