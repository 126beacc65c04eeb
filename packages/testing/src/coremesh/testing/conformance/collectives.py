"""Collectives conformance: each collective equals ``jax.lax``'s own on the same operands.

A package of collectives subclasses ``CollectivesSuite`` in its tests and overrides ``target``
(an active coremesh target: the simulator, or hardware) and ``collective`` (its array functions
by name); ``algorithms`` names what each axis runs, and the capability fixtures turn on the axes
over cores. Each collective runs inside ``shard_map`` over the target's device mesh on one
device's operand. The expected value is ``jax.lax``'s collective over the same participants,
computed by ``vmap`` with a named axis (participant ``device * cores + core``), which needs no
devices, so the reference runs the same way on every target.

Axes: ``"device"`` (one participant per device), ``"core"`` (the cores of each device; core
``c``'s operand is slice ``c`` of the device's first dim) and ``("device", "core")`` (every core
of every device). Operands are small integers in float32, so every sum is exact.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

_OVERRIDE = "a collectives conformance test class must override this fixture"

Fn = Callable[[Any], Any]
#: ``(v, axis_name) -> value``: a ``jax.lax`` collective on one participant's operand.
LaxFn = Callable[[Any, str], Any]

AXES: dict[str, Any] = {"device": "device", "core": "core", "device_core": ("device", "core")}
_PARTICIPANTS = "participants"  # the vmap axis of the reference


class _Fixtures:
    @pytest.fixture
    def target(self) -> Any:
        """An active coremesh target (e.g. ``with simulate(...) as sim: yield sim``)."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def collective(self) -> Callable[..., Fn]:
        """``f(name, axis, *, algorithm="auto", op="sum", perm=(), **lax_keywords) -> fn``.

        ``name`` is one of barrier, ppermute, all_gather, reduce_scatter (``jax.lax``'s
        ``psum_scatter``), all_reduce (``psum`` / ``pmax`` / ``pmin``) and all_to_all;
        ``fn`` is called inside ``shard_map`` on one device's operand.
        """
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def algorithms(self) -> dict[str, Sequence[str]]:
        """The algorithms of the gather / scatter / reduce collectives, per axis kind."""
        return dict.fromkeys(AXES, ("auto",))

    @pytest.fixture
    def supports_core_axis(self) -> bool:
        return False

    @pytest.fixture
    def supports_device_core_axis(self) -> bool:
        return False


def _participants(target: Any, kind: str) -> tuple[int, int]:
    """(groups, participants per group) of the axis ``kind`` on ``target``."""
    d, c = int(target.num_devices), int(target.cores_per_device)
    return {"device": (1, d), "core": (d, c), "device_core": (1, d * c)}[kind]


def _operand(target: Any, kind: str, shape: Sequence[int], seed: int) -> np.ndarray:
    """One operand of ``shape`` per participant, stacked along the first dim."""
    groups, size = _participants(target, kind)
    full = (groups * size * shape[0], *shape[1:])
    return np.random.default_rng(seed).integers(-8, 8, full).astype(np.float32)


def _lax(ref: LaxFn, x: np.ndarray, target: Any, kind: str) -> np.ndarray:
    """``ref`` on every participant's slice of ``x``, results stacked along the first dim."""
    import jax

    groups, size = _participants(target, kind)
    xs = x.reshape(groups, size, x.shape[0] // (groups * size), *x.shape[1:])
    per_group = jax.vmap(lambda v: ref(v, _PARTICIPANTS), axis_name=_PARTICIPANTS)
    out = np.asarray(jax.jit(jax.vmap(per_group))(xs))
    return out.reshape(-1, *out.shape[3:])


def run_per_device(target: Any, fn: Fn, x: Any) -> np.ndarray:
    """``fn`` on each device's share of ``x`` (``shard_map`` over the target's devices).

    Shared with the collectives' own tests, which run their kernels the same way.
    """
    import jax

    f = jax.shard_map(
        fn,
        mesh=target.device_mesh(),
        in_specs=jax.P("device"),
        out_specs=jax.P("device"),
        check_vma=False,
    )
    # The simulator's run also fails on the races its detector found.
    run = getattr(target, "run", None)
    out = run(jax.jit(f), x) if run is not None else jax.jit(f)(x)
    return np.asarray(out)


class CollectivesSuite(_Fixtures):
    """Every collective over every axis the package declares, equal to ``jax.lax``."""

    @pytest.fixture(params=list(AXES))
    def kind(
        self,
        request: pytest.FixtureRequest,
        supports_core_axis: bool,
        supports_device_core_axis: bool,
    ) -> str:
        kind = str(request.param)
        if kind == "core" and not supports_core_axis:
            pytest.skip("the package does not declare collectives over the core axis")
        if kind == "device_core" and not supports_device_core_axis:
            pytest.skip("the package does not declare collectives over (device, core)")
        return kind

    def _check(
        self,
        target: Any,
        kind: str,
        fn: Fn,
        ref: LaxFn,
        shape: Sequence[int],
        *,
        what: str,
        seed: int = 0,
    ) -> None:
        x = _operand(target, kind, shape, seed)
        got, want = run_per_device(target, fn, x), _lax(ref, x, target, kind)
        assert got.shape == want.shape, f"{what}: shape {got.shape}, jax.lax gives {want.shape}"
        np.testing.assert_array_equal(got, want, err_msg=what)

    def _size(self, target: Any, kind: str) -> int:
        return _participants(target, kind)[1]

    def test_all_gather(
        self, target: Any, kind: str, collective: Any, algorithms: dict[str, Sequence[str]]
    ) -> None:
        from jax import lax

        cases: list[tuple[str, tuple[int, ...], bool]]
        cases = [(algorithm, (6, 3, 40), True) for algorithm in algorithms[kind]]
        cases.append(("auto", (2, 128), False))
        for algorithm, shape, tiled in cases:
            self._check(
                target,
                kind,
                collective("all_gather", AXES[kind], algorithm=algorithm, tiled=tiled),
                functools.partial(lax.all_gather, tiled=tiled),
                shape,
                what=f"all_gather over {kind} ({algorithm}, {shape}, tiled={tiled})",
            )

    def test_reduce_scatter(
        self, target: Any, kind: str, collective: Any, algorithms: dict[str, Sequence[str]]
    ) -> None:
        from jax import lax

        n = self._size(target, kind)
        for algorithm in algorithms[kind]:
            self._check(
                target,
                kind,
                collective("reduce_scatter", AXES[kind], algorithm=algorithm, tiled=True),
                lambda v, a: lax.psum_scatter(v, a, tiled=True),
                (4 * n, 5, 40),
                what=f"reduce_scatter over {kind} ({algorithm})",
                seed=1,
            )

    def test_all_reduce(
        self, target: Any, kind: str, collective: Any, algorithms: dict[str, Sequence[str]]
    ) -> None:
        from jax import lax

        n = self._size(target, kind)
        cases = [("sum", algorithm) for algorithm in algorithms[kind]]
        cases += [("max", "auto"), ("min", "auto")]
        lax_op = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}
        for op, algorithm in cases:
            self._check(
                target,
                kind,
                collective("all_reduce", AXES[kind], algorithm=algorithm, op=op),
                lax_op[op],
                (4 * n, 5, 40),
                what=f"all_reduce {op} over {kind} ({algorithm})",
                seed=2,
            )

    def test_all_to_all(self, target: Any, kind: str, collective: Any) -> None:
        from jax import lax

        n = self._size(target, kind)
        kw = {"split_axis": 0, "concat_axis": 1, "tiled": True}
        self._check(
            target,
            kind,
            collective("all_to_all", AXES[kind], **kw),
            lambda v, a: lax.all_to_all(v, a, 0, 1, tiled=True),
            (2 * n, 3, 40),
            what=f"all_to_all over {kind}",
            seed=3,
        )

    def test_ppermute(self, target: Any, kind: str, collective: Any) -> None:
        """A full shift, and a partial permutation: who receives nothing gets zeros."""
        from jax import lax

        n = self._size(target, kind)
        shift = [(i, (i + 1) % n) for i in range(n)]
        self._check(
            target,
            kind,
            collective("ppermute", AXES[kind], perm=shift),
            functools.partial(lax.ppermute, perm=shift),
            (6, 5, 40),
            what=f"ppermute (shift) over {kind}",
            seed=4,
        )
        # jax.lax.ppermute under vmap takes only full permutations: this one's meaning by hand.
        x = _operand(target, kind, (6, 5, 40), seed=6)
        got = run_per_device(target, collective("ppermute", AXES[kind], perm=[(n - 1, 0)]), x)
        groups, _ = _participants(target, kind)
        xs = x.reshape(groups, n, -1, *x.shape[1:])
        want = np.zeros_like(xs)
        want[:, 0] = xs[:, n - 1]
        np.testing.assert_array_equal(
            got, want.reshape(x.shape), err_msg=f"ppermute [({n - 1}, 0)] over {kind}"
        )

    def test_barrier(self, target: Any, kind: str, collective: Any) -> None:
        """Every participant passes its operand through unchanged (``jax.lax`` has no barrier)."""
        self._check(
            target,
            kind,
            collective("barrier", AXES[kind]),
            lambda v, a: v,
            (6, 5, 40),
            what=f"barrier over {kind}",
            seed=5,
        )
