"""simulate(): what jax sees inside the context, bad input, nesting, and clean exit."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core import jax_compat, jax_versions
from coremesh.core.chips import get_chip
from coremesh.core.dtypes import BOOL_OPERANDS_SINCE
from coremesh.core.errors import ChipError, CoremeshError, MeshError, UnsupportedOnChipError
from coremesh.core.targets import Target, current_target
from coremesh.testing.sim import PATCH_NAMES, Simulator, patches, simulate

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("name", ["v4", "v5e", "v5p", "v6e", "TPU7x"])
def test_tpu_info_and_core_mesh_answer_for_the_simulated_chip(name: str) -> None:
    chip = get_chip(name)
    with simulate(chip=name, devices=2) as sim:
        info = pltpu.get_tpu_info()
        assert info.num_cores == chip.default_cores_per_device
        assert str(info.chip_version) == {"TPU7x": "7x"}.get(name, name)
        mesh = jax_compat.tensorcore_mesh("core")
        assert dict(mesh.shape) == {"core": chip.default_cores_per_device}
        assert sim.cores_per_device == chip.default_cores_per_device
        if chip.sparsecore is None:
            assert info.sparse_core is None
        else:
            sc = info.sparse_core
            assert (sc.num_cores, sc.num_subcores, sc.num_lanes) == (
                chip.sparsecore.cores,
                chip.sparsecore.subcores,
                chip.sparsecore.lanes,
            )


def test_jax_devices_are_the_simulated_devices() -> None:
    assert len(jax.devices("cpu")) >= 4  # the plugin asked for 16 host devices
    with simulate(devices=4) as sim:
        assert jax.device_count() == 4
        assert len(jax.devices()) == 4 == jax.local_device_count()
        assert tuple(jax.devices()) == sim.devices
        assert jax.make_mesh((jax.device_count(),), ("device",)).size == 4
    with simulate(devices=1):
        assert jax.device_count() == 1


def test_v5p_in_one_core_mode() -> None:
    with simulate(chip="v5p", devices=1, cores_per_device=1):
        assert pltpu.get_tpu_info().num_cores == 1
        assert dict(jax_compat.tensorcore_mesh("core").shape) == {"core": 1}


def test_outside_the_context_jax_is_untouched() -> None:
    # Keyed by id: some targets (a closure cell) are not hashable.
    before = {(id(obj), attr): getattr(obj, attr, None) for obj, attr in _patched_attributes()}
    assert len(before) >= 10
    with simulate(devices=2):
        inside = {(id(obj), attr): getattr(obj, attr) for obj, attr in _patched_attributes()}
    after = {(id(obj), attr): getattr(obj, attr, None) for obj, attr in _patched_attributes()}
    assert after == before
    assert all(inside[k] is not before[k] for k in before)
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        pltpu.get_tpu_info()


def _patched_attributes() -> list[tuple[object, str]]:
    """Every attribute a patch this jax needs swaps."""
    return [
        (obj, attr)
        for patch in patches.PATCHES
        if patch.needed()
        for obj, attr, _ in patch.targets()
    ]


def test_simulator_is_the_current_target() -> None:
    with simulate(chip="v6e", devices=2) as sim:
        assert isinstance(sim, Target)
        assert current_target() is sim
        assert sim.chip.name == "v6e"
        assert sim.num_devices == 2


def test_the_simulator_owns_the_one_chip_record_the_rest_reads() -> None:
    with simulate(chip="v6e", devices=1) as sim:
        record = sim.simulated_chip
        assert sim.interpret_params.chip is record  # the params carry it, no copy
        assert patches.installed_chip() is record  # the patches read it
        assert (sim.chip, sim.cores_per_device) == (record.chip, record.cores_per_device)
        assert pltpu.get_tpu_info().num_cores == record.tpu_info.num_cores == 1
    # It keys jax's caches: equal for the same chip and mode, different across chips or modes.
    params = [
        simulate(c, 1, cores_per_device=n).interpret_params
        for c, n in [("v5p", 2), ("v5p", 2), ("v5p", 1), ("v6e", 1)]
    ]
    assert params[0] == params[1] and hash(params[0]) == hash(params[1])
    assert len({params[0], params[2], params[3]}) == 3


def test_nested_contexts_answer_for_the_innermost_chip() -> None:
    with simulate(chip="v5p", devices=2):
        assert pltpu.get_tpu_info().num_cores == 2
        with simulate(chip="v6e", devices=1):
            assert pltpu.get_tpu_info().num_cores == 1
            assert jax.device_count() == 1
        assert pltpu.get_tpu_info().num_cores == 2
        assert jax.device_count() == 2
    assert patches.installed_chip() is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"chip": "v9z"}, ChipError, "unknown chip 'v9z'"),
        ({"chip": "v5e", "cores_per_device": 2}, ChipError, "no mode with 2 TensorCore"),
        ({"devices": 0}, MeshError, "devices=0"),
        ({"dma_execution_mode": "lazy"}, CoremeshError, "dma_execution_mode='lazy'"),
        ({"deadline": 0}, CoremeshError, "deadline=0"),
        ({"uninitialized_memory": "junk"}, CoremeshError, "uninitialized_memory"),
        ({"disable_patches": ["nope"]}, CoremeshError, "unknown simulator patch"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        simulate(**kwargs)  # type: ignore[arg-type]
    assert patches.installed_chip() is None


def test_more_host_devices_than_jax_started_with_is_a_clear_error() -> None:
    have = len(jax.devices("cpu"))
    with pytest.raises(CoremeshError, match=f"already started with {have}") as info:
        simulate(devices=have + 1).__enter__()
    assert "JAX_NUM_CPU_DEVICES" in str(info.value)
    assert info.value.chip == "v5p"  # the simulated chip the devices were for
    assert patches.installed_chip() is None


def test_a_core_mesh_larger_than_the_device_is_refused() -> None:
    # jax 0.10.2 refuses at create_tensorcore_mesh; TensorCoreMesh (0.11+) has no hook there,
    # so the kernel call refuses it.
    ok = jax.ShapeDtypeStruct((8, 128), jnp.float32)

    def build_and_call() -> None:
        mesh = jax_compat.tensorcore_mesh("core", num_cores=2)
        jax.jit(pl.kernel(lambda x, o: None, out_type=ok, mesh=mesh))(jnp.zeros((8, 128)))

    with (
        simulate(chip="v6e", devices=1),
        pytest.raises(MeshError, match=r"2 (TensorC|c)ores on a device with 1"),
    ):
        build_and_call()


def test_a_chip_without_sparsecore_refuses_sparsecore_meshes() -> None:
    with simulate(chip="v5e", devices=1):
        with pytest.raises(UnsupportedOnChipError, match="v5e has no SparseCore") as info:
            plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
        assert info.value.chip == "v5e"
        with pytest.raises(UnsupportedOnChipError):
            plsc.ScalarSubcoreMesh(axis_name="core")


@pytest.mark.parametrize("dtype", ["float16", "bool"])
def test_operands_mosaic_refuses_are_refused(dtype: str) -> None:
    # Stock interpret mode copies these; Mosaic refuses float16 on every TPU and jax 0.10 a bool
    # DMA (see core.dtypes.check_operand_dtype, sim.operands and tests/sim/test_operands.py).
    def copy(x_hbm: Any, o_hbm: Any) -> None:
        pltpu.sync_copy(x_hbm, o_hbm)

    with simulate(chip="v6e", devices=1):
        x = jnp.zeros((8, 128), dtype)
        f = pl.kernel(copy, out_type=x, mesh=jax_compat.tensorcore_mesh("core"))
        if dtype == "bool" and jax_versions.at_least(BOOL_OPERANDS_SINCE):
            x = jnp.arange(8 * 128).reshape(8, 128) % 3 == 0
            np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), np.asarray(x))
            return
        # jax 0.10: the bool copy is the DMA Mosaic refuses (bool operands alone it lowers).
        refused = "DMAs with bool dtypes" if dtype == "bool" else "float16 cannot be a TPU kernel"
        with pytest.raises(UnsupportedOnChipError, match=refused) as e:
            jax.jit(f)(x)
        assert e.value.chip == "v6e"
        ok = jnp.zeros((8, 128), jnp.bfloat16)
        f = pl.kernel(copy, out_type=ok, mesh=jax_compat.tensorcore_mesh("core"))
        assert jax.jit(f)(ok).dtype == jnp.bfloat16


def test_devices_exist_only_inside() -> None:
    sim = Simulator("v5p", 2)
    with pytest.raises(CoremeshError, match="only inside its context"):
        _ = sim.devices
    with sim:
        assert len(sim.devices) == 2


def test_jax_versions_outside_the_tested_range() -> None:
    import warnings

    from coremesh.core import jax_versions
    from coremesh.core.errors import CoremeshWarning

    for tested in jax_versions.TESTED:
        patches.check_jax_version(tested)
    with pytest.raises(CoremeshError, match=r"jax 0\.9\.1 is installed.*at least jax 0\.10\.2"):
        patches.check_jax_version("0.9.1")
    with pytest.warns(CoremeshWarning, match=r"jax 0\.13\.0 is newer.*0\.10\.2 to 0\.12\.0\.1"):
        patches.check_jax_version("0.13.0")
    with warnings.catch_warnings():  # once per version
        warnings.simplefilter("error")
        patches.check_jax_version("0.13.0")
    assert set(PATCH_NAMES) == {name for name, _ in patches.describe()}


def test_device_mesh_reshards_plain_arrays() -> None:
    from functools import partial

    import numpy as np

    with simulate(chip="v5p", devices=4) as sim:
        mesh = sim.device_mesh()
        assert mesh.axis_types == (jax.sharding.AxisType.Auto,)

        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=jax.P("device"), out_specs=jax.P("device"))
        def f(x: jax.Array) -> jax.Array:
            return x * jax.lax.axis_index("device")

        got = np.asarray(f(np.ones(8, np.float32)))  # a host array, resharded by shard_map
        np.testing.assert_array_equal(got, [0, 0, 1, 1, 2, 2, 3, 3])


def _visit_order_kernel() -> Any:
    """A pallas_call over 8 PARALLEL grid points; block i records when it was visited."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def body(o_ref: Any, step: Any) -> None:
        o_ref[...] = jnp.full(o_ref.shape, step[0], jnp.int32)
        step[0] = step[0] + 1

    return pl.pallas_call(
        body,
        grid=(8,),
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((64, 128), jnp.int32),
        scratch_shapes=[pltpu.SMEM((1,), jnp.int32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )


def test_grid_seed_chooses_the_parallel_grid_order() -> None:
    import numpy as np

    def visit_order(seed: int | None) -> Any:
        # The visit counter starts from the zero fill (each core's own scratch), which the
        # uninitialized-read check would rightly refuse.
        with simulate(
            "v5e", 1, grid_seed=seed, uninitialized_memory="zero", check_uninitialized=False
        ) as sim:
            return np.asarray(sim.run(jax.jit(_visit_order_kernel())))[::8, 0]

    orders = {seed: visit_order(seed) for seed in (None, 0, 1, 2)}
    for order in orders.values():
        np.testing.assert_array_equal(np.sort(order), np.arange(8))  # each point exactly once
    np.testing.assert_array_equal(orders[None], orders[0])  # None is the interpreter's seed 0
    np.testing.assert_array_equal(visit_order(1), orders[1])  # a seed is reproducible
    assert len({tuple(o) for o in orders.values()}) >= 2  # and seeds differ


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_grid_seed(seed: Any) -> None:
    with pytest.raises(CoremeshError, match="grid_seed"):
        simulate("v5p", 1, grid_seed=seed)
