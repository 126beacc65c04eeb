"""The compiled fast path (simulate(fast_path=...)): the same results and the same checks as the
interpreter, and the right path, with its reason, for each kernel."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core.errors import CapacityError, CoremeshError
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.shipped import KERNELS
from coremesh.testing.sim import (
    Schedule,
    SimulationFault,
    Simulator,
    UninitializedReadError,
    simulate,
)

pytestmark = pytest.mark.sim

X = jax.ShapeDtypeStruct((16, 128), jnp.float32)
XS = np.random.default_rng(0).standard_normal((16, 128)).astype(np.float32)


def only_path(sim: Simulator) -> str:
    paths = set(sim.paths.values())
    assert len(paths) == 1, sim.paths
    return paths.pop()


def doubled(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2.0


def double() -> Any:
    return pl.pallas_call(
        doubled,
        out_shape=X,
        grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
    )


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_each_guide_program_gives_the_same_result_both_ways(name: str) -> None:
    program = PROGRAMS[name]
    results = []
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast) as sim:
            mesh = sim.mesh()
            inputs = program.make_inputs(mesh, seed=3)
            results.append(np.asarray(sim.run(program.build(mesh), *inputs)))
            want = program.expected(*(np.asarray(a) for a in inputs), num_cores=2)
            assert sim.paths, "no kernel ran"
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], want)


@pytest.mark.parametrize("name", ["matmul", "flash_attention"])
def test_shipped_kernels_run_compiled_and_match_the_interpreter(name: str) -> None:
    kernel = KERNELS[name]
    inputs = kernel.inputs(1)
    want = np.asarray(kernel.reference(*inputs))
    results = {}
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast) as sim:
            results[fast] = np.asarray(sim.run(kernel.kernel(sim.device_mesh()), *inputs))
            assert only_path(sim) == (
                "compiled" if fast else "interpreted: simulate(fast_path=False)"
            )
    for got in results.values():
        np.testing.assert_allclose(got, want, atol=kernel.atol, rtol=kernel.rtol)
    np.testing.assert_allclose(results[True], results[False], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("add_one", "compiled"),
        ("indexed_add_one", "compiled"),
        ("swap_kernel", "interpreted: get_barrier_semaphore"),
        ("sc_add_one", "interpreted: a DMA of a slice whose size is known only at run time"),
    ],
)
def test_guide_kernels_over_a_core_mesh_take_the_path_they_can_and_say_why(
    name: str, reason: str
) -> None:
    program = PROGRAMS[name]
    with simulate("v5p", 1, fast_path=True) as sim:
        mesh = sim.mesh()
        sim.run(program.build(mesh), *program.make_inputs(mesh))
    assert only_path(sim).startswith(reason)


def copy_by_dma(x_ref: Any, o_ref: Any) -> None:
    def body(sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()

    pl.run_scoped(body, pltpu.SemaphoreType.DMA(()))


def test_a_dma_kernel_is_interpreted() -> None:
    with simulate("v5p", 1, fast_path=True) as sim:
        out = sim.run(pl.pallas_call(copy_by_dma, out_shape=X), XS)
    np.testing.assert_array_equal(np.asarray(out), XS)
    assert "run_scoped" in only_path(sim) or "dma" in only_path(sim)


def test_by_default_a_small_kernel_is_interpreted_and_a_large_one_compiled() -> None:
    # double() makes 8 memory accesses as run (2 grid steps x a load, a store and 2 block
    # copies); the guide's add_one 6,148 on a device (3,074 on each of its 2 cores).
    with simulate("v5p", 1) as sim:
        out = sim.run(double(), XS)
        np.testing.assert_array_equal(np.asarray(out), XS * 2)
        assert only_path(sim) == (
            "interpreted: a small kernel (8 memory accesses as run, 4 as written): interpreting "
            "it costs less than compiling it (simulate(fast_path=True) compiles it anyway)"
        )
        mesh = sim.mesh()
        program = PROGRAMS["add_one"]
        (x,) = program.make_inputs(mesh)
        np.testing.assert_array_equal(np.asarray(sim.run(program.build(mesh), x)), x + 1)
        assert sim.paths["add_one_kernel (guide.py:93)"] == "compiled"


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"races": True}, "races=True"),
        ({"schedule": Schedule("random", seed=0)}, "schedule="),
        # a regression test that leaves a fix out asks for the interpreter without it
        ({"disable_patches": ["signal_core"]}, "disable_patches=['signal_core']"),
    ],
)
def test_simulator_wide_checks_send_every_kernel_to_the_interpreter(
    options: dict[str, Any], reason: str
) -> None:
    with simulate("v5p", 1, fast_path=True, **options) as sim:
        out = sim.run(double(), XS)
    np.testing.assert_array_equal(np.asarray(out), XS * 2)
    assert only_path(sim).startswith(f"interpreted: {reason}")


def test_without_the_uninitialized_read_check_kernels_still_run_compiled() -> None:
    with simulate("v5p", 1, check_uninitialized=False, fast_path=True) as sim:
        out = sim.run(double(), XS)
    np.testing.assert_array_equal(np.asarray(out), XS * 2)
    assert only_path(sim) == "compiled"


def test_a_calls_own_interpret_params_send_it_to_the_interpreter() -> None:
    with simulate("v5p", 1, fast_path=True) as sim:
        params = pltpu.InterpretParams(detect_races=True)
        sim.run(pl.pallas_call(doubled, out_shape=X, interpret=params), XS)
    assert only_path(sim) == "interpreted: the call's own InterpretParams set detect_races"


def test_fast_path_is_validated() -> None:
    with pytest.raises(CoremeshError, match="fast_path"):
        simulate(fast_path="yes")  # type: ignore[arg-type]


def test_vmem_over_capacity_is_refused_on_the_fast_path() -> None:
    f = pl.pallas_call(
        lambda x_ref, o_ref, s_ref: doubled(x_ref, o_ref),
        out_shape=X,
        scratch_shapes=[pltpu.VMEM((65536, 1024), jnp.float32)],  # 256 MiB
    )
    with simulate("v5p", 1, fast_path=True), pytest.raises(CapacityError, match="VMEM"):
        jax.block_until_ready(f(XS))


def rows_at(start: int) -> Any:
    def body(s_ref: Any, x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[pl.ds(s_ref[0], 8), :]

    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((16, 128), lambda: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda: (0, 0)),
    )


def test_a_dynamic_load_in_bounds_runs_and_one_out_of_bounds_faults() -> None:
    with simulate("v5p", 1, fast_path=True) as sim:
        out = sim.run(rows_at(0), np.array([8], np.int32), XS)
        np.testing.assert_array_equal(np.asarray(out), XS[8:])
        assert only_path(sim) == "compiled"
        with pytest.raises(SimulationFault, match="out of bounds") as info:
            sim.run(rows_at(0), np.array([12], np.int32), XS)
    assert "12..19" in str(info.value)


def test_a_block_index_out_of_bounds_faults_on_the_fast_path() -> None:
    f = pl.pallas_call(
        doubled,
        out_shape=X,
        grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i + 1, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
    )
    with (
        simulate("v5p", 1, fast_path=True) as sim,
        pytest.raises(SimulationFault, match="block index"),
    ):
        sim.run(f, XS)


def top_half(x_ref: Any, o_ref: Any) -> None:
    o_ref[0:8, :] = x_ref[0:8, :]


def test_an_output_half_written_holds_the_fill_on_both_paths() -> None:
    # Elements a kernel never writes are not an error (only values computed from unwritten
    # memory are); both paths leave the fill there.
    f = pl.pallas_call(top_half, out_shape=X)
    outs = []
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast):
            outs.append(np.asarray(jax.block_until_ready(f(XS))))
    for out in outs:
        np.testing.assert_array_equal(out[:8], np.asarray(XS)[:8])
        assert np.isnan(out[8:]).all()


def test_a_value_computed_from_unwritten_scratch_raises_on_the_fast_path() -> None:
    def body(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
        o_ref[...] = x_ref[...] * 3.0 + s_ref[...]

    f = pl.pallas_call(body, out_shape=X, scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32)])
    with simulate("v5p", 1, fast_path=True) as sim, pytest.raises(UninitializedReadError) as info:
        sim.run(f, XS)
    assert only_path(sim) == "compiled"
    # Found compiled, explained by the interpreter re-running the kernel: the first read named.
    assert "the run first read unwritten memory here: a load of unwritten memory" in str(info.value)
    assert info.value.location is not None and "test_fast_path.py" in info.value.location
    assert info.value.buffer is not None and info.value.buffer.startswith("VMEM float32[16,128]")


def test_integer_scratch_is_interpreted_while_the_check_is_on() -> None:
    def body(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
        s_ref[0] = 2
        o_ref[...] = x_ref[...] * s_ref[0].astype(jnp.float32)

    f = pl.pallas_call(body, out_shape=X, scratch_shapes=[pltpu.SMEM((4,), jnp.int32)])
    for check, path in ((True, "interpreted: a int32 output or scratch"), (False, "compiled")):
        with simulate("v5p", 1, fast_path=True, check_uninitialized=check) as sim:
            np.testing.assert_array_equal(np.asarray(sim.run(f, XS)), XS * 2)
        assert only_path(sim).startswith(path)


def sums(body: Any) -> Any:
    """Per row block, the sum of 4 column blocks into VMEM scratch: grid (parallel, arbitrary)."""
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        grid=(2, 4),
        in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, k))],
        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )


def sum_per_block(x_ref: Any, o_ref: Any, acc: Any) -> None:
    @pl.when(pl.program_id(1) == 0)
    def _() -> None:
        acc[...] = jnp.zeros_like(acc)

    acc[...] += x_ref[...]
    o_ref[...] = acc[...]


def sum_init_once(x_ref: Any, o_ref: Any, acc: Any) -> None:
    # Correct on one core; on two, core 1 starts at row block 1 with scratch never written.
    @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
    def _() -> None:
        acc[...] = jnp.zeros_like(acc)

    acc[...] += x_ref[...]
    o_ref[...] = acc[...]


def test_parallel_grid_on_two_cores_matches_numpy_and_the_interpreter() -> None:
    x = np.random.default_rng(1).standard_normal((16, 512)).astype(np.float32)
    want = x.reshape(16, 4, 128).sum(axis=1)
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast) as sim:
            assert sim.cores_per_device == 2
            np.testing.assert_allclose(np.asarray(sim.run(sums(sum_per_block), x)), want, rtol=1e-5)


def test_scratch_is_fresh_on_each_core_as_in_the_interpreter() -> None:
    x = np.ones((16, 512), np.float32)
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast), pytest.raises(UninitializedReadError):
            jax.block_until_ready(sums(sum_init_once)(x))
    with simulate("v5p", 1, fast_path=True, cores_per_device=1) as sim:
        out = np.asarray(sim.run(sums(sum_init_once), x))
    assert only_path(sim) == "compiled"
    np.testing.assert_array_equal(out[8:], 4.0 + np.ones((8, 128)) * 4.0)


def test_scalar_prefetch_steers_the_blocks_on_both_paths() -> None:
    def body(order_ref: Any, x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] + order_ref[pl.program_id(0)].astype(jnp.float32)

    f = pl.pallas_call(
        body,
        out_shape=X,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, order: (order[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, order: (i, 0)),
        ),
    )
    order = np.array([1, 0], np.int32)
    want = np.concatenate([XS[8:] + 1, XS[:8]])
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast) as sim:
            np.testing.assert_array_equal(np.asarray(sim.run(f, order, XS)), want)
        assert only_path(sim) == ("compiled" if fast else "interpreted: simulate(fast_path=False)")


def scaled_by_step(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * (pl.program_id(0) + 1).astype(jnp.float32)


def test_each_cores_blocks_land_where_the_interpreter_puts_them() -> None:
    # 8 row blocks (the last partial) over 2 cores, visited in the simulator's seeded order, so
    # each core's share is scattered over the output: the compiled path runs the shares at
    # once on host threads and merges what each wrote.
    x = np.random.default_rng(2).standard_normal((60, 128)).astype(np.float32)
    f = pl.pallas_call(
        scaled_by_step,
        out_shape=jax.ShapeDtypeStruct((60, 128), jnp.float32),
        grid=(8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )
    want = x * np.repeat(np.arange(1, 9, dtype=np.float32), 8)[:60, None]
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast) as sim:
            np.testing.assert_array_equal(np.asarray(sim.run(f, x)), want)
        assert only_path(sim) == ("compiled" if fast else "interpreted: simulate(fast_path=False)")


@pytest.mark.parametrize("step", [0, 1, 2, 3])
def test_a_fault_in_either_cores_share_is_raised_on_the_fast_path(step: int) -> None:
    # Only one grid step reads past its ref, in one core's share (run on a host thread).
    def body(x_ref: Any, o_ref: Any) -> None:
        start = jnp.where(pl.program_id(0) == step, 12, 0)
        o_ref[...] = x_ref[pl.ds(start, 8), :]

    f = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        grid=(4,),
        in_specs=[pl.BlockSpec((16, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )
    with simulate("v5p", 1, fast_path=True) as sim:
        with pytest.raises(SimulationFault, match="out of bounds") as info:
            sim.run(f, XS)
        assert only_path(sim) == "compiled"
    assert "12..19" in str(info.value)


def test_largest_product_counts_multiply_adds_in_nested_jaxprs() -> None:
    from coremesh.testing.sim.jaxprs import largest_product

    def f(a: Any, b: Any, w: Any) -> Any:
        small = jnp.dot(a, b)  # (8, 16) x (16, 32): 8 * 32 * 16 multiply-adds
        # the largest, inside a loop: (8, 32) x (32, 32), 8 * 32 * 32
        return jax.lax.fori_loop(0, 2, lambda i, x: jnp.dot(x, w), small)

    args = (jnp.zeros((8, 16)), jnp.zeros((16, 32)), jnp.zeros((32, 32)))
    assert largest_product(jax.make_jaxpr(f)(*args)) == 8 * 32 * 32
    batched = jax.make_jaxpr(lambda c: jnp.einsum("bik,bkj->bij", c, c))(jnp.zeros((2, 4, 4)))
    assert largest_product(batched) == 2 * 4 * 4 * 4
    assert largest_product(jax.make_jaxpr(lambda x: x + 1)(jnp.zeros(3))) == 0
