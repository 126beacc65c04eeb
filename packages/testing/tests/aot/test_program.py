"""(fn, args) pairs with a real Pallas kernel: the shard_map stays, and every chip compiles.

``jax.shard_map`` without ``mesh=`` keeps the first mesh it is traced under, so these compile for
two chips with different meshes (v5p: 2 TensorCores per device, v6e: 1): a program built for the
first chip only fails on the second.
"""

from __future__ import annotations

from pathlib import Path

import jax

from coremesh.testing.aot import compile_matrix, load
from coremesh.testing.aot.program import ContextMeshProgram

#: A user's file: a Pallas kernel over the chip's TensorCores inside a mesh-free shard_map, as a
#: jitted and as a plain pair.
KERNELS = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.aot import Arg

ROWS = jax.P("device", None)


def add_one_block(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def add_one_kernel(x_hbm, o_hbm):
    pltpu.emit_pipeline(
        add_one_block,
        grid=(x_hbm.shape[0] // 8, x_hbm.shape[1] // 128),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        core_axis_name="core",
        dimension_semantics=(pltpu.PARALLEL, pltpu.ARBITRARY),
    )(x_hbm, o_hbm)


def add_one(x):
    cores = jax_compat.tensorcore_mesh("core")
    return pl.kernel(add_one_kernel, out_type=x, mesh=cores, scratch_types=[])(x)


ARGS = [Arg((256, 512), jnp.float32, ROWS)]
sharded_add_one = jax.shard_map(add_one, in_specs=ROWS, out_specs=ROWS, check_vma=False)
PAIRS = {
    "jitted": (jax.jit(sharded_add_one), ARGS),
    "plain": (sharded_add_one, ARGS),
}
"""


def write_kernels(directory: Path, stem: str) -> Path:
    path = directory / f"{stem}.py"
    path.write_text(KERNELS)
    return path


def test_a_jitted_pair_loses_only_its_jit(tmp_path: Path) -> None:
    path = write_kernels(tmp_path, "pairs_unwrap")
    jitted, plain = load(f"{path}:PAIRS")
    assert isinstance(jitted, ContextMeshProgram) and isinstance(plain, ContextMeshProgram)
    sharded = plain.fn
    assert jitted.fn is sharded  # the jit's own function: the shard_map, not add_one
    assert getattr(getattr(sharded, "__wrapped__", None), "__name__", None) == "add_one"
    sources = [str(p.source) for p in (jitted, plain)]
    assert sources == [f"{path}:PAIRS[jitted]", f"{path}:PAIRS[plain]"]
    assert jax.tree.leaves(jitted.in_specs()) == jax.tree.leaves((jax.P("device", None),))


def test_a_pallas_kernel_pair_compiles_for_every_chip_jitted_or_not(tmp_path: Path) -> None:
    path = write_kernels(tmp_path, "pairs_compile")
    programs = load(f"{path}:PAIRS")
    results = compile_matrix(programs, ["v5p", "v6e"])
    assert [(r.chip, r.status) for r in results] == [
        ("v5p", "ok"),
        ("v6e", "ok"),
        ("v5p", "ok"),
        ("v6e", "ok"),
    ], [str(r.error) for r in results]
    assert {r.program for r in results} == {"add_one"}  # the shard_map keeps its function's name
    for r in results:
        # 4 devices on each chip, rows split over them: 64 x 512 float32 in, as many out.
        assert r.num_devices == 4
        assert r.memory is not None
        assert r.memory.argument_bytes == 64 * 512 * 4
        assert r.memory.output_bytes == 64 * 512 * 4
    assert [r.cores_per_device for r in results[:2]] == [2, 1]  # v5p megacore, v6e
