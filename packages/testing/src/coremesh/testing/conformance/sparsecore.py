"""SparseCore conformance: meshes sized from the target, and the sparse kernels against jax.numpy.

A backend subclasses the suites in its own tests and overrides ``target`` (an active coremesh
target with SparseCores: the simulator or hardware), ``make_mesh`` and the op fixtures
(``gather``, ``scatter_add``, ``segment_sum``; ``embedding_bag`` if ``supports_embedding_bag``).
Capability fixtures default to False; a test for a missing capability is skipped with its reason.
``SparseCoreCompileSuite`` compiles the backend's programs for one chip (and, for chips whose
devices can be split, in split mode, where a device drives fewer SparseCores).

Every expected value is computed with numpy or jax.numpy from the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import coremesh.core as cc

_OVERRIDE = "a backend's conformance test class must override this fixture"

Op = Callable[..., Any]


def _skip_unless(flag: bool, what: str) -> None:
    if not flag:
        pytest.skip(f"the backend does not declare support for {what}")


class _Fixtures:
    @pytest.fixture
    def target(self) -> Any:
        """An active coremesh target whose chip has SparseCores."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def make_mesh(self) -> Callable[..., Any]:
        """``f(kind=CoreKind.SPARSE_VECTOR) -> mesh`` with ``axes`` for the active target."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def gather(self) -> Op:
        """``f(table, indices, *, mode) -> table[indices]``; modes 'check', 'clip', 'fill'."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def scatter_add(self) -> Op:
        """``f(table, indices, updates, *, mode) -> table.at[indices].add(updates)``."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def segment_sum(self) -> Op:
        """``f(values, segment_ids, num_segments) -> jax.ops.segment_sum(...)``."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def embedding_bag(self) -> Op:
        """``f(table, indices, offsets, *, combiner, mode)``."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def supports_bfloat16_gather(self) -> bool:
        return False

    @pytest.fixture
    def supports_embedding_bag(self) -> bool:
        return False

    @pytest.fixture
    def supports_scalar_mesh(self) -> bool:
        return False


def _width(target: Any, itemsize: int) -> int:
    """Elements in one register row of the target's SparseCore for this element size."""
    sc = target.chip.sparsecore
    assert sc is not None, f"{target.chip.name} has no SparseCore: pick another target"
    return int(sc.register_shape(itemsize)[1])


def active_sparsecores(target: Any) -> int:
    """SparseCores one device of ``target`` drives (a v5p device in split mode drives half)."""
    chip = target.chip
    return int(chip.sparsecore.cores * target.cores_per_device // chip.default_cores_per_device)


def _bags(n: int, bags: int, rng: np.random.Generator) -> np.ndarray:
    cuts = np.sort(rng.integers(0, n + 1, bags - 1))
    return np.concatenate([[0], cuts]).astype(np.int32)


class SparseCoreKernelSuite(_Fixtures):
    """SparseCore meshes and kernels on an active target, checked against jax.numpy."""

    def test_vector_mesh_spans_the_devices_subcores(self, target: Any, make_mesh: Any) -> None:
        m = make_mesh()
        sc = target.chip.sparsecore
        assert dict(m.axes) == {"core": active_sparsecores(target), "subcore": sc.subcores}

    def test_scalar_mesh_has_one_subcore_per_sparsecore(
        self, target: Any, make_mesh: Any, supports_scalar_mesh: bool
    ) -> None:
        _skip_unless(supports_scalar_mesh, "scalar-subcore meshes")
        m = make_mesh(cc.CoreKind.SPARSE_SCALAR)
        assert dict(m.axes) == {"core": active_sparsecores(target)}

    def test_gather_matches_take(self, target: Any, gather: Op) -> None:
        import jax.numpy as jnp

        rng = np.random.default_rng(0)
        cols = 2 * _width(target, 4)
        n = 3 * target.num_devices * _width(target, 4) + target.num_devices  # not whole registers
        for dtype in (np.float32, np.int32):
            table = (rng.standard_normal((45, cols)) * 100).astype(dtype)
            idx = rng.integers(0, 45, n).astype(np.int32)
            idx[:4] = [44, 0, 44, 7]  # both ends and a duplicate
            got = np.asarray(gather(jnp.asarray(table), jnp.asarray(idx), mode="check"))
            np.testing.assert_array_equal(got, table[idx])

    def test_gather_bfloat16(self, target: Any, gather: Op, supports_bfloat16_gather: bool) -> None:
        _skip_unless(supports_bfloat16_gather, "bfloat16 tables")
        import jax.numpy as jnp

        rng = np.random.default_rng(1)
        table = jnp.asarray(rng.standard_normal((19, _width(target, 2))), jnp.bfloat16)
        idx = rng.integers(0, 19, 5 * target.num_devices).astype(np.int32)
        got = np.asarray(gather(table, jnp.asarray(idx), mode="check").astype(jnp.float32))
        np.testing.assert_array_equal(got, np.asarray(table.astype(jnp.float32))[idx])

    def test_traced_out_of_range_indices_never_read_another_row(
        self, target: Any, gather: Op
    ) -> None:
        import jax
        import jax.numpy as jnp

        rows, cols = 13, _width(target, 4)
        table = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + 1
        idx = np.array([0, -1, rows, 5, rows + 100, -rows, 12, 3] * target.num_devices, np.int32)
        fill = jax.jit(lambda t, i: gather(t, i, mode="fill"))(jnp.asarray(table), idx)
        valid = (idx >= 0) & (idx < rows)
        want = np.where(valid[:, None], table[np.clip(idx, 0, rows - 1)], np.nan)
        np.testing.assert_array_equal(np.asarray(fill), want)
        clip = jax.jit(lambda t, i: gather(t, i, mode="clip"))(jnp.asarray(table), idx)
        np.testing.assert_array_equal(np.asarray(clip), table[np.clip(idx, 0, rows - 1)])

    def test_concrete_out_of_range_index_raises(self, target: Any, gather: Op) -> None:
        import jax.numpy as jnp

        table = jnp.zeros((10, _width(target, 4)), jnp.float32)
        idx = jnp.asarray([3, 10] * target.num_devices, jnp.int32)
        with pytest.raises(cc.LayoutError, match=r"indices\[1\] = 10 is outside 0\.\.9"):
            gather(table, idx, mode="check")

    def test_scatter_add_sums_each_duplicate_once(self, target: Any, scatter_add: Op) -> None:
        import jax.numpy as jnp

        rng = np.random.default_rng(2)
        rows, cols = 21, _width(target, 4)
        n = 24 * target.num_devices
        table = rng.integers(-1000, 1000, (rows, cols)).astype(np.int32)
        idx = rng.integers(0, 4, n).astype(np.int32)  # many duplicates of a few rows
        idx[-1] = rows - 1
        upd = rng.integers(-1000, 1000, (n, cols)).astype(np.int32)
        want = table.copy()
        np.add.at(want, idx, upd)
        got = scatter_add(jnp.asarray(table), jnp.asarray(idx), jnp.asarray(upd), mode="check")
        np.testing.assert_array_equal(np.asarray(got), want)

    def test_scatter_add_drops_out_of_range_indices(self, target: Any, scatter_add: Op) -> None:
        import jax

        rows, cols = 9, _width(target, 4)
        table = np.ones((rows, cols), np.float32)
        idx = np.array([0, rows, -1, 8, 0, 4, rows + 7, 2] * target.num_devices, np.int32)
        upd = np.arange(idx.size * cols, dtype=np.float32).reshape(idx.size, cols)
        want = table.copy()
        ok = (idx >= 0) & (idx < rows)
        np.add.at(want, idx[ok], upd[ok])
        f = jax.jit(lambda t, i, u: scatter_add(t, i, u, mode="drop"))
        np.testing.assert_array_equal(np.asarray(f(table, idx, upd)), want)

    def test_segment_sum_matches_jax(self, target: Any, segment_sum: Op) -> None:
        import jax
        import jax.numpy as jnp

        rng = np.random.default_rng(3)
        n, cols, segments = 40 * target.num_devices, 2 * _width(target, 4), 11
        values = rng.integers(-64, 64, (n, cols)).astype(np.float32)  # exact in float32
        ids = rng.integers(-2, segments + 2, n).astype(np.int32)  # unsorted, some dropped
        want = jax.ops.segment_sum(jnp.asarray(values), jnp.asarray(ids), segments)
        got = segment_sum(jnp.asarray(values), jnp.asarray(ids), segments)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    def test_embedding_bag_sum_and_mean(
        self, target: Any, embedding_bag: Op, supports_embedding_bag: bool
    ) -> None:
        _skip_unless(supports_embedding_bag, "embedding bags")
        import jax.numpy as jnp

        rng = np.random.default_rng(4)
        rows, cols, n, bags = 30, _width(target, 4), 16 * target.num_devices, 6
        table = rng.integers(-8, 8, (rows, cols)).astype(np.float32)
        idx = rng.integers(0, rows, n).astype(np.int32)
        offsets = _bags(n, bags, rng)
        ends = np.append(offsets[1:], n)
        sums = np.stack([table[idx[s:e]].sum(0) for s, e in zip(offsets, ends, strict=True)])
        counts = np.maximum(ends - offsets, 1)[:, None]
        t, i, o = jnp.asarray(table), jnp.asarray(idx), jnp.asarray(offsets)
        got = embedding_bag(t, i, o, combiner="sum", mode="check")
        np.testing.assert_array_equal(np.asarray(got), sums)
        got = embedding_bag(t, i, o, combiner="mean", mode="check")
        np.testing.assert_allclose(np.asarray(got), sums / counts, rtol=1e-6)


class _CompileFixtures:
    @pytest.fixture
    def chip(self) -> str:
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def sparsecore_programs(self) -> Sequence[Any]:
        """Compile-matrix programs (``coremesh.testing.aot`` Program) using SparseCores."""
        raise NotImplementedError(_OVERRIDE)


class SparseCoreCompileSuite(_CompileFixtures):
    """The backend's SparseCore programs compile with libtpu for ``chip`` in its default mode;
    chips without SparseCores report them unsupported."""

    def test_programs_compile(self, chip: str, sparsecore_programs: Sequence[Any]) -> None:
        from coremesh.testing.aot import compile_matrix

        results = compile_matrix(list(sparsecore_programs), [chip])
        assert len(results) == len(sparsecore_programs) > 0
        if cc.get_chip(chip).sparsecore is None:
            wrong = [f"{r.program}: {r.status}" for r in results if r.status != "unsupported"]
            assert not wrong, f"{chip} has no SparseCore, yet: {wrong}"
            return
        failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
        assert not failed, "\n".join(failed)


class SparseCoreSplitCompileSuite(_CompileFixtures):
    """In split mode (one TensorCore per device) a device drives fewer SparseCores: the programs
    must size their meshes for that and still compile. ``chip`` is a chip with a split mode."""

    def test_programs_compile_in_split_mode(
        self, chip: str, sparsecore_programs: Sequence[Any]
    ) -> None:
        from coremesh.testing.aot import compile_matrix

        c = cc.get_chip(chip)
        assert c.sparsecore is not None and 1 in c.core_modes and c.default_cores_per_device > 1, (
            f"{chip} has no split mode with SparseCores: give this suite v5p"
        )
        results = compile_matrix(list(sparsecore_programs), [chip], mode="split")
        failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
        assert not failed, "\n".join(failed)
        assert {r.cores_per_device for r in results} == {1}


__all__ = [
    "SparseCoreCompileSuite",
    "SparseCoreKernelSuite",
    "SparseCoreSplitCompileSuite",
    "active_sparsecores",
]
