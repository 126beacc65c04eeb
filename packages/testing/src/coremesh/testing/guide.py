"""The core_map guide's five programs as a reusable corpus.

The guide (Pallas "core-specific programming", see ``seed/core_map_guide``) is the reference for
core-level programming, so its programs are the first thing every coremesh target must run: the
simulator executes them, the compile-only matrix compiles them for every TPU generation, the demo
shows them. Kernel bodies are the guide's own; the only changes are the ones jax 0.10.2 needs
(``pl.kernel`` spells ``out_shape``/``scratch_shapes`` as ``out_type``/``scratch_types``) and that
the guide's module-level globals (``num_cores``, ``sc_num_cores``...) are bound from the mesh the
program builds, so one source answers for whatever target is active.

Each program builds a jitted function: ``shard_map`` over the device mesh axis ``"device"``, with
the core mesh created *inside* the traced function from ``pltpu.create_tensorcore_mesh("core")``
(``pltpu.TensorCoreMesh(axis_name="core")`` from jax 0.11) or ``pltpu.get_tpu_info().sparse_core``,
as the guide does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from coremesh.core import jax_compat
from coremesh.core.errors import LayoutError, UnsupportedOnChipError

#: SparseCore register op shape of the guide: (4, 16) int32.
SC_REG_OP_SHAPE = (4, 16)


# --------------------------------------------------------------------------------------------
# Kernel bodies, as the guide writes them.
# --------------------------------------------------------------------------------------------


def swap_cores_kernel(
    in_hbm: Any,
    out_hbm: Any,
    in_vmem: Any,
    scratch_vmem: Any,
    out_vmem: Any,
    sem: Any,
    send_sem: Any,
    recv_sem: Any,
) -> None:
    """Each core doubles its column slice and hands it to the next core (guide, section 1)."""
    core_index = jax.lax.axis_index("core")
    num_cores = jax.lax.axis_size("core")
    slc_size = in_hbm.shape[-1] // num_cores
    slc = pl.ds(core_index * slc_size, slc_size)

    # Copy this core's slice of the input.
    pltpu.async_copy(in_hbm.at[:, slc], in_vmem, sem).wait()

    # Barrier: every core has entered run_scoped before any core sends.
    dst_core = (core_index + 1) % num_cores
    sem0 = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(sem0, 1, device_id={"core": dst_core})
    pl.semaphore_wait(sem0, 1)

    # Exchange data between the cores.
    the_copy = pltpu.make_async_remote_copy(
        in_vmem,
        scratch_vmem,
        send_sem,
        recv_sem,
        device_id={"core": dst_core},
    )
    the_copy.start()
    the_copy.wait()

    # Core-local compute.
    out_vmem[...] = scratch_vmem[...] * 2

    # Copy the output.
    pltpu.async_copy(out_vmem, out_hbm.at[:, slc], sem).wait()


def add_one_body(in_vmem: Any, out_vmem: Any) -> None:
    out_vmem[...] = in_vmem[...] + 1


def add_one_kernel(x_hbm_ref: Any, o_hbm_ref: Any) -> None:
    """emit_pipeline with the row axis split across cores (PARALLEL), guide section 3."""
    in_shape = x_hbm_ref.shape
    pltpu.emit_pipeline(
        add_one_body,
        grid=(in_shape[0] // 8, in_shape[1] // 128),
        in_specs=[pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i, j))],
        out_specs=[pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i, j))],
        core_axis_name="core",
        dimension_semantics=(pltpu.PARALLEL, pltpu.ARBITRARY),
    )(x_hbm_ref, o_hbm_ref)


def indexed_add_one_kernel(
    in_refs: Any, out_refs: Any, i_smem_ref: Any, *, num_cores: int, output_cols: int
) -> None:
    """Scalar prefetch of a column offset and a manual row split by core index (section 4)."""
    (x_hbm_ref, i_hbm_ref), o_hbm_ref = in_refs, out_refs
    in_shape = x_hbm_ref.shape
    pltpu.sync_copy(i_hbm_ref, i_smem_ref)

    core_idx = jax.lax.axis_index("core")
    core_slc_size = in_shape[0] // num_cores

    def i_map(i: Any) -> Any:  # split the rows between cores
        return core_idx * core_slc_size // 8 + i

    def j_map(j: Any) -> Any:  # use the prefetched column offset
        return i_smem_ref[0] // 128 + j

    pltpu.emit_pipeline(
        add_one_body,
        grid=(core_slc_size // 8, output_cols // 128),
        in_specs=[pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i_map(i), j_map(j)))],
        out_specs=[pl.BlockSpec(block_shape=(8, 128), index_map=lambda i, j: (i_map(i), j))],
    )(x_hbm_ref, o_hbm_ref)


def sc_add_one_body(in_vmem: Any, out_vmem: Any) -> None:
    @pl.loop(0, in_vmem.shape[0], step=SC_REG_OP_SHAPE[0])
    def _reg_loop_0(c0: Any) -> None:
        @pl.loop(0, in_vmem.shape[1], step=SC_REG_OP_SHAPE[1])
        def _reg_loop_1(c1: Any) -> None:
            slc = (pl.ds(c0, SC_REG_OP_SHAPE[0]), pl.ds(c1, SC_REG_OP_SHAPE[1]))
            out_vmem[slc] = in_vmem[slc] + 1


def sc_add_one_kernel(
    x_hbm_ref: Any, o_hbm_ref: Any, *, sc_num_cores: int, sc_num_subcores: int
) -> None:
    """add_one on every vector subcore of every SparseCore (guide section 5)."""
    in_shape = x_hbm_ref.shape
    core_idx = jax.lax.axis_index("core")
    subcore_idx = jax.lax.axis_index("subcore")
    cm_idx = core_idx * sc_num_subcores + subcore_idx  # index on the core_map
    slc_size = in_shape[0] // (sc_num_subcores * sc_num_cores)

    def index_map(i: Any, j: Any) -> Any:
        return (pl.ds(pl.multiple_of(cm_idx * slc_size + i * 8, 8), 8), j)

    pltpu.emit_pipeline(
        sc_add_one_body,
        grid=(slc_size // 8, in_shape[1] // 128),
        in_specs=[pl.BlockSpec(block_shape=(pl.BoundedSlice(8), 128), index_map=index_map)],
        out_specs=[pl.BlockSpec(block_shape=(pl.BoundedSlice(8), 128), index_map=index_map)],
    )(x_hbm_ref, o_hbm_ref)


# --------------------------------------------------------------------------------------------
# The corpus.
# --------------------------------------------------------------------------------------------

ROWS = P("device", None)


def _tensorcore_mesh() -> Any:
    # The guide writes pltpu.create_tensorcore_mesh("core"); jax 0.11 deprecates it for
    # pltpu.TensorCoreMesh(axis_name="core"). Each line gets its own spelling.
    return jax_compat.tensorcore_mesh("core")


def _num_cores(tc_mesh: Any) -> int:
    # The guide's len(tc_mesh.devices); the mesh has no .devices from jax 0.11.
    return jax_compat.mesh_cores(tc_mesh)


def _sparsecore_mesh() -> tuple[Any, int, int]:
    """The guide's VectorSubcoreMesh over every SparseCore of the active chip."""
    sc_info = pltpu.get_tpu_info().sparse_core
    if sc_info is None:
        chip = str(pltpu.get_tpu_info().chip_version)
        raise UnsupportedOnChipError(
            "this program runs on SparseCore vector subcores, and the chip has no SparseCore",
            rule="plsc.VectorSubcoreMesh needs a chip with SparseCores (v5p, v6e, TPU7x)",
            chip=chip,
            fix="run it on a chip with SparseCores, or skip programs with uses_sparsecore=True",
        )
    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=sc_info.num_cores
    )
    return mesh, sc_info.num_cores, sc_info.num_subcores


def _check_rows(name: str, shape: tuple[int, int], num_devices: int, multiple: int) -> None:
    if num_devices < 1 or shape[0] % (num_devices * multiple):
        raise LayoutError(
            f"{name}: {shape[0]} rows cannot be split over {num_devices} device(s) "
            f"in blocks of {multiple}",
            rule=f"rows must be a multiple of devices x {multiple}",
            fix=f"use a row count divisible by {max(num_devices, 1) * multiple}",
        )


@dataclasses.dataclass(frozen=True)
class GuideProgram:
    """One program of the guide: how to build it, its inputs, and an independent reference."""

    name: str
    uses_sparsecore: bool

    def build(self, mesh: jax.sharding.Mesh) -> Callable[..., Any]:
        """A jitted function: ``shard_map`` over ``mesh`` axis ``"device"``."""
        raise NotImplementedError

    def arg_specs(self, num_devices: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        """Global shapes and dtypes of the arguments (no sharding)."""
        raise NotImplementedError

    def in_specs(self) -> tuple[P, ...]:
        return (ROWS,)

    def make_inputs(self, mesh: jax.sharding.Mesh, seed: int = 0) -> tuple[jax.Array, ...]:
        """Random inputs as the guide makes them, placed with ``NamedSharding`` on ``mesh``."""
        specs = self.arg_specs(mesh.shape["device"])
        arrays = self._random(specs, seed)
        return tuple(
            jax.device_put(a, NamedSharding(mesh, s))
            for a, s in zip(arrays, self.in_specs(), strict=True)
        )

    def _random(self, specs: tuple[jax.ShapeDtypeStruct, ...], seed: int) -> list[jax.Array]:
        (x,) = specs
        return [jax.random.normal(jax.random.key(seed), x.shape, x.dtype)]

    def expected(self, *inputs: np.ndarray, num_cores: int | None = None) -> np.ndarray:
        """The result computed with numpy alone.

        ``num_cores`` (TensorCores per device) matters only to programs whose result depends on
        it (the swaps); it defaults to the active coremesh target's.
        """
        raise NotImplementedError


def _cores_of_current_target() -> int:
    from coremesh.core.targets import current_target

    return current_target().cores_per_device


@dataclasses.dataclass(frozen=True)
class _Swap(GuideProgram):
    shape: tuple[int, int] = (32, 256)

    def arg_specs(self, num_devices: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        _check_rows(self.name, self.shape, num_devices, 1)
        return (jax.ShapeDtypeStruct(self.shape, jnp.float32),)

    def expected(self, *inputs: np.ndarray, num_cores: int | None = None) -> np.ndarray:
        (x,) = (np.asarray(a) for a in inputs)
        cores = num_cores if num_cores is not None else _cores_of_current_target()
        width = x.shape[1] // cores
        y = np.empty_like(x)
        for core in range(cores):  # core c receives the slice of core c - 1, doubled
            src = (core - 1) % cores
            y[:, core * width : (core + 1) * width] = x[:, src * width : (src + 1) * width] * 2
        return y


@dataclasses.dataclass(frozen=True)
class SwapCoreMap(_Swap):
    """Swap between cores with ``pl.core_map`` + ``pl.run_scoped`` (guide section 1)."""

    name: str = "swap_core_map"
    uses_sparsecore: bool = False

    def build(self, mesh: jax.sharding.Mesh) -> Callable[..., Any]:
        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=ROWS, out_specs=ROWS, check_vma=False)
        def swap_cores(x: Any) -> Any:
            tc_mesh = _tensorcore_mesh()
            num_cores = _num_cores(tc_mesh)
            local_vmem_shape = (x.shape[0], x.shape[1] // num_cores)
            x_hbm_ref = jax.new_ref(x)
            o_hbm_ref = jax.new_ref(jax.lax.empty(x.shape, x.dtype))

            @pl.core_map(tc_mesh, compiler_params=pltpu.CompilerParams(collective_id=0))
            def _() -> None:
                pl.run_scoped(
                    partial(swap_cores_kernel, x_hbm_ref, o_hbm_ref),
                    *([pltpu.VMEM(local_vmem_shape, x.dtype)] * 3),
                    *([pltpu.SemaphoreType.DMA] * 3),
                )

            return o_hbm_ref[...]

        return cast("Callable[..., Any]", swap_cores)


@dataclasses.dataclass(frozen=True)
class SwapKernel(_Swap):
    """The same swap through ``pl.kernel`` (guide section 2)."""

    name: str = "swap_kernel"
    uses_sparsecore: bool = False

    def build(self, mesh: jax.sharding.Mesh) -> Callable[..., Any]:
        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=ROWS, out_specs=ROWS, check_vma=False)
        def swap_cores(x: Any) -> Any:
            tc_mesh = _tensorcore_mesh()
            num_cores = _num_cores(tc_mesh)
            local_vmem_shape = (x.shape[0], x.shape[1] // num_cores)
            scratch_shapes = [pltpu.VMEM(local_vmem_shape, x.dtype)] * 3 + [
                pltpu.SemaphoreType.DMA
            ] * 3
            return pl.kernel(
                swap_cores_kernel,
                out_type=x,
                mesh=tc_mesh,
                scratch_types=scratch_shapes,
                compiler_params=pltpu.CompilerParams(collective_id=0),
            )(x)

        return cast("Callable[..., Any]", swap_cores)


@dataclasses.dataclass(frozen=True)
class AddOne(GuideProgram):
    """``emit_pipeline`` with a PARALLEL core split (guide section 3)."""

    name: str = "add_one"
    uses_sparsecore: bool = False
    shape: tuple[int, int] = (1024, 1024)

    def build(self, mesh: jax.sharding.Mesh) -> Callable[..., Any]:
        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=ROWS, out_specs=ROWS, check_vma=False)
        def add_one(x: Any) -> Any:
            tc_mesh = _tensorcore_mesh()
            return pl.kernel(add_one_kernel, out_type=x, mesh=tc_mesh, scratch_types=[])(x)

        return cast("Callable[..., Any]", add_one)

    def arg_specs(self, num_devices: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        _check_rows(self.name, self.shape, num_devices, 8)
        return (jax.ShapeDtypeStruct(self.shape, jnp.float32),)

    def expected(self, *inputs: np.ndarray, num_cores: int | None = None) -> np.ndarray:
        del num_cores  # the result does not depend on the core count
        (x,) = inputs
        return np.asarray(x) + 1


@dataclasses.dataclass(frozen=True)
class IndexedAddOne(GuideProgram):
    """Scalar prefetch with a manual core split (guide section 4)."""

    name: str = "indexed_add_one"
    uses_sparsecore: bool = False
    shape: tuple[int, int] = (1024, 1024)
    output_cols: int = 512
    index: int = 256

    def build(self, mesh: jax.sharding.Mesh) -> Callable[..., Any]:
        output_cols = self.output_cols

        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=(ROWS, P()), out_specs=ROWS, check_vma=False)
        def indexed_add_one(x: Any, index: Any) -> Any:
            tc_mesh = _tensorcore_mesh()
            out_shape = jax.ShapeDtypeStruct((x.shape[0], output_cols), x.dtype)
            kernel = partial(
                indexed_add_one_kernel, num_cores=_num_cores(tc_mesh), output_cols=output_cols
            )
            return pl.kernel(
                kernel,
                out_type=out_shape,
                mesh=tc_mesh,
                scratch_types=[pltpu.SMEM((1,), jnp.int32)],
            )((x, index))

        return cast("Callable[..., Any]", indexed_add_one)

    def arg_specs(self, num_devices: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        _check_rows(self.name, self.shape, num_devices, 8)
        if (
            self.index % 128
            or self.output_cols % 128
            or self.index + self.output_cols > (self.shape[1])
        ):
            raise LayoutError(
                f"{self.name}: columns [{self.index}, {self.index + self.output_cols}) of a "
                f"{self.shape[1]}-column input",
                rule="the offset and width are multiples of 128 and stay inside the input",
                fix="pick index and output_cols as multiples of 128 that fit",
            )
        return (
            jax.ShapeDtypeStruct(self.shape, jnp.float32),
            jax.ShapeDtypeStruct((1,), jnp.int32),
        )

    def in_specs(self) -> tuple[P, ...]:
        return (ROWS, P())

    def _random(self, specs: tuple[jax.ShapeDtypeStruct, ...], seed: int) -> list[jax.Array]:
        x, _ = specs
        return [
            jax.random.normal(jax.random.key(seed), x.shape, x.dtype),
            jnp.array([self.index], jnp.int32),
        ]

    def expected(self, *inputs: np.ndarray, num_cores: int | None = None) -> np.ndarray:
        del num_cores  # the result does not depend on the core count
        x, index = (np.asarray(a) for a in inputs)
        start = int(index[0])
        return x[:, start : start + self.output_cols] + 1


@dataclasses.dataclass(frozen=True)
class ScAddOne(GuideProgram):
    """add_one over every vector subcore of every SparseCore (guide section 5)."""

    name: str = "sc_add_one"
    uses_sparsecore: bool = True
    shape: tuple[int, int] = (4096, 128)

    def build(self, mesh: jax.sharding.Mesh) -> Callable[..., Any]:
        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=ROWS, out_specs=ROWS, check_vma=False)
        def sc_add_one(x: Any) -> Any:
            sc_mesh, sc_num_cores, sc_num_subcores = _sparsecore_mesh()
            kernel = partial(
                sc_add_one_kernel, sc_num_cores=sc_num_cores, sc_num_subcores=sc_num_subcores
            )
            return pl.kernel(kernel, out_type=x, mesh=sc_mesh, scratch_types=[])(x)

        return cast("Callable[..., Any]", sc_add_one)

    def arg_specs(self, num_devices: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        # Every subcore takes whole 8-row blocks; 128 subcores covers every chip's SparseCores.
        _check_rows(self.name, self.shape, num_devices, 8)
        return (jax.ShapeDtypeStruct(self.shape, jnp.int32),)

    def _random(self, specs: tuple[jax.ShapeDtypeStruct, ...], seed: int) -> list[jax.Array]:
        (x,) = specs
        return [jax.random.randint(jax.random.key(seed), x.shape, 0, 64, x.dtype)]

    def expected(self, *inputs: np.ndarray, num_cores: int | None = None) -> np.ndarray:
        del num_cores  # the result does not depend on the core count
        (x,) = inputs
        return np.asarray(x) + 1


PROGRAMS: Mapping[str, GuideProgram] = MappingProxyType(
    {p.name: p for p in (SwapCoreMap(), SwapKernel(), AddOne(), IndexedAddOne(), ScAddOne())}
)

__all__ = [
    "PROGRAMS",
    "AddOne",
    "GuideProgram",
    "IndexedAddOne",
    "ScAddOne",
    "SwapCoreMap",
    "SwapKernel",
    "add_one_body",
    "add_one_kernel",
    "indexed_add_one_kernel",
    "sc_add_one_body",
    "sc_add_one_kernel",
    "swap_cores_kernel",
]
