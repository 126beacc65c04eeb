"""Collective ids from the allocator, a CostEstimate on every kernel, and the bytes model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import coremesh.collectives as cl
import coremesh.core as cc
from coremesh.collectives.cost import traffic
from coremesh.testing.plugin import SliceFactory


def kernels_in(fn: Any, *args: Any) -> list[dict[str, Any]]:
    """The Pallas kernels (mpmd_map equations) of ``fn``'s jaxpr, with their parameters."""
    found: list[dict[str, Any]] = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("mpmd_map", "pallas_call"):
                found.append(dict(eqn.params))
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.jit(fn).trace(*args).jaxpr.jaxpr)
    return found


def test_collective_ids_follow_the_communication_pattern(slice_target: SliceFactory) -> None:
    """Kernels over different axes, or ppermutes with different partners, never share an id;
    collectives over one axis share it (safe: see coremesh.collectives.sync)."""
    x = jnp.zeros((4 * 2 * 16, 128), jnp.float32)

    def program(v: Any) -> Any:
        return (
            cl.all_gather(v, "device", tiled=True, algorithm="ring"),
            cl.psum(v, ("device", "core")),
            cl.reduce_scatter(v, "core", tiled=True),
            cl.psum(v, "device"),
            cl.ppermute(v, "device", [(0, 1), (1, 0)]),
            cl.ppermute(v, "device", [(0, 2), (2, 0)]),
            cl.barrier(v, "device"),
        )

    with slice_target(chip="v5p", devices=4):
        first = kernels_in(program, x)
        again = kernels_in(program, x)  # a retrace keeps the ids
    ids = [k["compiler_params"].collective_id for k in first]
    assert len(first) == 7 and None not in ids
    ag_dev, ar_hier, rs_core, ar_dev, pp_a, pp_b, bar = ids
    assert len({ag_dev, ar_hier, rs_core, pp_a, pp_b}) == 5
    assert ag_dev == ar_dev == bar
    assert [k["compiler_params"].collective_id for k in again] == ids
    owners = cc.default_allocator().in_use
    assert owners[ag_dev] == "coremesh.collectives[device]"
    assert owners[pp_b] == "coremesh.collectives[device] ppermute [(0, 2), (2, 0)]"


def test_a_requested_id_is_claimed_and_a_taken_one_refused(slice_target: SliceFactory) -> None:
    alloc = cc.default_allocator()
    x = jnp.zeros((4 * 16, 128), jnp.float32)
    with alloc.scope(), slice_target(chip="v5e", devices=4):
        free = max(alloc.in_use, default=-1) + 10
        (k,) = kernels_in(lambda v: cl.ppermute(v, "device", [(0, 1)], collective_id=free), x)
        assert k["compiler_params"].collective_id == free
        taken = alloc.allocate("someone else's kernel")
        with pytest.raises(cc.CollectiveIdError, match='already taken by "someone else\'s kernel"'):
            cl.ppermute(x, "device", [(0, 1)], collective_id=taken)
        # The same kernel may hold several requested ids (one per call site).
        (k2,) = kernels_in(lambda v: cl.ppermute(v, "device", [(0, 1)], collective_id=free + 1), x)
        assert k2["compiler_params"].collective_id == free + 1


CASES = [
    ("all_gather", "device", {"tiled": True}),
    ("reduce_scatter", "hier", {"tiled": True}),
    ("all_reduce", "core", {}),
    ("all_to_all", "device", {}),
    ("ppermute", "hier", {}),
    ("barrier", "device", {}),
]


@pytest.mark.parametrize(("op", "kind", "kw"), CASES, ids=[c[0] for c in CASES])
def test_every_kernel_has_a_cost_estimate(
    op: str, kind: str, kw: dict[str, Any], pair: Callable[..., Any], slice_target: SliceFactory
) -> None:
    x = jnp.zeros((4 * 2 * 16, 8, 128), jnp.float32)
    ours, _ = pair(op, kind, 2, **kw)
    with slice_target(chip="v5p", devices=4):
        (k,) = kernels_in(ours, x)
    cost = k["cost_estimate"]
    assert cost is not None
    assert cost.bytes_accessed > 0
    moves = op != "barrier"
    assert (cost.remote_bytes_transferred > 0) == moves
    assert (cost.flops > 0) == (op in ("reduce_scatter", "all_reduce"))


def test_ring_bytes_meet_the_lower_bound() -> None:
    """A ring sends (n - 1) / n of the data per participant: the all-gather lower bound."""
    for n in (2, 3, 4, 8):
        for op in ("all_gather", "reduce_scatter"):
            t = traffic(op, "ring", n, 1000)
            assert t.sent == t.lower_bound == (n - 1) * 1000
            assert t.efficiency == 1.0
            assert t.busiest_link == (n - 1) * 1000
            b = traffic(op, "bidirectional", n, 1000)
            assert b.sent == t.sent and b.busiest_link == (n - 1) * 500  # half per direction
        ar = traffic("all_reduce", "ring", n, 1000)
        assert ar.sent == 2 * (n - 1) * 1000 == ar.lower_bound


def test_hierarchical_bytes_split_between_ici_and_core_links() -> None:
    # 4 devices x 2 cores, 1000-byte chunks.
    flat = traffic("all_gather", "ring", 8, 1000, devices=4, cores=2, axis_kind="hierarchical")
    two = traffic("all_gather", "hierarchical", 8, 1000, devices=4, cores=2)
    assert flat.sent == two.sent == 7000  # both meet the lower bound per participant
    assert two.ici_bytes == 2 * 3 * 1000  # each core rings its own chunks over devices
    assert two.core_link_bytes == 2 * 4 * 1000  # then the cores swap 4 chunks each
    assert two.steps == 4 < flat.steps == 7
