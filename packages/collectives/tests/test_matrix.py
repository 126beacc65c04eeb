"""Every collective x axis x algorithm on the simulator, equal to jax.lax on the same input.

Chips: v5p (4 devices x 2 TensorCores) and v6e (4 devices x 1). DMA modes: ``eager`` and
``on_wait`` (pending DMAs run last-in first-out when waited for: a missing or reused semaphore
shows up as wrong data), the latter with the race detector on. Operands are small,
not powers of two, and cut unevenly between cores and ring directions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import pytest

pytestmark = [pytest.mark.sim, pytest.mark.matrix]

CONFIGS = [
    pytest.param(("v5p", "eager", False), id="v5p-eager"),
    pytest.param(("v5p", "on_wait", True), id="v5p-on_wait-races"),
    pytest.param(("v6e", "eager", False), id="v6e-eager"),
    pytest.param(("v6e", "on_wait", True), id="v6e-on_wait-races"),
]

RING_OPS = ("all_gather", "reduce_scatter", "all_reduce")
ALGORITHMS = {
    "device": ("ring", "bidirectional"),
    "core": ("ring", "bidirectional"),
    "hier": ("ring", "bidirectional", "hierarchical"),
}
COMBOS = [
    (op, axis, algo) for axis, algos in ALGORITHMS.items() for op in RING_OPS for algo in algos
]
COMBOS += [
    (op, axis, "direct") for axis in ALGORITHMS for op in ("all_to_all", "ppermute", "barrier")
]
CORES = {"v5p": 2, "v6e": 1}


def per_participant(op: str, n: int) -> tuple[tuple[int, ...], dict[str, Any]]:
    """One participant's operand shape and the jax.lax keywords of the case."""
    if op == "all_gather":
        return (6, 3, 40), {"tiled": True}
    if op == "reduce_scatter":
        return (4 * n, 5, 40), {"tiled": True}
    if op == "all_reduce":
        return (4 * n, 5, 40), {}
    if op == "all_to_all":
        return (2 * n, 3, 40), {"split_axis": 0, "concat_axis": 1, "tiled": True}
    return (6, 5, 40), {}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize(("op", "kind", "algorithm"), COMBOS, ids=["-".join(c) for c in COMBOS])
def test_equals_jax_lax(
    config: tuple[str, Literal["eager", "on_wait"], bool],
    op: str,
    kind: str,
    algorithm: str,
    operand: Callable[..., Any],
    verify: Callable[..., None],
) -> None:
    chip, mode, races = config
    cores = CORES[chip]
    n = {"device": 4, "core": cores, "hier": 4 * cores}[kind]
    shape, kw = per_participant(op, n)
    per_device = shape[0] * (cores if kind != "device" else 1)
    x = operand((4 * per_device, *shape[1:]), "float32")
    verify(chip, op, kind, x, mode=mode, races=races, algorithm=algorithm, **kw)
