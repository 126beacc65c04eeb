"""Shared set-up: operands, jax.lax references and the simulator matrix marker.

The simulator runs every simulated core's program on the host CPU client, and a core that waits
on a semaphore holds one of the client's execution threads; coremesh's pytest plugin asks jax for
16 host devices, enough for 4 v5p devices x 2 cores all blocked at once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from coremesh.testing.plugin import SliceFactory
    from coremesh.testing.sim.simulator import DmaMode

#: Simulated devices in every test, and the axis kinds under test.
DEVICES = 4
AXES: dict[str, Any] = {"device": "device", "core": "core", "hier": ("device", "core")}

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "matrix: the op x axis x algorithm x chip x DMA-mode simulator matrix"
    )


def participants(kind: str, cores: int) -> int:
    return {"device": DEVICES, "core": cores, "hier": DEVICES * cores}[kind]


def make_operand(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> Any:
    """Small integers in ``dtype``: sums, maxima and minima are exact in every dtype."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    lo = 0 if jnp.dtype(dtype).name.startswith("uint") else -8
    return jnp.asarray(rng.integers(lo, 8, shape).astype(np.float32)).astype(dtype)


def run_lax(fn: Callable[[Any], Any], x: Any, kind: str, cores: int) -> Any:
    """``fn`` under ``shard_map`` on plain CPU devices: a 1-d ``device`` mesh for the device
    axis, a ``(device, core)`` mesh with ``P(("device", "core"))`` specs for the core axes.

    Run it outside the simulator (which narrows ``jax.devices()`` to the simulated devices).
    """
    import jax
    import numpy as np

    devices = jax.local_devices(backend="cpu")
    auto = jax.sharding.AxisType.Auto
    if kind == "device":
        mesh = jax.sharding.Mesh(np.array(devices[:DEVICES]), ("device",), axis_types=(auto,))
        spec = jax.P("device")
    else:
        grid = np.array(devices[: DEVICES * cores]).reshape(DEVICES, cores)
        mesh = jax.sharding.Mesh(grid, ("device", "core"), axis_types=(auto, auto))
        spec = jax.P(("device", "core"))
    f = jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    return jax.tree.map(np.asarray, jax.jit(f)(x))


@pytest.fixture
def operand() -> Callable[..., Any]:
    """``operand(shape, dtype, seed=0)``: small integers, exact under every reduction."""
    return make_operand


@pytest.fixture
def lax_reference() -> Callable[..., Any]:
    """``lax_reference(fn, x, kind, cores)``: ``fn`` under ``shard_map`` on CPU devices."""
    return run_lax


def make_pair(op: str, kind: str, cores: int, /, **kw: Any) -> tuple[Any, Any]:
    """This package's collective and its jax.lax equivalent, for ``op`` (``"name"`` or
    ``"name:reduction"``) over the axis ``kind`` with ``cores`` TensorCores per device."""
    from coremesh.collectives.reference import collective, lax_equivalent, shift

    name, _, red = op.partition(":")
    n = participants(kind, cores)
    if name == "ppermute":
        kw.setdefault("perm", shift(n))
    if name == "all_to_all":
        kw = {"split_axis": 0, "concat_axis": 1, "tiled": True, **kw}
    axis = AXES[kind]
    return (
        collective(name, axis, op=red or "sum", **kw),
        lax_equivalent(name, axis, size=n, op=red or "sum", **kw),
    )


@pytest.fixture
def pair() -> Callable[..., tuple[Any, Any]]:
    """``pair(op, kind, cores, **kw)``: (coremesh collective, jax.lax equivalent)."""
    return make_pair


def verify_against_lax(
    slices: SliceFactory,
    chip: str,
    op: str,
    kind: str,
    x: Any,
    /,
    *,
    mode: DmaMode = "on_wait",
    races: bool = False,
    algorithm: str = "auto",
    **kw: Any,
) -> None:
    """Run ``op`` over ``kind`` on ``chip`` x 4 devices of ``slices`` (the plugin's
    ``slice_target``: the simulator, or the TPU in ``tpu_tests``) and assert it equals jax.lax."""
    import jax
    import numpy as np

    from coremesh.core import get_chip

    cores = get_chip(chip).default_cores_per_device
    ours, theirs = make_pair(op, kind, cores, algorithm=algorithm, **kw)
    with slices(
        chip=chip, devices=DEVICES, dma_execution_mode=mode, races=races, deadline=60
    ) as sim:
        got = np.asarray(sim.run(jax.jit(ours), x))
    want = run_lax(theirs, x, kind, cores)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.fixture
def verify(slice_target: SliceFactory) -> Callable[..., None]:
    """``verify(chip, op, kind, x, mode=, races=, algorithm=, **kw)``: equal to jax.lax."""
    return functools.partial(verify_against_lax, slice_target)
