"""SparseCore programs compile with libtpu: the MPMD kernel, and split mode's SparseCore count."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import coremesh.core as cc
import coremesh.sparsecore as sc
from coremesh.sparsecore.programs import programs
from coremesh.testing.aot import Arg, compile_matrix, target_program


def _mpmd(x: Any) -> Any:
    """Vector subcores add one to their slice; the scalar subcores run alongside (MPMD)."""
    vm, sm = sc.mesh(), sc.mesh(cc.CoreKind.SPARSE_SCALAR)
    lanes = sc.register_width(jnp.int32, vm.chip)

    def vector(x_hbm: Any, o_hbm: Any) -> None:
        w = jax.lax.axis_index("core") * vm.num_subcores + jax.lax.axis_index("subcore")

        def body(xv: Any, ov: Any) -> None:
            pltpu.sync_copy(x_hbm.at[pl.ds(w * lanes, lanes)], xv)
            ov[...] = xv[...] + 1
            pltpu.sync_copy(ov, o_hbm.at[pl.ds(w * lanes, lanes)])

        pl.run_scoped(body, pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes,), jnp.int32))

    def scalar(x_hbm: Any, o_hbm: Any) -> None:
        del x_hbm, o_hbm

    k = sc.kernel(
        [vector, scalar],
        out_type=jax.ShapeDtypeStruct((vm.num_workers * lanes,), jnp.int32),
        mesh=[vm, sm],
    )
    devices = cc.current_target().device_mesh()
    return jax.shard_map(
        k, mesh=devices, in_specs=P("device"), out_specs=P("device"), check_vma=False
    )(x)


@pytest.mark.aot
def test_mpmd_vector_and_scalar_subcores_compile() -> None:
    def args(n: int) -> list[Arg]:
        return [Arg((n * 64 * 16,), jnp.int32, P("device"))]

    prog = target_program(_mpmd, args, name="mpmd", uses_sparsecore=True)
    results = compile_matrix([prog], ["v5p", "v6e", "TPU7x"])
    assert [r.status for r in results] == ["ok"] * 3, [str(r.error) for r in results]


@pytest.mark.aot
def test_split_mode_needs_the_split_sparsecore_count() -> None:
    """A v5p split device drives 2 SparseCores: the target's mesh compiles, 4 cores do not."""

    def gather_with(mesh_cores: int | None) -> Any:
        def f(t: Any, i: Any) -> Any:
            target = cc.current_target()
            m = sc.SparseCoreMesh(target.chip, cores_per_device=mesh_cores) if mesh_cores else None
            return sc.gather(t, i, mode="clip", mesh=m)

        return f

    def args(n: int) -> list[Arg]:
        return [Arg((256, 128), jnp.float32), Arg((64 * n,), jnp.int32, P("device"))]

    ok, wrong = (
        target_program(gather_with(c), args, name=f"g{c}", uses_sparsecore=True) for c in (None, 2)
    )
    good, bad = compile_matrix([ok, wrong], ["v5p"], mode="split")
    assert good.ok, good.error
    assert not bad.ok and "split mode" in str(bad.error)


def test_programs_are_registered_for_the_compile_matrix() -> None:
    (ep,) = [e for e in entry_points(group="coremesh.programs") if e.name == "sparsecore"]
    assert ep.load() is programs
    names = {p.name for p in programs()}
    assert {"sparsecore.gather_float32", "sparsecore.scatter_add_float32"} <= names
    assert all(p.uses_sparsecore for p in programs())
