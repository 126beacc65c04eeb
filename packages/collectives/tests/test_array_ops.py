"""The array functions beyond the matrix: dtypes, odd shapes, keyword variants, max / min,
credit synchronisation, and calls inside a user's shard_map. Each result equals jax.lax."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import numpy as np
import pytest

import coremesh.collectives as cl
from coremesh.testing.plugin import SliceFactory

pytestmark = pytest.mark.sim

F = Callable[..., Any]


DTYPES = ["bfloat16", "int32", "int8", "uint8", "int16"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_reduce(dtype: str, operand: F, verify: F) -> None:
    """Reductions add in 32 bits and hand back the input dtype (integers wrap as in XLA)."""
    x = operand((4 * 2 * 8, 3, 128), dtype, seed=1)
    verify("v5p", "all_reduce", "hier", x, algorithm="hierarchical")


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "uint16", "float8_e5m2"])
def test_dtypes_move(dtype: str, operand: F, verify: F) -> None:
    x = operand((4 * 2 * 32, 256), dtype, seed=2)
    verify("v5p", "all_gather", "device", x, tiled=True)


CASES = [
    # op, axis, per-device shape, keywords
    ("all_gather", "device", (5, 7), {"tiled": False, "axis": 1}),
    ("all_gather", "core", (6, 9), {"tiled": True, "axis": 1}),
    ("all_gather", "device", (300,), {"tiled": True}),
    ("reduce_scatter:max", "device", (3, 4, 20), {"scatter_dimension": 1, "tiled": False}),
    ("reduce_scatter:min", "hier", (2 * 24, 3), {"tiled": True}),
    ("reduce_scatter", "core", (2 * 2, 5, 3), {"tiled": False}),
    ("all_reduce:max", "device", (3, 5, 7), {}),
    ("all_reduce:min", "core", (2 * 3, 17), {}),
    ("all_reduce", "hier", (2 * 1000,), {}),
    ("all_to_all", "device", (3, 8, 5), {"split_axis": 1, "concat_axis": 2, "tiled": True}),
    ("all_to_all", "hier", (2 * 8, 3), {"split_axis": 0, "concat_axis": 1, "tiled": False}),
    ("ppermute", "device", (3, 5), {"perm": [(0, 2), (2, 0), (1, 3)]}),
    ("ppermute", "hier", (2 * 3, 130), {"perm": [(i, 7 - i) for i in range(8)]}),
    ("ppermute", "core", (2 * 5, 3), {"perm": [(0, 1), (1, 0)]}),
]


@pytest.mark.parametrize(
    ("op", "axis", "shape", "kw"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
def test_shapes_and_keywords(
    op: str, axis: str, shape: tuple[int, ...], kw: dict[str, Any], operand: F, verify: F
) -> None:
    x = operand((4 * shape[0], *shape[1:]), "float32", seed=3)
    verify("v5p", op, axis, x, **kw)


@pytest.mark.parametrize(
    ("op", "axis"),
    [("all_gather", "device"), ("reduce_scatter", "hier"), ("all_reduce", "device")],
)
@pytest.mark.parametrize("algorithm", ["ring", "bidirectional"])
def test_credit_sync(op: str, axis: str, algorithm: str, operand: F, verify: F) -> None:
    """Two semaphores (and receive slots) reused with credits: exact in on_wait mode, where a
    reuse without the credit wait corrupts the result (see test_sync.py)."""
    n = {"device": 4, "hier": 8}[axis]
    kw: dict[str, Any] = {"tiled": True} if op != "all_reduce" else {}
    x = operand((4 * 2 * 4 * n, 3, 128), "float32", seed=4)
    verify("v5p", op, axis, x, algorithm=algorithm, sync="credit", **kw)


def test_inside_a_users_shard_map(operand: F, slice_target: SliceFactory) -> None:
    """Inside shard_map the functions take the per-device operand and any mesh axis name."""
    x = operand((4 * 8, 128), "float32", seed=5)
    with slice_target(chip="v5p", devices=4, deadline=60) as sim:
        mesh = jax.make_mesh(
            (4,), ("x",), devices=sim.devices, axis_types=(jax.sharding.AxisType.Auto,)
        )

        @jax.jit
        @partial(
            jax.shard_map, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x"), check_vma=False
        )
        def f(v: Any) -> Any:
            total = cl.psum(v, "x")
            gathered = cl.all_gather(v, "x", tiled=True)
            return total + gathered.reshape(4, *v.shape).sum(0)

        got = np.asarray(sim.run(f, x))
    parts = np.asarray(x).reshape(4, 8, 128)
    np.testing.assert_array_equal(got, np.tile(2 * parts.sum(0), (4, 1)))


def test_lax_spellings(operand: F, lax_reference: F, slice_target: SliceFactory) -> None:
    x = operand((4 * 2 * 8, 128), "float32", seed=6)
    cores = 2
    with slice_target(chip="v5p", devices=4, deadline=60) as sim:
        got = [
            np.asarray(sim.run(jax.jit(lambda v: cl.psum(v, "device")), x)),
            np.asarray(sim.run(jax.jit(lambda v: cl.pmax(v, "core")), x)),
            np.asarray(sim.run(jax.jit(lambda v: cl.pmin(v, ("device", "core"))), x)),
            np.asarray(sim.run(jax.jit(lambda v: cl.psum_scatter(v, "device", tiled=True)), x)),
        ]
    from jax import lax

    want = [
        lax_reference(lambda v: lax.psum(v, "device"), x, "device", cores),
        lax_reference(lambda v: lax.pmax(v, "core"), x, "core", cores),
        lax_reference(lambda v: lax.pmin(v, ("device", "core")), x, "hier", cores),
        lax_reference(lambda v: lax.psum_scatter(v, "device", tiled=True), x, "device", cores),
    ]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_single_participant_axis_is_local(operand: F, verify: F) -> None:
    """v6e has one TensorCore: a collective over the core axis moves nothing."""
    x = operand((4 * 6, 128), "float32", seed=7)
    verify("v6e", "all_gather", "core", x, tiled=False)
    verify("v6e", "reduce_scatter", "core", x.reshape(4 * 6, 1, 128), scatter_dimension=1)


def test_back_to_back_kernels_sharing_an_id(
    operand: F, lax_reference: F, slice_target: SliceFactory
) -> None:
    """One program: collectives over one axis, a ppermute and a barrier twice each, in a row;
    they share collective ids as their patterns allow and every result is exact."""
    x = operand((4 * 2 * 8, 128), "float32", seed=10)
    perm = [(0, 1), (1, 2), (2, 3)]  # partial: device 0 receives zeros

    def program(v: Any) -> Any:
        a = cl.ppermute(cl.ppermute(v, "device", perm), "device", perm)
        b = cl.barrier(cl.barrier(a, "device"), "device")
        c = cl.psum(cl.all_gather(b, "device", tiled=True), "device")
        return a, b, c

    with slice_target(chip="v5p", devices=4, dma_execution_mode="on_wait", races=True) as sim:
        got = [np.asarray(g) for g in sim.run(jax.jit(program), x)]
    from jax import lax

    def reference(v: Any) -> Any:
        a = lax.ppermute(lax.ppermute(v, "device", perm), "device", perm)
        return a, a, lax.psum(lax.all_gather(a, "device", tiled=True), "device")

    for i, g in enumerate(got):
        want = lax_reference(lambda v, i=i: reference(v)[i], x, "device", 2)
        np.testing.assert_array_equal(g, want)
