"""The collectives over the device axis as compile-matrix programs (``coremesh.programs``).

``coremesh aot-all`` (``nox -s aot``) compiles them for every chip. Core-axis and hierarchical
variants depend on the chip's core count and are compiled per chip by this package's tests
(tests/test_aot.py). Building the programs needs coremesh-testing (the ``aot`` extra).
"""

from __future__ import annotations

from typing import Any

DEVICES = 4


def programs() -> list[Any]:
    """all_gather / reduce_scatter / all_reduce (ring, bidirectional), all_to_all, ppermute."""
    import jax
    import jax.numpy as jnp

    from coremesh.collectives.reference import collective, shift
    from coremesh.testing.aot import Arg, target_program

    rows = 32 * DEVICES  # whole (8, 128) tiles for every share, both ring directions
    out = []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        for algorithm in ("ring", "bidirectional"):
            kw: dict[str, Any] = {"algorithm": algorithm}
            if op != "all_reduce":
                kw["tiled"] = True
            out.append(
                target_program(
                    collective(op, "device", **kw),
                    lambda n: [Arg((rows * n, 256), jnp.float32, jax.P("device"))],
                    name=f"collectives.{op}.{algorithm}",
                )
            )
    direct: dict[str, dict[str, Any]] = {
        "all_to_all": {"split_axis": 0, "concat_axis": 1, "tiled": True},
        "ppermute": {"perm": shift(DEVICES)},
    }
    for op, kw in direct.items():
        out.append(
            target_program(
                collective(op, "device", **kw),
                lambda n: [Arg((8 * DEVICES * n, 256), jnp.float32, jax.P("device"))],
                name=f"collectives.{op}",
            )
        )
    return out
