"""``sim.host_mappings``: compiled programs hold memory mappings (XLA:CPU crashes past the
limit), and dropping them gives the mappings back while kernels still run right after."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.testing.sim import host_mappings, simulate
from coremesh.testing.upstream import shims

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(host_mappings.count() is None, reason="needs /proc (Linux)"),
]


def _double_plus_one(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2 + 1


def _run(rows: int) -> None:
    """A kernel over ``rows`` x 128 (every size a program of its own, and one for each of v5p's
    two cores, which share its grid), against numpy."""
    x = np.arange(rows * 128, dtype=np.float32).reshape(rows, 128)
    spec = pl.BlockSpec((rows // 2, 128), lambda i: (i, 0))
    f = jax.jit(
        lambda a: pl.pallas_call(
            _double_plus_one,
            out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
            grid=(2,),
            in_specs=[spec],
            out_specs=spec,
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(a)
    )
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), x * 2 + 1)


def test_dropping_compiled_programs_gives_their_mappings_back() -> None:
    with simulate("v5p", devices=1):
        start = host_mappings.count()
        for i in range(12):
            _run(16 * (i + 1))
        grown = host_mappings.count()
        assert start is not None and grown is not None and grown > start + 12  # a few each
        host_mappings.drop_compiled()
        dropped = host_mappings.count()
        assert dropped is not None and dropped < grown - 12
        _run(16)  # compiled again where needed
        _run(32)


def test_relieve_drops_only_past_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(host_mappings, "drop_compiled", lambda: calls.append("drop"))
    assert not host_mappings.relieve(1.0)  # a process never holds more than the limit
    assert calls == []
    assert host_mappings.relieve(0.0)
    assert calls == ["drop"]


def test_the_upstream_runner_replaces_a_process_still_over_three_quarters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After dropping what it can, a test process holding more than 75% of the mappings a
    process may stops after its test (the runner goes on in a new one); under that it goes on."""
    monkeypatch.setattr(host_mappings, "drop_compiled", lambda: None)
    held = host_mappings.count()
    assert held is not None
    under: Any = SimpleNamespace(session=SimpleNamespace(shouldstop=False))
    monkeypatch.setattr(host_mappings, "limit", lambda: 2 * held + 1000)  # under half
    shims._relieve_mappings(under)
    assert under.session.shouldstop is False
    over: Any = SimpleNamespace(session=SimpleNamespace(shouldstop=False))
    monkeypatch.setattr(host_mappings, "limit", lambda: int(held / 0.8))  # over three quarters
    shims._relieve_mappings(over)
    assert "memory mappings" in str(over.session.shouldstop)
