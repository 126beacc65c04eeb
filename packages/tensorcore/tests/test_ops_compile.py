"""Every TensorCore op compiles with libtpu for every TPU generation (v4 in megacore mode)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.testing.aot import Arg, compile_matrix, jitted_program

ROWS = P("device", None)


def programs() -> list[object]:
    f32, bf16 = jnp.float32, jnp.bfloat16
    return [
        jitted_program(
            lambda x, y: tc.map_blocks(lambda u, v: u * 2 + v, x, y),
            lambda n: [Arg((512 * n, 1024), f32, ROWS)] * 2,
            name="map_blocks",
        ),
        jitted_program(
            lambda x: tc.reduce(x, 0, "sum"),
            lambda n: [Arg((512 * n, 768), bf16, ROWS)],
            name="reduce_rows",
        ),
        jitted_program(
            lambda x: tc.reduce(x, 1, "max"),
            lambda n: [Arg((512 * n, 768), f32, ROWS)],
            name="reduce_columns",
        ),
        jitted_program(
            tc.matmul,
            lambda n: [Arg((256 * n, 512), bf16, ROWS), Arg((512, 384), bf16)],
            name="matmul",
        ),
        jitted_program(
            tc.gather_blocks,
            lambda n: [Arg((1024, 512), f32), Arg((16 * n,), jnp.int32, P("device"))],
            name="gather_blocks",
        ),
    ]


@pytest.mark.aot
@pytest.mark.parametrize("chip", list(cc.CHIPS))
def test_ops_compile(chip: str) -> None:
    results = compile_matrix(programs(), [chip])
    failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert len(results) == 5
