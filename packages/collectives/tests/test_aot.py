"""Every collective x axis x algorithm compiles with libtpu for v5e, v5p, v6e and TPU7x.

Deviceless: the real TPU compiler (Mosaic and XLA) on a 4-device slice of each chip, its
default core mode (v5p: 2 TensorCores per device).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from coremesh.collectives.reference import collective, shift
from coremesh.testing.aot import Arg, CompileTarget, compile_on, target_program

pytestmark = pytest.mark.aot

CHIPS = ("v5e", "v5p", "v6e", "TPU7x")
AXES: dict[str, Any] = {"device": "device", "core": "core", "hier": ("device", "core")}
ALGORITHMS = {
    "device": ("ring", "bidirectional"),
    "core": ("ring", "bidirectional"),
    "hier": ("ring", "bidirectional", "hierarchical"),
}
COMBOS = [
    (op, kind, algo)
    for kind, algos in ALGORITHMS.items()
    for op in ("all_gather", "reduce_scatter", "all_reduce")
    for algo in algos
]
COMBOS += [
    (op, kind, "direct") for kind in ALGORITHMS for op in ("all_to_all", "ppermute", "barrier")
]


@functools.cache
def target(chip: str) -> CompileTarget:
    return CompileTarget.for_chip(chip, devices=4)


def program(op: str, kind: str, algo: str, cores: int, dtype: Any = jnp.float32) -> Any:
    n = {"device": 4, "core": cores, "hier": 4 * cores}[kind]
    # Enough rows for 2 cores x 2 ring directions to cut whole (sublane, lane) tiles.
    m = 4 * 8 * 4 // jnp.dtype(dtype).itemsize
    per_participant = {
        "reduce_scatter": (m * n, 256),
        "all_reduce": (m * n, 256),
        "all_to_all": (8 * n, 256),
    }.get(op, (m, 256))
    rows = per_participant[0] * (cores if kind != "device" else 1)
    kw: dict[str, Any] = {"tiled": True} if op in ("all_gather", "reduce_scatter") else {}
    if algo != "direct":
        kw["algorithm"] = algo
    if op == "ppermute":
        kw["perm"] = shift(n)
    if op == "all_to_all":
        kw.update(split_axis=0, concat_axis=1, tiled=True)
    fn: Callable[[Any], Any] = collective(op, AXES[kind], **kw)
    args = [Arg((4 * rows, per_participant[1]), dtype, jax.P("device"))]
    return target_program(fn, args, name=f"{op}-{kind}-{algo}")


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize(("op", "kind", "algo"), COMBOS, ids=["-".join(c) for c in COMBOS])
def test_compiles(chip: str, op: str, kind: str, algo: str) -> None:
    t = target(chip)
    result = compile_on(program(op, kind, algo, t.cores_per_device), t)
    result.raise_for_status()
    assert result.ok and result.as_expected


REDUCE_DTYPES = ("bfloat16", "int32", "int16", "int8", "uint8")


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_reductions_compile_for_every_dtype(chip: str, dtype: str) -> None:
    t = target(chip)
    algo = "hierarchical" if t.cores_per_device > 1 else "bidirectional"
    prog = program("all_reduce", "hier", algo, t.cores_per_device, jnp.dtype(dtype))
    compile_on(prog, t).raise_for_status()


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("dtype", ["uint16", "float8_e5m2"])
def test_moves_compile_for_narrow_dtypes(chip: str, dtype: str) -> None:
    t = target(chip)
    prog = program("all_gather", "device", "bidirectional", t.cores_per_device, jnp.dtype(dtype))
    compile_on(prog, t).raise_for_status()


def test_axes_are_what_the_chips_have() -> None:
    assert [target(c).cores_per_device for c in CHIPS] == [1, 2, 1, 1]
    assert AXES["hier"] == ("device", "core")


def test_device_axis_programs_are_registered_and_compile() -> None:
    from importlib.metadata import entry_points

    from coremesh.collectives.programs import programs
    from coremesh.testing.aot import compile_matrix

    (ep,) = [e for e in entry_points(group="coremesh.programs") if e.name == "collectives"]
    assert ep.load() is programs
    progs = programs()
    results = compile_matrix(progs, ["v5p"], devices=4)
    failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert len(results) == 8
