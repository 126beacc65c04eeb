"""TensorCore conformance: kernels, scratch, inter-core DMA, pipelines and their core splits.

A backend subclasses the suites in its own tests and overrides ``target`` (an active coremesh
target: the simulator, or hardware), ``make_mesh`` and ``make_pipeline``; capability fixtures say
what else it supports. ``TensorCoreCompileSuite`` compiles the same programs for every chip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import coremesh.core as cc
from coremesh.testing.conformance import programs

_OVERRIDE = "a backend's conformance test class must override this fixture"


class _Factories:
    @pytest.fixture
    def make_mesh(self) -> programs.MeshFactory:
        """A function returning the backend's core mesh for the active target."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def make_pipeline(self) -> programs.PipelineFactory:
        """``f(body, *, grid, in_specs, out_specs, split) -> callable on refs``."""
        raise NotImplementedError(_OVERRIDE)


class _Fixtures(_Factories):
    @pytest.fixture
    def target(self) -> Any:
        """An active coremesh target (e.g. ``with simulate(...) as sim: yield sim``)."""
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def supports_inter_core_dma(self) -> bool:
        return False

    @pytest.fixture
    def supports_manual_split(self) -> bool:
        return False


def _rows(target: Any, blocks_per_core: int = 1) -> int:
    return int(target.num_devices * target.cores_per_device * blocks_per_core * 8)


class TensorCoreKernelSuite(_Fixtures):
    """Per-core kernels: every core runs once, scratch works, cores can exchange data."""

    def test_every_core_runs_the_body_once(self, target: Any, make_mesh: Any) -> None:
        f = programs.core_ids(make_mesh, target.device_mesh())
        x = np.zeros((_rows(target), programs.LANES), np.float32)
        expected = programs.core_ids_expected(target.num_devices, target.cores_per_device)
        np.testing.assert_array_equal(np.asarray(f(x)), expected)

    def test_scratch_vmem_smem_and_dma_semaphore(self, target: Any, make_mesh: Any) -> None:
        f = programs.scratch_kernel(make_mesh, target.device_mesh())
        # Small integers in float32: every result is exact, so equality is the right check.
        x = np.random.default_rng(0).integers(-99, 99, (_rows(target), 256)).astype(np.float32)
        expected = programs.scratch_expected(x, target.num_devices, target.cores_per_device)
        np.testing.assert_array_equal(np.asarray(f(x)), expected)

    def test_kernel_dispatches_to_a_registered_backend(self, target: Any, make_mesh: Any) -> None:
        import jax
        import jax.numpy as jnp

        mesh = make_mesh()
        k = cc.kernel(
            lambda *refs: None, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh=mesh
        )
        assert isinstance(k, cc.Kernel)
        assert k.spec.meshes == (mesh,)
        assert cc.num_cores(mesh) == target.cores_per_device
        assert mesh.kind in cc.backend_for(mesh.kind).core_kinds

    def test_cores_swap_through_inter_core_dma(
        self, target: Any, make_mesh: Any, supports_inter_core_dma: bool
    ) -> None:
        if not supports_inter_core_dma:
            pytest.skip("the backend does not declare inter-core DMA")
        cid = cc.default_allocator().id_for("coremesh.conformance.swap")
        f = programs.swap(make_mesh, target.device_mesh(), cid)
        x = np.random.default_rng(1).standard_normal((8 * target.num_devices, 256))
        x = x.astype(np.float32)
        expected = programs.swap_expected(x, target.cores_per_device)
        np.testing.assert_array_equal(np.asarray(f(x)), expected)


def _owners(owner: np.ndarray, num_devices: int) -> np.ndarray:
    """The core recorded for each 8-row block, per device: shape (devices, blocks)."""
    per_block = owner[::8, 0]
    return per_block.reshape(num_devices, -1)


def _expected_owners(blocks: int, cores: int) -> np.ndarray:
    spans = cc.split_rows(blocks, cores, align=1)
    owners = np.empty(blocks, np.int32)
    for s in spans:
        owners[s.start : s.stop] = s.part
    return owners


class TensorCorePipelineSuite(_Fixtures):
    """Pipelines: results equal numpy, and each block is computed by the core the split names."""

    def _run_split(
        self, target: Any, make_mesh: Any, make_pipeline: Any, split: Any, blocks: int
    ) -> None:
        f = programs.block_owner(make_mesh, make_pipeline, target.device_mesh(), split, blocks)
        x = np.random.default_rng(2).standard_normal((target.num_devices * blocks * 8, 256))
        x = x.astype(np.float32)
        y, owner = (np.asarray(a) for a in f(x))
        np.testing.assert_array_equal(y, x + 1)
        expected = _expected_owners(blocks, target.cores_per_device)
        for device_owners in _owners(owner, target.num_devices):
            np.testing.assert_array_equal(device_owners, expected)

    def test_parallel_split_gives_each_core_its_share(
        self, target: Any, make_mesh: Any, make_pipeline: Any
    ) -> None:
        blocks = 3 * target.cores_per_device
        self._run_split(target, make_mesh, make_pipeline, cc.Parallel("core", 0), blocks)

    def test_manual_split_spreads_the_remainder(
        self, target: Any, make_mesh: Any, make_pipeline: Any, supports_manual_split: bool
    ) -> None:
        if not supports_manual_split:
            pytest.skip("the backend does not declare manual splits")
        blocks = 2 * target.cores_per_device + 1
        self._run_split(target, make_mesh, make_pipeline, cc.Manual("core", 0), blocks)

    def test_scalar_prefetch_picks_the_window(
        self, target: Any, make_mesh: Any, make_pipeline: Any
    ) -> None:
        import jax.numpy as jnp

        out_cols = 256
        f = programs.prefetched_window(make_mesh, make_pipeline, target.device_mesh(), out_cols)
        x = np.random.default_rng(3).standard_normal((_rows(target, 2), 512)).astype(np.float32)
        for off in (0, 128, 256):
            y = np.asarray(f(x, jnp.array([off], jnp.int32)))
            np.testing.assert_array_equal(y, x[:, off : off + out_cols] + 1)


Builder = Callable[[Any], Callable[..., Any]]


def _compile_programs(make_mesh: Any, make_pipeline: Any) -> list[tuple[str, Builder, Any]]:
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from coremesh.testing.aot import Arg

    rows = P("device", None)

    def args(shape: tuple[int, int], *extra: Arg) -> Callable[[int], list[Arg]]:
        return lambda n: [Arg((shape[0] * n, shape[1]), jnp.float32, rows), *extra]

    cid = cc.default_allocator().id_for("coremesh.conformance.swap")
    return [
        ("core_ids", lambda m: programs.core_ids(make_mesh, m), args((16, 128))),
        ("scratch", lambda m: programs.scratch_kernel(make_mesh, m), args((16, 256))),
        ("swap", lambda m: programs.swap(make_mesh, m, cid), args((8, 256))),
        (
            "parallel_split",
            lambda m: programs.block_owner(make_mesh, make_pipeline, m, cc.Parallel(), 4),
            args((32, 256)),
        ),
        (
            "manual_split",
            lambda m: programs.block_owner(make_mesh, make_pipeline, m, cc.Manual(), 5),
            args((40, 256)),
        ),
        (
            "scalar_prefetch",
            lambda m: programs.prefetched_window(make_mesh, make_pipeline, m, 256),
            lambda n: [Arg((32 * n, 512), jnp.float32, rows), Arg((1,), jnp.int32, P())],
        ),
    ]


class TensorCoreCompileSuite(_Factories):
    """The kernel and pipeline programs compile with libtpu for the chip in ``chip``."""

    @pytest.fixture
    def chip(self) -> str:
        raise NotImplementedError(_OVERRIDE)

    def test_programs_compile(self, chip: str, make_mesh: Any, make_pipeline: Any) -> None:
        from coremesh.testing.aot import FunctionProgram, compile_matrix

        progs = [
            FunctionProgram(name=name, builder=build, args=args)
            for name, build, args in _compile_programs(make_mesh, make_pipeline)
        ]
        results = compile_matrix(progs, [chip])
        failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
        assert not failed, "\n".join(failed)
        assert {r.program for r in results} == {p.name for p in progs}
