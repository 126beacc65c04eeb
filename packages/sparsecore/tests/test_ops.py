"""The SparseCore ops on the simulator, beyond the conformance suite: work splits, multi-pass
scatters, the VMEM-staged gather, modes, and ops inside a user's shard_map."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import coremesh.core as cc
import coremesh.sparsecore as sc
from coremesh.sparsecore.ops.bag import embedding_bag_reference
from coremesh.sparsecore.ops.scatter import plan
from coremesh.testing import simulate
from coremesh.testing.plugin import SliceFactory

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("chip", ["v5p", "v6e", "TPU7x"])
@pytest.mark.parametrize("rows", [1, 63, 64, 1000, 100_000])
def test_scatter_plan_gives_every_row_one_owner_within_vmem(chip: str, rows: int) -> None:
    c = cc.get_chip(chip)
    spec = sc.sparsecore_of(c)
    workers = spec.total_subcores
    chunk, passes = plan(rows, 256, jnp.float32, workers, c)
    assert chunk * workers * passes >= rows > chunk * workers * (passes - 1) - workers
    assert chunk * 256 * 4 <= spec.vmem_bytes_per_subcore // 2


def test_gather_from_a_vmem_staged_table_uses_load_gather(slice_target: SliceFactory) -> None:
    rng = np.random.default_rng(0)
    with slice_target("TPU7x", 1):
        table = rng.standard_normal((29, 32)).astype(np.float32)
        idx = rng.integers(0, 29, 37).astype(np.int32)
        got = sc.gather(jnp.asarray(table), jnp.asarray(idx), method="vmem")
        np.testing.assert_array_equal(np.asarray(got), table[idx])


def test_scatter_add_in_several_passes_per_subcore(slice_target: SliceFactory) -> None:
    """chunk_rows=1 on 2 x 16 subcores: 70 rows take 3 passes, and a remainder of padded rows."""
    rng = np.random.default_rng(1)
    with slice_target("v6e", 1):
        table = rng.integers(-9, 9, (70, 8)).astype(np.float32)
        idx = rng.integers(0, 70, 48).astype(np.int32)
        idx[:6] = [69, 69, 0, 0, 35, 69]
        upd = rng.integers(-9, 9, (48, 8)).astype(np.float32)
        want = table.copy()
        np.add.at(want, idx, upd)
        got = sc.scatter_add(jnp.asarray(table), jnp.asarray(idx), jnp.asarray(upd), chunk_rows=1)
        np.testing.assert_array_equal(np.asarray(got), want)


def test_scatter_add_clip_and_segment_sum_check(slice_target: SliceFactory) -> None:
    with slice_target("v5p", 1):
        table = np.zeros((6, 8), np.int32)
        idx = np.array([-3, 0, 5, 9], np.int32)
        upd = np.arange(32, dtype=np.int32).reshape(4, 8)
        want = table.copy()
        np.add.at(want, np.clip(idx, 0, 5), upd)
        got = jax.jit(lambda t, i, u: sc.scatter_add(t, i, u, mode="clip"))(table, idx, upd)
        np.testing.assert_array_equal(np.asarray(got), want)
        ids = np.array([2, 0, 2, 1], np.int32)
        got = sc.segment_sum(jnp.asarray(upd), jnp.asarray(ids), 3, mode="check")
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.ops.segment_sum(upd, ids, 3)))


def test_embedding_bag_drops_bad_indices_and_empty_bags_are_zero(
    slice_target: SliceFactory,
) -> None:
    with slice_target("v5p", 1):
        table = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)
        idx = np.array([1, 10, 3, -2, 4, 4, 9], np.int32)
        offsets = np.array([0, 2, 2, 5], np.int32)  # bag 1 is empty; bag 0 has one bad index
        for combiner in ("sum", "mean"):
            got = jax.jit(
                lambda t, i, o, c=combiner: sc.embedding_bag(t, i, o, combiner=c, mode="drop")
            )(table, idx, offsets)
            want = embedding_bag_reference(table, idx, offsets, combiner=combiner, mode="drop")
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            ends = np.append(offsets[1:], idx.size)
            ok = (idx >= 0) & (idx < 10)
            hand = [
                table[idx[s:e][ok[s:e]]].sum(0)
                / (max(int(ok[s:e].sum()), 1) if combiner == "mean" else 1)
                for s, e in zip(offsets, ends, strict=True)
            ]
            np.testing.assert_array_equal(np.asarray(got), np.stack(hand))


def test_ops_inside_a_users_shard_map_see_their_shard(slice_target: SliceFactory) -> None:
    rng = np.random.default_rng(2)
    with slice_target("v5p", 2) as sim:
        table = rng.standard_normal((20, 8)).astype(np.float32)
        idx = rng.integers(0, 20, 16).astype(np.int32)

        @jax.jit
        def f(t: Any, i: Any) -> Any:
            return jax.shard_map(
                lambda tl, il: sc.gather(tl, il, mode="clip"),
                mesh=sim.device_mesh(),
                in_specs=(P(), P("device")),
                out_specs=P("device"),
                check_vma=False,
            )(t, i)

        np.testing.assert_array_equal(np.asarray(f(table, idx)), table[idx])


def test_mpmd_kernel_runs_on_the_simulator() -> None:
    with simulate("v5p", 1):
        meshes = [sc.mesh(), sc.mesh(cc.CoreKind.SPARSE_SCALAR)]
        k = sc.kernel(
            [pltpu.sync_copy, lambda x, o: None],
            out_type=jax.ShapeDtypeStruct((16,), jnp.int32),
            mesh=meshes,
        )
        x = jnp.arange(16, dtype=jnp.int32)
        np.testing.assert_array_equal(np.asarray(jax.jit(k)(x)), np.asarray(x))
        with pytest.raises(cc.MeshError, match="2 bodies for 1 meshes"):
            sc.kernel([lambda *r: None] * 2, out_type=(), mesh=meshes[:1])
        with pytest.raises(cc.MeshError, match="same kind"):
            sc.kernel([lambda *r: None] * 2, out_type=(), mesh=[meshes[0], meshes[0]])


def test_split_mode_mesh_drives_half_the_sparsecores(slice_target: SliceFactory) -> None:
    with slice_target("v5p", 1, cores_per_device=1):
        assert sc.mesh().num_cores == 2 and sc.mesh().num_workers == 32
    with slice_target("v5p", 1):
        assert sc.mesh().num_cores == 4 and sc.mesh().num_workers == 64


@pytest.mark.parametrize("chip", ["v5p", "TPU7x"])
def test_kernel_over_vector_subcores_and_over_scalar_subcores(
    chip: str, slice_target: SliceFactory
) -> None:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    with slice_target(chip, 1):
        vm = sc.mesh()
        lanes = sc.register_width(jnp.int32, vm.chip)

        def vector(o_hbm: Any) -> None:  # each subcore writes one register: its lane ids
            w = jax.lax.axis_index("core") * vm.num_subcores + jax.lax.axis_index("subcore")

            def body(v: Any) -> None:
                v[...] = w * lanes + jax.lax.iota(jnp.int32, lanes)
                pltpu.sync_copy(v, o_hbm.at[pl.ds(w * lanes, lanes)])

            pl.run_scoped(body, pltpu.VMEM((lanes,), jnp.int32))

        out = jax.ShapeDtypeStruct((vm.num_workers * lanes,), jnp.int32)
        got = jax.jit(sc.kernel(vector, out_type=out, mesh=vm))()
        np.testing.assert_array_equal(np.asarray(got), np.arange(vm.num_workers * lanes))

        sm = sc.mesh(cc.CoreKind.SPARSE_SCALAR)

        def scalar(x_hbm: Any, o_hbm: Any) -> None:  # each SparseCore copies its 8 words
            c = jax.lax.axis_index("core")
            pltpu.sync_copy(x_hbm.at[pl.ds(c * 8, 8)], o_hbm.at[pl.ds(c * 8, 8)])

        x = jnp.arange(sm.num_cores * 8, dtype=jnp.int32) * 3 - 5
        k = sc.kernel(scalar, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=sm)
        np.testing.assert_array_equal(np.asarray(jax.jit(k)(x)), np.asarray(x))


def test_no_indices_gives_no_rows_and_leaves_the_table(slice_target: SliceFactory) -> None:
    with slice_target("v6e", 1):
        table = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)
        none = jnp.zeros((0,), jnp.int32)
        assert sc.gather(table, none).shape == (0, 8)
        got = sc.scatter_add(table, none, jnp.zeros((0, 8), jnp.float32))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(table))
        got = sc.segment_sum(jnp.zeros((0, 8), jnp.int32), none, 3)
        np.testing.assert_array_equal(np.asarray(got), np.zeros((3, 8), np.int32))


@pytest.mark.parametrize("dma", ["eager", "on_wait"])
def test_double_buffered_gather_has_no_race(dma: str) -> None:
    """Several groups per subcore: group i+1's row DMAs overlap group i's write-out; the
    simulator's race detector must stay quiet and the rows must be right in both DMA orders."""
    rng = np.random.default_rng(5)
    with simulate("v6e", 1, races=True, dma_execution_mode=dma):
        table = rng.standard_normal((50, 8)).astype(np.float32)
        idx = rng.integers(0, 50, 32 * 8 * 2 + 13).astype(np.int32)  # 2-3 groups per subcore
        got = sc.gather(jnp.asarray(table), jnp.asarray(idx))
        np.testing.assert_array_equal(np.asarray(got), table[idx])


def test_row_ownership_keeps_subcores_from_racing() -> None:
    """Every subcore scans the same indices and writes only its own chunk: no race reported,
    with many duplicates of rows that sit in different subcores' chunks."""
    rng = np.random.default_rng(6)
    with simulate("v6e", 1, races=True):
        values = rng.integers(-9, 9, (40, 8)).astype(np.int32)
        ids = rng.integers(0, 70, 40).astype(np.int32)
        got = sc.segment_sum(jnp.asarray(values), jnp.asarray(ids), 70, chunk_rows=2)
        np.testing.assert_array_equal(
            np.asarray(got), np.asarray(jax.ops.segment_sum(values, ids, 70))
        )


@pytest.mark.parametrize(
    ("n", "row_bytes", "group"),
    [
        (32 * 56 * 2, 512, 56),  # two 56-row buffers fit in a quarter of v6e's 256 KiB
        (32 * 20, 512, 16),  # a worker's share (20) up to 8 lanes is 24; 16 divides 640
        (4096, 512, 32),  # 56 fit, 32 divides 4096: no padding, no slice of the result
        (2**20, 64, 128),  # at most 128
        (10**6, 64, 80),  # the largest multiple of 8 up to 128 dividing 10**6
        (1001, 64, 24),  # 1001 up to 8 lanes is 1008: 24 divides it, 32 (a share) does not
        (10**6, 4096, 8),  # rows too large for more: one register row
    ],
)
def test_indexed_dma_group_rows(n: int, row_bytes: int, group: int) -> None:
    from coremesh.sparsecore.ops.gather import group_rows

    spec = sc.sparsecore_of(cc.get_chip("v6e"))
    assert group_rows(n, row_bytes, 8, spec.total_subcores, spec.vmem_bytes_per_subcore) == group


@pytest.mark.parametrize("dma", ["eager", "on_wait"])
@pytest.mark.parametrize(("dtype", "cols"), [(np.float32, 1024), (jnp.bfloat16, 2048)])
def test_gather_by_indexed_dmas(dma: str, dtype: Any, cols: int) -> None:
    """Rows of whole 128-word tiles come in groups, one indexed DMA (table.at[idx_ref]) per
    group, 2-3 groups per subcore of v6e, double-buffered: no race, numpy's rows."""
    from coremesh.sparsecore.ops.gather import indexed

    assert indexed(cols, dtype) and not indexed(8, np.float32) and not indexed(128, jnp.bfloat16)
    rng = np.random.default_rng(7)
    table = rng.standard_normal((40, cols)).astype(dtype)
    idx = rng.integers(0, 40, 32 * 8 * 2 + 13).astype(np.int32)
    with simulate("v6e", 1, races=True, dma_execution_mode=dma):
        got = sc.gather(jnp.asarray(table), jnp.asarray(idx))
    np.testing.assert_array_equal(np.asarray(got), table[idx])
