"""The TensorCore ops as compile-matrix programs (entry point group ``coremesh.programs``).

``coremesh aot-all`` (``nox -s aot``) compiles every registered program for every chip, so a
change that breaks an op on one generation fails there; ``coremesh profile`` sets each beside its
``xla_reference``, the op's XLA reference (``<op>_reference``) over the same arguments. Building
the programs needs coremesh-testing (the ``aot`` extra); it is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def programs() -> list[Any]:
    """Small-shape programs for every op (and both matmul plans), sharded over the device axis."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from coremesh.tensorcore import ops
    from coremesh.testing.aot import Arg, target_program

    def program(
        name: str, kernel: Callable[..., Any], reference: Callable[..., Any], args: Any
    ) -> Any:
        xla = target_program(reference, args, name=f"tensorcore.{name}[xla]")
        return target_program(kernel, args, name=f"tensorcore.{name}", xla_reference=xla)

    rows = P("device", None)
    f32, bf16 = jnp.float32, jnp.bfloat16

    def axpy(u: Any, v: Any) -> Any:
        return u * 2 + v

    def double(b: Any) -> Any:
        return b * 2

    def mm(n: int) -> list[Arg]:
        return [Arg((256 * n, 512), bf16, rows), Arg((512, 384), bf16)]

    def gather(dtype: Any) -> Callable[[int], list[Arg]]:
        return lambda n: [Arg((1024, 512), dtype), Arg((16 * n,), jnp.int32, P("device"))]

    return [
        program(
            "map_blocks",
            lambda x, y: ops.map_blocks(axpy, x, y),
            lambda x, y: ops.map_blocks_reference(axpy, x, y),
            lambda n: [Arg((512 * n, 1024), f32, rows)] * 2,
        ),
        program(
            "reduce_rows",
            lambda x: ops.reduce(x, 0, "sum"),
            lambda x: ops.reduce_reference(x, 0, "sum"),
            lambda n: [Arg((512 * n, 768), bf16, rows)],
        ),
        program(
            "reduce_columns",
            lambda x: ops.reduce(x, 1, "max"),
            lambda x: ops.reduce_reference(x, 1, "max"),
            lambda n: [Arg((512 * n, 768), f32, rows)],
        ),
        program("matmul", ops.matmul, ops.matmul_reference, mm),
        program(  # b (8 MiB) resident: raises the scoped VMEM limit on v4, v5e and v5p
            "matmul_resident_large",
            ops.matmul,
            ops.matmul_reference,
            lambda n: [Arg((1024 * n, 2048), bf16, rows), Arg((2048, 2048), bf16)],
        ),
        program(
            "matmul_blocked",
            lambda a, b: ops.matmul(a, b, blocks=(64, 256, 128)),
            ops.matmul_reference,
            mm,
        ),
        program("gather_blocks", ops.gather_blocks, ops.gather_blocks_reference, gather(f32)),
        program(
            "gather_map_blocks",
            lambda x, i: ops.gather_blocks(x, i, f=double),
            lambda x, i: ops.gather_blocks_reference(x, i, f=double),
            gather(bf16),
        ),
    ]
