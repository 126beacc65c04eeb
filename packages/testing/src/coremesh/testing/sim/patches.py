"""Every change the simulator makes to jax internals, in one place.

Pallas' TPU interpret mode runs core-level kernels on the CPU, but has gaps that make the core_map
guide's programs fail, hang or compute wrong results (``research/INTERPRET_MODE.md`` has the
analysis). Each :class:`Patch` below names the gap with its upstream location (line numbers are
jax 0.10.2's), the jax releases that have it (``fixed_in``), and swaps a few module attributes
while a :func:`coremesh.testing.simulate` context is open, on those releases only; leaving the last
context restores every original. Where the internals a patch hooks differ between the supported
jax lines, :mod:`coremesh.testing.sim.compat` says how. A jax older than the oldest supported
release is refused; one newer than the newest tested release gets a warning.

Patches are process-wide (the interpreter's own state is too); nested contexts are counted, and
the innermost simulator's chip (:mod:`coremesh.testing.sim.chip`) is the one jax sees.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import sys
import threading
from collections.abc import Callable, Collection
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from coremesh.core import jax_compat, jax_versions
from coremesh.core.errors import CoremeshError, MeshError, UnsupportedOnChipError
from coremesh.testing.sim import (
    call_params,
    chip_matmul,
    compat,
    faults,
    operands,
    scalar_division,
    shadow,
)
from coremesh.testing.sim.chip import (
    ActiveSlice,
    SimulatedChip,
    active_slice,
    current,
    current_name,
    enter,
    leave,
)
from coremesh.testing.sim.deadlock import WATCHDOG, semaphore_description
from coremesh.testing.sim.errors import NotSimulatedError, not_simulated, race_error


def check_jax_version(version: str | None = None) -> None:
    """Refuse a jax older than coremesh supports; warn about one newer than it is tested on."""
    jax_versions.check(version)


#: Threads that entered a simulate() context (the ones whose calls the simulator reports on).
_user_threads: collections.Counter[int] = collections.Counter()


def _devices() -> tuple[Any, ...]:
    """The host devices standing in for the active simulator's TPU devices."""
    slice_ = active_slice()
    assert slice_ is not None  # the patches are installed only while a simulator is active
    return slice_.devices


def _fail(err: Exception) -> Exception:
    """Remember ``err`` so the simulator can re-raise it once XLA has wrapped it."""
    WATCHDOG.record(err)
    return err


# ------------------------------------------------------------------------------------------
# The patches. Each is a list of (object, attribute, replacement) built on first use.
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Patch:
    """One fix: its name, the upstream gap, the attributes it swaps, and the jax releases that
    have the gap (from ``jax_versions.MINIMUM`` up to, not including, ``fixed_in``; ``None``:
    every supported release). ``tests/sim/test_regressions.py`` shows the stock behaviour on each
    line: failing where the patch applies, passing where upstream fixed it."""

    name: str
    why: str
    targets: Callable[[], list[tuple[Any, str, Any]]]
    fixed_in: str | None = None

    def needed(self, version: str | None = None) -> bool:
        """Does the installed jax (or ``version``) have the gap this patch fixes?"""
        return self.fixed_in is None or not jax_versions.at_least(self.fixed_in, version)


def _tpu_info_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic import core as mosaic_core
    from jax._src.pallas.mosaic import sc_core
    from jax.experimental.pallas import tpu as pltpu

    tpu_info = jax_compat.tpu_info_module()
    registry = dict(tpu_info.registry)
    registry["cpu"] = lambda: current().tpu_info

    def check_cores(num_cores: int) -> None:
        chip = current()
        if num_cores > chip.cores_per_device:
            raise MeshError(
                f"a TensorCore mesh of {num_cores} cores on a device with {chip.cores_per_device}",
                rule=f"a {chip.name} device in this mode has {chip.cores_per_device} TensorCore(s)",
                chip=chip.name,
                fix="leave num_cores out (it defaults to the device's cores) or simulate a "
                "chip/mode with more cores per device",
            )

    def create_tensorcore_mesh(
        axis_name: str, devices: Any = None, num_cores: int | None = None
    ) -> Any:
        if devices is None and num_cores is None:
            num_cores = current().cores_per_device
        if num_cores is not None:
            check_cores(num_cores)
        assert orig_create is not None  # installed only where jax has it (below)
        return orig_create(axis_name, devices=devices, num_cores=num_cores)

    orig_create = getattr(mosaic_core, "create_tensorcore_mesh", None)  # gone in jax 0.12.1

    def default_num_cores() -> int:
        # jax >= 0.11: TensorCoreMesh(axis_name=...) reads jax.devices()[0].num_cores, which a
        # CPU device does not have.
        return current().cores_per_device

    def num_cores(device: Any) -> int:
        # A TPU device answers num_cores (a PJRT device attribute); a host device standing in
        # for one answers the simulated chip's, and any other device as before (no attribute).
        slice_ = active_slice()
        if slice_ is None or device not in slice_.devices:
            raise AttributeError("num_cores")
        return current().cores_per_device

    out: list[tuple[Any, str, Any]] = [
        (tpu_info, "registry", registry),
        (jax.Device, "num_cores", property(num_cores)),
        (sc_core, "get_sparse_core_info", _get_sparse_core_info),
        # User code asking pltpu whether it runs on a TPU hears what get_tpu_info() describes;
        # jax's own lowering rules read tpu_info.is_tpu_device, which stays False (the host
        # device lowers as a CPU).
        (pltpu, "is_tpu_device", lambda: True),
    ]
    factory = compat.tensorcore_mesh_default_cores()
    default_fn = compat.default_cores_function()
    if factory is None or default_fn is None:  # jax 0.10.2: create_tensorcore_mesh is the API
        out += [
            (mosaic_core, "create_tensorcore_mesh", create_tensorcore_mesh),
            (pltpu, "create_tensorcore_mesh", create_tensorcore_mesh),
        ]
    else:  # both spellings reach the default core count
        out += [(factory, "cell_contents", default_num_cores), (*default_fn, default_num_cores)]
    return out


def _no_sparsecore(chip: SimulatedChip, what: str) -> UnsupportedOnChipError:
    return UnsupportedOnChipError(
        f"{chip.name} has no SparseCore, so {what} cannot run on it",
        rule="plsc.VectorSubcoreMesh / ScalarSubcoreMesh need SparseCores (v5p, v6e, TPU7x)",
        chip=chip.name,
        fix="simulate a chip with SparseCores, e.g. simulate(chip='v5p')",
    )


def _mpmd_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import mpmd

    return mpmd.targets()


def _get_sparse_core_info() -> Any:
    chip = current()
    if not chip.has_sparsecore:
        raise _no_sparsecore(chip, "SparseCore meshes")
    return chip.tpu_info.sparse_core


def _host_devices_targets() -> list[tuple[Any, str, Any]]:
    from jax._src import xla_bridge as xb

    orig = {n: getattr(xb, n) for n in ("devices", "device_count", "local_devices")}
    orig["local_device_count"] = xb.local_device_count

    def devices(backend: Any = None) -> list[Any]:
        if backend in (None, "cpu"):
            return list(_devices())
        return list(orig["devices"](backend))

    def device_count(backend: Any = None) -> int:
        return len(devices(backend))

    def local_devices(
        process_index: int | None = None, backend: Any = None, host_id: int | None = None
    ) -> list[Any]:
        if backend in (None, "cpu") and process_index in (None, 0) and host_id in (None, 0):
            return list(_devices())
        return list(orig["local_devices"](process_index, backend, host_id))

    def local_device_count(backend: Any = None) -> int:
        return len(local_devices(backend=backend))

    out: list[tuple[Any, str, Any]] = []
    for name, fn in (
        ("devices", devices),
        ("device_count", device_count),
        ("local_devices", local_devices),
        ("local_device_count", local_device_count),
    ):
        out += [(xb, name, fn), (jax, name, fn)]
    return out


def _partial_manual_targets() -> list[tuple[Any, str, Any]]:
    from jax._src import callback

    orig = callback._callback_op_sharding

    def op_sharding(axis_context: Any, sharding: Any, avals_out: Any) -> Any:
        try:
            return orig(axis_context, sharding, avals_out)
        except NotImplementedError as err:
            if "partitioned manually" not in str(err):
                raise
            mesh = axis_context.mesh
            auto = [n for n in mesh.axis_names if n not in axis_context.manual_axes]
            raise NotSimulatedError(
                f"a kernel where mesh axes {auto} are automatic (a partly manual SPMD "
                "computation, e.g. vmap of a shard_map over one axis) cannot run on the simulator",
                rule="the simulator runs a kernel as host callbacks, which XLA places per device "
                "only when every mesh axis is manual (jax: 'callbacks are only supported in spmd "
                "computations when all mesh axes are partitioned manually'); on a TPU the kernel "
                "is a custom call the partitioner shards",
                chip=current().name,
                fix="make every mesh axis manual around the kernel (jax.shard_map over all of "
                "them), or check the program with the compile-only target (coremesh.testing.aot)",
            ) from None

    return [(callback, "_callback_op_sharding", op_sharding)]


def _io_callback_targets() -> list[tuple[Any, str, Any]]:
    from jax._src import callback, config, sharding_impls, tree_util
    from jax._src import mesh as mesh_lib
    from jax._src import xla_bridge as xb
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    cpu = xb.get_backend("cpu").local_devices()[0]

    def io_callback_impl(
        *args: Any, result_avals: Any, callback: Any, sharding: Any, ordered: bool
    ) -> Any:
        # Upstream device_puts the host operands back onto a CPU device first. With several
        # host devices blocked inside interpreter callbacks, that (asynchronous, > ~100 KiB)
        # transfer never completes. The operands already are host arrays: copy them (XLA may
        # reuse the buffers once the callback returns) and call directly.
        del result_avals, sharding, ordered
        WATCHDOG.progress()
        if allocates_a_copy(callback, ipc._allocate_buffer):
            copies = list(args)
        else:
            copies = [a.copy() if type(a) is np.ndarray else np.array(a, copy=True) for a in args]
        # Outside the calling thread's meshes, as upstream's impl from jax 0.12 (callback.py
        # io_callback_impl): under jax.set_mesh with Explicit axes, a multi-core kernel's
        # per-core programs would be traced in the user's mesh and fail to close over their
        # operands ("Closing over inputs to shard_map ... on `Explicit` axes").
        with (
            config.default_device(cpu),
            sharding_impls._internal_use_concrete_mesh(mesh_lib.empty_concrete_mesh),
            mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh),
        ):
            out = callback(*copies)  # args arrive flat; results are mostly a flat tuple
        if type(out) is tuple and all(type(o) is np.ndarray for o in out):
            return out
        return tree_util.tree_map(np.asarray, out)

    return [(callback, "io_callback_impl", io_callback_impl)]


def allocates_a_copy(callback: Any, allocate: Any) -> bool:
    """Is ``callback`` (an ``io_callback``'s) the interpreter's buffer allocation ``allocate``:
    staged as is (jax 0.10), in a ``functools.partial`` of its keywords (jax 0.11 on), or as the
    first argument of a wrapper's partial (the uninitialized-read check's)?

    ``_allocate_buffer`` copies its value before anything else (``value = np.array(val)``;
    every wrapper of it here hands ``val`` on unread), so copying the operand first as well
    held each kernel operand three times at once: XLA's, the callback's copy and the
    interpreter's buffer (a 1 GiB operand's DMA peaked 1 GiB higher)."""
    f = getattr(callback, "callback_func", None)
    while f is not None:
        if f is allocate:
            return True
        if not isinstance(f, functools.partial):
            return False
        f = f.func if f.func is allocate else (f.args[0] if f.args else None)
    return False


def _out_memory_kinds_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.interpreters import mlir

    orig = mlir.lower_jaxpr_to_fun

    def lower_jaxpr_to_fun(
        ctx: Any, name: str, jaxpr: Any, effects: Any, *args: Any, **kw: Any
    ) -> Any:
        # The effects' tokens lead the results: upstream puts a None memory kind before the
        # result_memory_kinds for each, and here before the propagated ones too.
        propagated, kinds = kw.get("propagated_out_mem_kinds"), kw.get("result_memory_kinds")
        if (
            effects
            and propagated is not None
            and kinds is not None
            and len(propagated) == len(kinds)
        ):
            kw["propagated_out_mem_kinds"] = (None,) * len(effects) + tuple(propagated)
        return orig(ctx, name, jaxpr, effects, *args, **kw)

    return [(mlir, "lower_jaxpr_to_fun", lower_jaxpr_to_fun)]


def _host_memory_space_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    # As jax 0.11 does (interpret_pallas_call.py "Inject HOST as a memory space"): an index
    # after the others, named 'host'. New dicts, so uninstalling restores upstream's own.
    names, idxs = dict(ipc.TPU_MEMORY_SPACE_NAMES), dict(ipc.TPU_MEMORY_SPACE_IDXS)
    host = len(names)
    names[host] = "host"
    idxs[pallas_core.MemorySpace.HOST] = host
    return [(ipc, "TPU_MEMORY_SPACE_NAMES", names), (ipc, "TPU_MEMORY_SPACE_IDXS", idxs)]


def _nested_ref_views_targets() -> list[tuple[Any, str, Any]]:
    from jax._src import state
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    def get_ref_and_transforms(ref: Any) -> tuple[Any, tuple[Any, ...]]:
        # A view of a view (a pipeline's block of a ref.at[...] view) is a TransformedRef
        # whose ref is one too: peel every level, the innermost view's transforms first.
        transforms: tuple[Any, ...] = ()
        while isinstance(ref, state.TransformedRef):
            transforms = (*ref.transforms, *transforms)
            ref = ref.ref
        return ref, transforms

    out: list[tuple[Any, str, Any]] = [
        (mosaic_primitives, "_get_ref_and_transforms", get_ref_and_transforms)
    ]
    if compat.transformed_ref_refuses_nesting():
        # jax 0.12.1 refuses to build a view of a view ("TransformedRef cannot wrap a
        # TransformedRef"), which the interpreter does as it unflattens an inner pipeline's
        # operands (pipeline_body_p): compose the two views, as apply_transform does.
        cls = state.TransformedRef
        orig_post_init = cls.__post_init__

        def post_init(self: Any) -> None:
            inner = self.ref
            if isinstance(inner, cls) and not inner.multiref:
                object.__setattr__(self, "ref", inner.ref)
                object.__setattr__(self, "transforms", (*inner.transforms, *self.transforms))
            orig_post_init(self)

        out.append((cls, "__post_init__", post_init))
    return out


def _split_target(target: Any, default_core: int) -> tuple[int | None, int]:
    """(device, core) of a DMA or signal target: a logical id, or a (device, core) pair."""
    if target is None:
        return None, default_core
    if isinstance(target, tuple):
        device, core = target
        return int(device), int(core)
    return int(target), default_core


def check_core(sm: Any, device: int, core: int) -> None:
    if not 0 <= core < sm.num_cores_per_device:
        raise _fail(
            MeshError(
                f"a DMA or signal targets core {core} of device {device}, which has "
                f"{sm.num_cores_per_device} core(s)",
                rule="device_id={'core': i} and core_index name a core of the kernel's mesh",
                chip=current_name(),
                fix="compute the target core modulo jax.lax.axis_size('core')",
            )
        )


def _intercore_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.pallas.mosaic.interpret import utils as iu

    orig_to_logical = iu._device_id_to_logical

    def device_id_to_logical(
        device_id: Any, device_id_type: Any, axis_sizes: Any, axis_indices: Any
    ) -> Any:
        # Upstream raises NotImplementedError for a dict key that is not a shard_map axis, such
        # as the core axis of `device_id={"core": i}`. Such an id names (device, core): it is
        # passed on as a pair and resolved by the DMA and signal callbacks below.
        if isinstance(device_id, dict):
            extra = [k for k in device_id if not isinstance(k, tuple) and k not in axis_sizes]
            if len(extra) > 1:
                raise NotImplementedError(
                    f"device_id {sorted(map(str, device_id))} names several axes that are not "
                    f"shard_map axes ({extra}); the simulator maps one core axis"
                )
            if extra:
                core = jax.numpy.asarray(device_id[extra[0]], jax.numpy.int32)
                rest = {k: v for k, v in device_id.items() if k != extra[0]}
                device = iu.device_coords_to_logical_id(rest, axis_sizes, axis_indices)
                return (jax.numpy.asarray(device, jax.numpy.int32), core)
        return orig_to_logical(device_id, device_id_type, axis_sizes, axis_indices)

    @ipc.fail_on_exception
    def dma_start(
        token: Any,
        device_id: Any,
        src_local_core_id: Any,
        src_memory_space: Any,
        src_id: Any,
        src_transforms: Any,
        dst_memory_space: Any,
        dst_id: Any,
        dst_transforms: Any,
        dst_sem_id: Any,
        src_sem_id: Any,
        dst_device_id: Any,
        source_info: Any = None,
    ) -> Any:
        # Upstream (interpret_pallas_call.py:1064-1066, 1085) always delivers to the *source*
        # core's number on the destination device; here the destination core comes from the
        # device id when it names one.
        sm = ipc._get_shared_memory()
        device_id, src_core = int(device_id), int(src_local_core_id)
        src_gcid = sm.get_global_core_id(device_id, src_core)
        dst_device, dst_core = _split_target(dst_device_id, src_core)
        dst_device = device_id if dst_device is None else dst_device
        check_core(sm, dst_device, dst_core)
        dst_gcid = sm.get_global_core_id(dst_device, dst_core)
        dst_sem_id = int(dst_sem_id)
        src_sem_id = int(src_sem_id) if src_sem_id is not None else None
        (src_sem, dst_sem), clock = sm.get_semaphores_and_increment_clock(
            (src_sem_id, dst_sem_id), src_gcid
        )
        assert ipc.dma_id_counter is not None
        dma = ipc.DMA(
            ipc.dma_id_counter.get_next(),
            device_id,
            src_core,
            int(src_memory_space),
            int(src_id),
            _ints(src_transforms),
            dst_device,
            dst_core,
            int(dst_memory_space),
            int(dst_id),
            _ints(dst_transforms),
            src_sem,
            dst_sem,
            virtual_device_id=sm.get_random_virtual_device_id(),
            clock=clock,
            source_info=source_info,
        )
        if sm.dma_execution_mode == "on_wait":
            if src_sem_id is not None:
                sm.append_semaphore_task(src_sem_id, src_gcid, dma.execute_read)
            sm.append_semaphore_task(dst_sem_id, dst_gcid, dma.execute_read_and_write)
        else:
            dma.execute_read_and_write()
        return token

    return [
        (iu, "_device_id_to_logical", device_id_to_logical),
        (ipc, "dma_start", dma_start),
    ]


def _signal_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig_signal = ipc.semaphore_signal.__wrapped__

    @ipc.fail_on_exception
    def semaphore_signal(
        token: Any,
        device_id: Any,
        local_core_id: Any,
        sem_id: Any,
        inc: Any,
        target_device_id: Any,
        target_local_core_id: Any,
        source_info: Any = None,
    ) -> Any:
        # Upstream (interpret_pallas_call.py:1178) sends a signal without core_index to core 0
        # rather than to the signalling core, which hangs plain 2-core kernels.
        sm = ipc._get_shared_memory()
        own_core = int(local_core_id)
        device, core = _split_target(target_device_id, own_core)
        if target_local_core_id is not None:
            if isinstance(target_device_id, tuple):
                raise _fail(
                    MeshError(
                        "a semaphore_signal names its core twice: in device_id and core_index",
                        rule="name the target core once",
                        fix="drop core_index, or drop the core axis from device_id",
                    )
                )
            core = int(target_local_core_id)
        target = int(device_id) if device is None else device
        check_core(sm, target, core)
        return orig_signal(
            token, device_id, local_core_id, sem_id, inc, target, core, source_info=source_info
        )

    return [(ipc, "semaphore_signal", semaphore_signal)]


class _NotPlainError(Exception):
    """A structure int_tree() does not know; the generic jax.tree.map handles it."""


def int_tree(x: Any) -> Any:
    """``jax.tree.map(int, x)`` for the index structures the interpreter's callbacks convert
    (tuples of ``NDIndexer`` / ``Slice`` / integers), without jax's generic pytree machinery.
    Every load, store and DMA converts its transforms, so this is dispatched on exact types."""
    kind = type(x)
    if kind is tuple:
        return tuple([int_tree(v) for v in x])
    convert = (_INT_TREE or _int_types()).get(kind)
    if convert is not None:
        return convert(x)
    if kind is list:
        return [int_tree(v) for v in x]
    if x is None:
        return None
    if isinstance(x, int | np.integer) or (isinstance(x, np.ndarray) and x.ndim == 0):
        return int(x)
    raise _NotPlainError


_INT_TREE: dict[type, Any] = {}


def _int_types() -> dict[type, Any]:
    """Fill int_tree's table: exact type -> converter (jax's index classes, numpy's ints)."""
    from jax._src import indexing as slices
    from jax._src.state import indexing

    def indexer(x: Any) -> Any:
        for d in x.int_indexer_shape:
            if type(d) is not int:
                raise _NotPlainError
        indices = tuple([int_tree(i) for i in x.indices])
        return indexing.NDIndexer(indices, x.shape, x.int_indexer_shape)

    def one_slice(x: Any) -> Any:
        return slices.Slice(int(x.start), int(x.size), x.stride)

    def array(x: Any) -> Any:
        if x.ndim:
            raise _NotPlainError
        return int(x)

    _INT_TREE.update({int: int, indexing.NDIndexer: indexer, slices.Slice: one_slice})
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        _INT_TREE[getattr(np, name)] = int
    _INT_TREE[np.ndarray] = array
    return _INT_TREE


def _ints(tree: Any) -> Any:
    """``jax.tree.map(int, tree)``, by :func:`int_tree` where it can."""
    try:
        return int_tree(tree)
    except _NotPlainError:
        return jax.tree.map(int, tree)


class _FastIntTree:
    """``jax.tree`` whose ``map(int, transforms)`` takes the :func:`int_tree` shortcut."""

    def __init__(self, tree: Any) -> None:
        self._tree = tree

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tree, name)

    def map(self, f: Any, tree: Any, *rest: Any, **kw: Any) -> Any:
        if f is int and not rest and not kw:
            try:
                return int_tree(tree)
            except _NotPlainError:
                pass
        return self._tree.map(f, tree, *rest, **kw)


class _JaxForInterpreter:
    """The ``jax`` module as the interpreter sees it: everything as is but ``jax.tree.map``."""

    tree = _FastIntTree(jax.tree)

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)


def _fast_transforms_targets() -> list[tuple[Any, str, Any]]:
    # Every get/store/swap/DMA callback converts its index transforms with
    # jax.tree.map(int, ...) (interpret_pallas_call.py:590, 729, 818): jax's generic pytree
    # path is the largest single cost of a callback. The same conversion, done directly.
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return [(ipc, "jax", _JaxForInterpreter())]


def _interpret_call_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic import core as mosaic_core
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim import core_semaphores, sc_targets, sparsecore, subcore_barrier

    orig = ipc.interpret_pallas_call

    def interpret_pallas_call(*args: Any, mesh: Any, interpret_params: Any, **kw: Any) -> Any:
        chip = current()
        # The interpreter runs kernels on operands Mosaic refuses (float16, a bool DMA on 0.10).
        operands.check_call(
            (*args, *kw.get("out_avals", ())),
            kw.get("jaxpr"),
            chip.name,
            sparsecore=mesh is not None and not isinstance(mesh, mosaic_core.TensorCoreMesh),
        )
        if mesh is not None:  # pltpu.VMEM(...) @ mesh: a KeyError in the interpreter (:482)
            kw["jaxpr"] = sparsecore.own_memory_spaces(kw["jaxpr"], mesh)
        if isinstance(mesh, mosaic_core.TensorCoreMesh):
            cores = jax_compat.mesh_cores(mesh)
            if cores > chip.cores_per_device:
                raise MeshError(
                    f"a kernel over {cores} TensorCores on a device with {chip.cores_per_device}",
                    rule=f"a {chip.name} device in this mode has {chip.cores_per_device} "
                    "TensorCore(s)",
                    chip=chip.name,
                    fix="build the mesh inside the simulate() context without a core count "
                    "(coremesh.tensorcore.mesh(), or jax's own spelling: "
                    "pltpu.TensorCoreMesh(axis_name=...) / create_tensorcore_mesh(axis))",
                )
        elif mesh is not None:
            if not chip.has_sparsecore:
                raise _no_sparsecore(chip, "this SparseCore kernel")
            if "sparsecore_axes" in _state.enabled:
                # Upstream (interpret_pallas_call.py:1380-1385) answers axis_index on every axis
                # of a non-TensorCore mesh with the local core id (0 for all 64 subcores). The
                # mesh's grid already carries each subcore's coordinates: without the mesh in
                # the context, axis_index reads them (the grid_names branch). The subcores run
                # one after the other on one thread.
                threaded = subcore_barrier.threaded_by(kw["jaxpr"], _state.enabled)
                if threaded is not None:
                    # A barrier, or an add into another subcore's SMEM: the subcores of a
                    # SparseCore run at once, on threads, each with SMEM and VMEM of its own.
                    interpret_params = subcore_barrier.prepare(
                        mesh, interpret_params, kw, what=threaded
                    )
                    return orig(*args, mesh=None, interpret_params=interpret_params, **kw)
                sc_targets.check(kw["jaxpr"], mesh)  # another step, by name: nowhere to land
                own_only = sc_targets.own_axes_dropped(kw["jaxpr"], mesh)  # {"core": 0} of 1
                if own_only is not None:
                    kw["jaxpr"] = own_only
                mesh = None
                interpret_params = dataclasses.replace(interpret_params, num_cores_or_threads=1)
                # The steps would share the kernel's scratch semaphores: each gets its own.
                own = core_semaphores.per_core(kw["jaxpr"], kw["grid_mapping"])
                if own is not None:
                    kw["jaxpr"], kw["grid_mapping"] = own
        return orig(*args, mesh=mesh, interpret_params=interpret_params, **kw)

    return [(ipc, "interpret_pallas_call", interpret_pallas_call)]


class _ForcedModeView:
    """jax's forced interpret mode as the kernel entry points read it, in ``forced or
    interpret``: the call's own parameters merged with the simulator's (``call_params``)."""

    def __init__(self, state: Any) -> None:
        self._state = state

    @property
    def value(self) -> Any:
        forced = self._state.value
        slice_ = active_slice()
        if slice_ is None:
            return forced
        # The reader is the entry point itself; its `interpret` is the call's own argument.
        own = sys._getframe(1).f_locals.get("interpret", False)
        return call_params.effective(slice_.interpret_params, forced, own)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class _ConfigView:
    """jax's ``config`` module with the forced interpret mode read through the view above."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self.pallas_tpu_interpret_mode_context_manager = _ForcedModeView(
            config.pallas_tpu_interpret_mode_context_manager
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def _own_params_targets() -> list[tuple[Any, str, Any]]:
    # Upstream's entry points run `config.pallas_tpu_interpret_mode_context_manager.value or
    # interpret` (pallas_call.py:1257, core.py:1535 and 1572, helpers.py:248, mpmd.py:617): the
    # forced mode replaces a call's own InterpretParams (races, out-of-bounds reads, HBM in
    # run_scoped, ...). Those modules read config through a view that merges them instead.
    # InterpretParams notes the fields a call passes, so that a default it chose is kept.
    from jax._src import config
    from jax._src.pallas import core, helpers, mpmd
    from jax._src.pallas import pallas_call as pallas_call_module
    from jax._src.pallas.mosaic.interpret.params import InterpretParams

    view = _ConfigView(config)
    out = [(m, "config", view) for m in (pallas_call_module, core, helpers, mpmd)]
    return [
        *out,
        (InterpretParams, "__init__", call_params.record_fields(InterpretParams.__init__)),
    ]


def _made_outside_targets() -> list[tuple[Any, str, Any]]:
    # `pl.pallas_call(...)` and `pl.kernel(...)` read the forced mode when they are *made*
    # (pallas_call.py:1257, helpers.py:248): one made at module level, before simulate() was
    # entered, binds interpret=False and fails on the CPU ("Only interpret mode is supported on
    # CPU backend"). A bind with no interpret mode inside the simulator takes the forced mode,
    # which is in jax's jit key, so the program is traced per chip as any other.
    from jax._src import config
    from jax._src.pallas import pallas_call as pallas_call_module
    from jax._src.pallas.mosaic.interpret.params import InterpretParams

    primitive = pallas_call_module.pallas_call_p
    orig_bind = primitive.bind

    def bind(*args: Any, **params: Any) -> Any:
        slice_ = active_slice()
        if slice_ is not None:
            own = params.get("interpret")
            forced = config.pallas_tpu_interpret_mode_context_manager.value
            if not own:
                if forced:
                    params["interpret"] = forced
            elif isinstance(own, InterpretParams):
                # its own parameters, made outside: merged as the entry points merge them
                params["interpret"] = call_params.effective(slice_.interpret_params, forced, own)
        return orig_bind(*args, **params)

    return [(primitive, "bind", bind)]


def _sparsecore_primitive_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim import inline, sparsecore

    orig = ipc._interpret_jaxpr

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        # Upstream has no interpreter rule for SparseCore primitives (generic fallback at
        # interpret_pallas_call.py:1701 binds them with buffer ids for refs).
        axis_env = dict(ctx.axis_sizes)
        names = ctx.grid_mapping.grid_names or ()
        axis_env.update(zip(names, ctx.grid_mapping.grid, strict=False))
        if ctx.mesh is not None:
            axis_env.update(ctx.mesh.shape)
        tiling = sparsecore.sparse_core_tiling(ctx.mosaic_params)
        done = sparsecore.rewrite(jaxpr, tuple(axis_env.items()), sc_tiling=tiling)
        jaxpr, args = inline.spliced(jaxpr, args, done)
        return orig(jaxpr, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr)]


class _CompileCache:
    """Per-core executables of thread_map, compiled once per (program, argument types)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[Any, tuple[Any, Any]] = collections.OrderedDict()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __call__(self, jaxpr: Any, consts: Any, *args: Any) -> None:
        flat = jax.tree.leaves((consts, args))
        key = (id(jaxpr), tuple((np.shape(a), str(getattr(a, "dtype", None))) for a in flat))
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[0] is not jaxpr:
                compiled = _compile_core_program(jaxpr, consts, *args)
                hit = (jaxpr, compiled)  # holding jaxpr keeps its id unique
                self._entries[key] = hit
                while len(self._entries) > self._size:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
        hit[1](consts, *args)


#: XLA's words for a primitive it cannot lower for the host.
_NO_CPU_RULE = re.compile(r"MLIR translation rule for primitive '([^']+)' not found for platform")


def _compile_core_program(jaxpr: Any, consts: Any, *args: Any) -> Any:
    """One core's program, compiled. A primitive with no CPU rule (a TPU primitive neither the
    interpreter nor the simulator runs) fails here, inside a host callback, where XLA would hand
    the user only 'CpuCallback error': it is the run's failure instead, naming the primitive."""
    try:
        return (
            jax.jit(_run_jaxpr, static_argnums=(0,)).trace(jaxpr, consts, *args).lower().compile()
        )
    except NotImplementedError as err:
        found = _NO_CPU_RULE.search(str(err))
        if found is None:
            raise
        refusal = not_simulated(
            f"the primitive {found.group(1)!r} in this kernel is not simulated: neither the "
            "interpreter nor XLA:CPU has a rule for it",
            chip=current().name,
        )
        WATCHDOG.record(refusal)
        raise refusal from err


def _run_jaxpr(jaxpr: Any, consts: Any, *args: Any) -> None:
    from jax._src import core as jax_core

    jax_core.eval_jaxpr(jaxpr, consts, *args)


_compile_cache = _CompileCache()


def clear_compiled_core_programs() -> None:
    """Drop every compiled core program (``sim.host_mappings``: each holds memory mappings)."""
    _compile_cache.clear()


def _subcore_barrier_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import subcore_barrier

    return subcore_barrier.targets()


def _compile_cache_targets() -> list[tuple[Any, str, Any]]:
    # Upstream (thread_map.py:34) traces, lowers and compiles every core's program again on
    # every kernel call: ~0.25 s of a warm 2-core call that does ~5 ms of work.
    from jax._src.pallas.mosaic.interpret import thread_map

    return [(thread_map, "_run_jaxpr", _compile_cache)]


def _interpreter_checks_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import interpreter_checks

    return interpreter_checks.targets()


def _idle_cores_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import idle_cores

    return idle_cores.targets()


#: How many devices have joined a shared memory (an attribute of it).
_JOINED = "_coremesh_devices_joined"


def _watchdog_targets() -> list[tuple[Any, str, Any]]:
    from jax._src import dispatch
    from jax._src.interpreters import pxla
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.pallas.mosaic.interpret import shared_memory as memory

    orig_init = ipc._initialize_shared_memory
    orig_call = pxla.ExecuteReplicated.__call__
    init_lock = threading.Lock()

    orig_wait = memory.Semaphore.wait
    orig_check_failed = memory.SharedMemory.check_failed
    current = threading.local()  # the wait this thread is in: (watchdog key, semaphore, core)

    def wait(self: Any, value: Any, global_core_id: Any, **kw: Any) -> Any:
        # Upstream's wait (shared_memory.py:158) polls forever. It calls check_failed() on every
        # round of its loop: this wrapper registers the wait with the deadline watchdog, and the
        # check_failed below asks the watchdog whether it has become a deadlock.
        gcid = int(global_core_id)
        device, core = divmod(gcid, self.shared_memory.num_cores_per_device)
        key = WATCHDOG.begin_wait(device, core, semaphore_description(self, core), int(value))
        outer = getattr(current, "wait", None)
        current.wait = (key, self, gcid)
        try:
            return orig_wait(self, value, global_core_id, **kw)
        except Exception:
            WATCHDOG.abandon(key)  # a fault elsewhere stopped it: listed after the fault
            raise
        finally:
            current.wait = outer
            WATCHDOG.end_wait(key)
            WATCHDOG.progress()

    def check_failed(self: Any) -> None:
        try:
            orig_check_failed(self)
            waiting = getattr(current, "wait", None)
            if waiting is not None:
                key, sem, gcid = waiting
                WATCHDOG.check(key, int(sem.count_by_core[gcid]))
        except CoremeshError:
            raise  # a deadlock found by this wait: the run's own failure
        except Exception as err:
            faults.mark_stopped(err)  # another core failed first
            raise

    def signal(self: Any, *args: Any, **kw: Any) -> Any:
        WATCHDOG.progress()  # a DMA or a core signalled: a wait may now finish
        return orig_signal(self, *args, **kw)

    orig_signal = memory.Semaphore.signal

    def initialize_shared_memory(*args: Any, **kw: Any) -> Any:
        # A kernel that failed (e.g. deadlocked) can leave its shared memory behind; the next
        # kernel would fail on it at once. Start afresh instead; but only from memory every
        # device has joined already: a device that starts late, after another one of the same
        # run failed, would otherwise swap the run's memory for a fresh one, and the failed
        # devices would wait forever at the old one's clean-up barrier.
        with init_lock:
            sm = ipc._shared_memory
            if (
                sm is not None
                and sm._failure is not None
                and sm.__dict__.get(_JOINED, 0) >= sm.num_devices
            ):
                ipc.reset_tpu_interpret_mode_state()
            out = orig_init(*args, **kw)
            sm = ipc._shared_memory
            sm.__dict__[_JOINED] = sm.__dict__.get(_JOINED, 0) + 1
            return out

    def execute(self: Any, *args: Any) -> Any:
        # Programs run synchronously in the user's thread so that a failing kernel fails the
        # call that launched it; and XLA reports an exception raised in a host callback as a
        # JaxRuntimeError that has lost its type: re-raise the simulator's own error (deadlock,
        # bad target, index) in its place. Per-core programs run by thread_map inside a kernel
        # pass through here too, on worker threads: those are left alone.
        if threading.get_ident() not in _user_threads:
            return orig_call(self, *args)
        try:
            out = orig_call(self, *args)
            jax.block_until_ready(out)
            dispatch.runtime_tokens.block_until_ready()
        except Exception as err:
            # The failed run leaves errored effect tokens (the next call would fail on them)
            # and interpreter state behind: drop both so the process stays usable.
            dispatch.runtime_tokens.clear()
            ipc.reset_tpu_interpret_mode_state()
            failure = WATCHDOG.take() or _race_from_upstream(err)
            WATCHDOG.reset()
            shadow.take_result_error()  # a result left unwritten by this failure
            if failure is None:
                raise
            # A fault keeps the interpreter's exception (with its traceback) as its cause.
            raise failure from (failure.__cause__ or err)
        unwritten = shadow.take_result_error()
        if unwritten is not None:
            from coremesh.testing.sim import compiled

            exact = compiled.explained(unwritten)
            if exact is not None:
                raise exact
        return out

    return [
        (memory.Semaphore, "wait", wait),
        (memory.Semaphore, "signal", signal),
        (memory.SharedMemory, "check_failed", check_failed),
        (ipc, "_initialize_shared_memory", initialize_shared_memory),
        (pxla.ExecuteReplicated, "__call__", execute),
    ]


def _race_from_upstream(err: BaseException) -> Exception | None:
    """jax >= 0.12 raises ``RuntimeError('RACE DETECTED ...')`` at the racing access (its
    ``on_race='raise'``), and XLA hands it back as a ``JaxRuntimeError`` whose text holds the
    report: the simulator's own error instead, with upstream's report in it."""
    text = str(err)
    start = text.find("RACE DETECTED")
    if start < 0:
        return None
    report = text[start:].partition("\n\n")[0].partition("For simplicity, JAX")[0].strip()
    RACES.add(report)
    return race_error(RACES.drain(), current_name())


class RaceLog:
    """Kernels in which the race detector found races, since the log was last drained."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: list[str] = []

    def add(self, what: str) -> None:
        with self._lock:
            self._found.append(what)

    def drain(self) -> list[str]:
        with self._lock:
            found, self._found = self._found, []
            return found


RACES = RaceLog()


def _race_report_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig_validate = ipc._validate.__wrapped__

    @ipc.fail_on_exception
    def validate(token: Any, device_id: Any) -> Any:
        # Upstream only prints "RACE DETECTED" and sets a flag the next kernel overwrites; note
        # the kernel so the simulator can fail the run.
        if int(device_id) == 0 and ipc.races is not None and ipc.races.races_found:
            RACES.add(f"a kernel run on {ipc._get_shared_memory().num_devices} device(s)")
        return orig_validate(token, device_id)

    return [(ipc, "_validate", validate)]


def _fault_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import faults

    return faults.targets()


def _fast_path_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import fast_path

    return fast_path.targets()


def _shadow_targets() -> list[tuple[Any, str, Any]]:
    return shadow.targets()


def _scoped_refs_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import scoped_refs

    return scoped_refs.targets()


def _masked_swap_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import masked_swap

    return masked_swap.targets()


def _value_ops_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import value_ops

    return value_ops.targets()


def _view_refs_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import view_refs

    return view_refs.targets()


def _closed_scalars_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import closed_scalars

    return closed_scalars.targets()


def _refusal_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import refusals

    return refusals.targets()


def _poison_buffers_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas.mosaic.interpret import utils

    orig = utils.get_uninitialized_value

    def get_uninitialized_value(dtype: Any, uninitialized_memory: Any) -> Any:
        # Under jax_pallas_poison_buffers, Mosaic stores NaN, True or the smallest integer into
        # every buffer it allocates (lowering.py _poison_memref); the chip's value for an integer.
        if (
            uninitialized_memory == "nan"
            and pallas_core.poison_buffers_enabled()
            and jnp.issubdtype(dtype, jnp.integer)
        ):
            return jnp.iinfo(dtype).min
        return orig(dtype, uninitialized_memory)

    return [(utils, "get_uninitialized_value", get_uninitialized_value)]


def _grid_bound_targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc.interpret_pallas_call

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        # A grid size known at run time reaches the kernel as an operand of one element
        # (pallas_call.py: "size-1 arrays"); Mosaic takes its one element as the bound
        # whatever its shape (JAX's test_dynamic_grid_with_smem_output passes a (1,) array).
        # The interpreter compares the grid index with it as it is: a (1,) bound fails with
        # "Pred must be a scalar".
        count = kw["grid_mapping"].num_dynamic_grid_bounds
        args = tuple(
            jnp.reshape(a, ()) if i < count and np.size(a) == 1 and np.ndim(a) > 0 else a
            for i, a in enumerate(args)
        )
        return orig(*args, **kw)

    return [(ipc, "interpret_pallas_call", interpret_pallas_call)]


def _dma_clocks_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import dma_clocks

    return dma_clocks.targets()


def _resident_aliases_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import resident_aliases

    return resident_aliases.targets()


def _hardware_prng_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import hardware_prng

    return hardware_prng.targets()


def _core_local_smem_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import core_local_smem

    return core_local_smem.targets()


def _operand_spaces_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import operand_spaces

    return operand_spaces.targets()


def _kernel_semaphores_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import kernel_semaphores

    return kernel_semaphores.targets()


def _kernel_key_impls_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import kernel_key_impls

    return kernel_key_impls.targets()


def _key_refs_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import key_refs

    return key_refs.targets()


def _regular_dma_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import regular_dma

    return regular_dma.targets()


def _semaphore_read_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import semaphore_read

    return semaphore_read.targets()


def _fetch_and_add_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import fetch_and_add

    return fetch_and_add.targets()


def _custom_vjp_callbacks_targets() -> list[tuple[Any, str, Any]]:
    from jax._src import callback, effects

    allowed = effects.custom_derivatives_allowed_effects
    io = (callback.IOEffect, callback.OrderedIOEffect)

    def contains(eff: Any) -> bool:
        # As jax 0.12 registers them (callback.py: custom_derivatives_allowed_effects.add_type).
        return isinstance(eff, io) or type(allowed).contains(allowed, eff)

    return [(allowed, "contains", contains)]


def _pinned_buffers_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import pinned_buffers

    return pinned_buffers.targets()


def _dma_add_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import dma_add

    return dma_add.targets()


def _pipeline_primitive_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import pipeline_primitive

    return pipeline_primitive.targets()


def _sparsecore_bitcast_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import sc_bitcast

    return sc_bitcast.targets()


def _chip_matmul_targets() -> list[tuple[Any, str, Any]]:
    return chip_matmul.targets()


def _padding_copy_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import padding_copy

    return padding_copy.targets()


def _scalar_division_targets() -> list[tuple[Any, str, Any]]:
    return scalar_division.targets()


def _kernel_effects_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import kernel_effects

    return kernel_effects.targets()


def _aliased_outputs_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import aliased_outputs

    return aliased_outputs.targets()


def _schedule_targets() -> list[tuple[Any, str, Any]]:
    from coremesh.testing.sim import schedule

    return schedule.targets()


PATCHES: tuple[Patch, ...] = (
    Patch(
        "simulated_chip",
        "pltpu.get_tpu_info() raises 'Unsupported TPU device kind: cpu' (tpu_info.py:521), "
        "pltpu.is_tpu_device() is False and create_tensorcore_mesh() reads num_cores of a CPU "
        "device (core.py:403); a CPU device has no num_cores, which TPU devices answer",
        _tpu_info_targets,
    ),
    Patch(
        "host_devices",
        "jax.devices() lists every host CPU device the process has, not the simulated ones",
        _host_devices_targets,
    ),
    Patch(
        "io_callback_host_copy",
        "io_callback's device_put (callback.py:434) deadlocks with >1 host device and operands "
        "over ~100 KiB",
        _io_callback_targets,
    ),
    Patch(
        "padding_copy",
        "with buffer_bounds='padded' the interpreter's allocation copies every buffer's value "
        "a second time to pad it (_get_with_padding: np.full of the padded shape, then the "
        "value written in), even when the shape is whole tiles already and the padded array "
        "equals the value",
        _padding_copy_targets,
    ),
    Patch(
        "partial_manual_refusal",
        "a kernel in a partly manual SPMD computation (vmap of a shard_map over one axis of an "
        "Explicit mesh) fails in lowering with jax's NotImplementedError for callbacks "
        "(callback.py _callback_op_sharding), which names neither the kernel nor a way out",
        _partial_manual_targets,
    ),
    Patch(
        "intercore",
        "device_id={'core': i} raises (utils.py:224) and DMAs land on the source core "
        "(interpret_pallas_call.py:1066); jax 0.12 maps core axes and delivers to the named core",
        _intercore_targets,
        fixed_in="0.12.0",
    ),
    Patch(
        "signal_core",
        "a semaphore_signal without core_index goes to core 0, not the signalling core "
        "(interpret_pallas_call.py:1179; still so in 0.12.0.1), which hangs plain 2-core kernels",
        _signal_targets,
    ),
    Patch(
        "regular_dma_semaphores",
        "a DMA signals a REGULAR semaphore with the bytes it moved, as it does a DMA semaphore "
        "(interpret_pallas_call.py DMA.execute_read / execute_write: data_size); Mosaic's DMA "
        "adds 1 to a regular one, so a kernel that waits for 1 ends with it at bytes - 1",
        _regular_dma_targets,
    ),
    Patch(
        "dma_add",
        "a DMA with add=True overwrites its destination: the interpreter never reads dma_start's "
        "add param (interpret_pallas_call.py dma_start; still so in 0.12.0.1), and Mosaic's DMA "
        "adds to it (atomically, as several subcores scatter-add into one VMEM_SHARED buffer)",
        _dma_add_targets,
    ),
    Patch(
        "fast_path",
        "every load and store of an interpreted kernel is a host callback (tens of µs; "
        "interpret_pallas_call.py get/store/swap) and so is each pipeline block copy: "
        "core-local pallas_calls and TensorCore-mesh kernels of local DMAs run as compiled XLA "
        "instead, where that pays (simulate(fast_path=...))",
        _fast_path_targets,
    ),
    Patch(
        "sparsecore_axes",
        "axis_index on SparseCore mesh axes returns 0 for every subcore "
        "(interpret_pallas_call.py:1380)",
        _interpret_call_targets,
    ),
    Patch(
        "sparsecore_primitives",
        "load_gather/store_scatter/parallel_loop have no interpreter rule "
        "(interpret_pallas_call.py:1701)",
        _sparsecore_primitive_targets,
    ),
    Patch(
        "subcore_barrier",
        "plsc.subcore_barrier() cannot be honoured: the simulator runs a SparseCore mesh's "
        "subcores one after the other on one interpreter core (patch sparsecore_axes), and the "
        "interpreter keeps VMEM_SHARED per core (interpret_pallas_call.py "
        "_local_core_id_or_zero_if_hbm shares HBM only), so subcores on threads would not "
        "share it",
        _subcore_barrier_targets,
    ),
    Patch(
        "scoped_refs",
        "jax.empty_ref in a kernel body (scratch Mosaic allocates for the rest of the region) "
        "has no interpreter rule: it stays a JAX mutable array and the core's program fails to "
        "compile ('No state discharge rule implemented for primitive: io_callback', a raw "
        "CpuCallback error)",
        _scoped_refs_targets,
    ),
    Patch(
        "view_refs",
        "a load, store or DMA through ref.reshape(...), ref.transpose(...) or ref.bitcast(...) "
        "fails in its callback with \"'ReshapeTransform' object has no attribute 'indices'\" "
        "(utils.py to_range reads every transform as an index): JAX's ragged_paged_attention "
        "loads its KV pages so, and tpu_ops_test loads through ref.bitcast",
        _view_refs_targets,
    ),
    Patch(
        "masked_swap",
        "a masked store (pltpu.store(ref, x, mask=...)) whose mask is true past the size of a "
        "later axis, counted on the first axis, fails as 'Out-of-bounds masked swap' "
        "(shared_memory.py swap_buffer_content: in_bounds_mask[in_bounds_shape[i]:] for every i)",
        _masked_swap_targets,
    ),
    Patch(
        "value_ops",
        "pltpu.pack_elementwise, unpack_elementwise and stochastic_round have no CPU lowering: "
        "the core's program fails to compile in a host callback ('MLIR translation rule for "
        "primitive ... not found for platform cpu', a raw CpuCallback error); before jax 0.12 "
        "so has pltpu.trace_value",
        _value_ops_targets,
    ),
    Patch(
        "pipeline_primitive",
        "with jax_use_emit_pipeline_primitive on, the emit_pipeline primitive has no interpreter "
        "rule (interpret_pallas_call.py:1688 binds it on the refs' buffer ids): the kernel fails "
        'with "`JaxprInputEffect` Read<...> does not have a corresponding jaxpr input" or a '
        "raw CpuCallback error ('Cannot lower jaxpr with effects'); jax 0.11 expands it as the "
        "lowering does (emit_pipeline_to_jaxpr)",
        _pipeline_primitive_targets,
        fixed_in="0.11.0",
    ),
    Patch(  # after sparsecore_primitives: it rewrites each level first, before that refusal
        "sparsecore_bitcast",
        "plsc.bitcast binds the SparseCore primitive bitcast (sc_primitives.py bitcast_p), which "
        "has no interpreter rule and no CPU lowering: the core's program fails to compile "
        "('MLIR translation rule for primitive 'bitcast' not found for platform cpu'); jax 0.12 "
        "makes it pltpu.bitcast(x, dtype, dim=-1), which the interpreter runs",
        _sparsecore_bitcast_targets,
        fixed_in="0.12.0",
    ),
    Patch(
        "host_memory_space",
        "a pallas_call operand or result in host memory (pl.HOST: a DMA between HBM and pinned "
        "host memory) fails in the interpreter with 'KeyError: <MemorySpace.HOST: 'host'>' "
        "(interpret_pallas_call.py TPU_MEMORY_SPACE_IDXS has no HOST); jax 0.11 adds it",
        _host_memory_space_targets,
        fixed_in="0.11.0",
    ),
    Patch(
        "nested_ref_views",
        "a DMA between views of views (an emit_pipeline's blocks of a ref.at[...] view, or of "
        "an outer pipeline's block) reaches the interpreter's dma_start callback with a "
        "TransformedRef as its buffer id and fails with 'Triggering __jax_array__() during "
        "abstractification is no longer supported' (primitives.py _get_ref_and_transforms "
        "peels one view); jax 0.12.1 fails earlier, 'TransformedRef cannot wrap a "
        "TransformedRef', as the interpreter unflattens an inner pipeline's operands",
        _nested_ref_views_targets,
    ),
    Patch(
        "out_memory_kinds",
        "a jit whose out_shardings name a memory kind (pinned_host) fails to lower around an "
        "ordered io_callback, as every interpreted kernel is: 'safe_zip() argument 1 has length "
        "2 but argument 0 has length 1' (mlir.py lower_jaxpr_to_fun puts the effect tokens' "
        "memory kinds before result_memory_kinds, not before propagated_out_mem_kinds)",
        _out_memory_kinds_targets,
    ),
    Patch(
        "mpmd_kernels",
        "pl.kernel over several meshes (MPMD) fails to lower in interpret mode with "
        "'NotImplementedError: Lowering multiple mesh/function pairs' (mpmd.py:500)",
        _mpmd_targets,
    ),
    Patch(
        "closed_scalars",
        "a scalar a pl.kernel / core_map body closes over reaches it as its int16 buffer id: "
        "the CPU lowering (mpmd.py _mpmd_map_fallback_lowering) skips Mosaic's rewrite of it "
        "into a (1,) SMEM ref (pallas_call_registration.py _rewrite_jaxpr_for_lowering), so "
        "'n * 3' raises 'lax.mul requires arguments to have the same dtypes, got int16, int32'",
        _closed_scalars_targets,
    ),
    Patch(
        "own_interpret_params",
        "a call's own interpret=InterpretParams(...) is replaced by the forced mode's "
        "(pallas_call.py:1257, core.py:1535, helpers.py:248, mpmd.py:617)",
        _own_params_targets,
    ),
    Patch(
        "made_outside",
        "a pl.pallas_call / pl.kernel made before the forced interpret mode was entered keeps "
        "interpret=False (pallas_call.py:1257, helpers.py:248) and fails on the CPU with 'Only "
        "interpret mode is supported on CPU backend'",
        _made_outside_targets,
    ),
    Patch(
        "compile_cache",
        "thread_map recompiles every core's program on every call (thread_map.py:34)",
        _compile_cache_targets,
    ),
    Patch(
        "idle_cores",
        "on a chip of 2 TensorCores every pallas_call runs each core's grid share on a thread "
        "of its own, in a program XLA compiles separately (interpret_pallas_call.py, "
        "thread_map), even when the split by parallel dimensions leaves core 1 no grid step",
        _idle_cores_targets,
    ),
    Patch(
        "fast_transforms",
        "each callback converts its index transforms through jax's generic pytree map "
        "(interpret_pallas_call.py:590)",
        _fast_transforms_targets,
    ),
    Patch(
        "deadlock_watchdog",
        "a semaphore wait nobody signals polls forever (shared_memory.py:158)",
        _watchdog_targets,
    ),
    Patch(
        "dma_schedule",
        "the interpreter completes DMAs in one fixed order (at the start, or at the wait that "
        "needs them, newest first: shared_memory.py:197), so a kernel that relies on another "
        "order is never caught; simulate(schedule=...) chooses the order",
        _schedule_targets,
    ),
    Patch(
        "grid_bound_arrays",
        "a pallas_call grid size known at run time given as a (1,) array (the form pallas_call "
        "passes it in, pallas_call.py '_pallas_call_batching_rule') fails in the interpreter's "
        "grid loop with 'Pred must be a scalar' (interpret_pallas_call.py _execute_grid_for_core)",
        _grid_bound_targets,
    ),
    Patch(
        "dma_clocks",
        "the race detector gives each DMA a vector-clock entry drawn at random from as many "
        "spares as there are cores (shared_memory.py get_random_virtual_device_id): two DMAs "
        "that draw the same one look ordered, so a race through them goes unreported (two DMAs "
        "in flight into one buffer on a 1-core chip, always)",
        _dma_clocks_targets,
    ),
    Patch(
        "race_report",
        "detected races are only printed (race_detection_state.py); jax 0.12 raises at the race",
        _race_report_targets,
        fixed_in="0.12.0",
    ),
    Patch(
        "fault_report",
        "an exception inside a kernel's callback reaches the user as 'JaxRuntimeError: "
        "INTERNAL: CpuCallback error' (callback.py), without device, core, line or buffer",
        _fault_targets,
    ),
    Patch(
        "kernel_refusals",
        "the interpreter runs what the chip refuses: VMEM/SMEM beyond the chip's, a barrier "
        "semaphore without a collective id, and a kernel that ends with a semaphore above zero "
        "or a DMA never waited (it only prints, interpret_pallas_call.py:310)",
        _refusal_targets,
    ),
    Patch(
        "hardware_prng",
        "pltpu.prng_seed is ignored and every pltpu.prng_random_bits is zeros "
        "(interpret_pallas_call.py: 'TODO(jburnim): Implement this properly?'), so dropout "
        "masks and pltpu.stateful_uniform samples are constant, in silence",
        _hardware_prng_targets,
    ),
    Patch(
        "resident_aliases",
        "a kernel result whose out_shape is pltpu.VMEM/SMEM(...), aliased to an operand, gets a "
        "buffer of its own (the chip: the operand's), so what the kernel leaves in the operand "
        "never reaches the result: it is the fill (interpret_pallas_call.py, output blocks)",
        _resident_aliases_targets,
    ),
    Patch(
        "core_local_smem",
        "an SMEM array made outside the kernels and used by kernels over several TensorCores "
        "is one array for all cores (each TensorCore has its own SMEM): every core copies it in "
        "and out whole, so one core's writes overwrite another's (interpret_pallas_call.py, "
        "kernel buffers)",
        _core_local_smem_targets,
    ),
    Patch(  # after resident_aliases and core_local_smem: they read the blocks it corrects
        "mpmd_operand_spaces",
        "a pl.kernel (mpmd_map) operand made outside in SMEM or VMEM gets a block in ANY, and "
        "its aliased result no memory space, while its kernel ref stays in SMEM/VMEM: the "
        "interpreter allocates it in HBM and the body's first access fails (\"KeyError: "
        "('smem', 100, 0, 0)\"); jax 0.11 lowers both in the ref's space",
        _operand_spaces_targets,
        fixed_in="0.11.0",
    ),
    Patch(
        "kernel_semaphores",
        "a kernel whose operands or results are semaphores (a copy started in one kernel and "
        "waited for in the next) fails: the interpreter fills a semaphore result like data "
        "('nan + dma_sem', utils.py get_uninitialized_array) and copies a semaphore operand as "
        "a buffer ('Cannot interpret 'dma_sem' as a data type'), and each kernel's semaphores "
        "end with it",
        _kernel_semaphores_targets,
    ),
    Patch(
        "key_refs",
        "a kernel whose operands, results or scratch are PRNG keys fails: the interpreter fills "
        "a key result like data ('nan + key<fry>', utils.py get_uninitialized_array) and copies "
        "a key operand as a buffer ('Cannot interpret 'key<fry>' as a data type'); a pallas_tpu "
        "key's random_bits, fold_in, unwrap_pallas_seed and prng_seed(key) have no CPU lowering",
        _key_refs_targets,
    ),
    Patch(
        "kernel_key_impls",
        "a PRNG implementation written as a Pallas kernel (pallas_threefry2x32, "
        "pallas_philox4x32) fails under jit with 'KeyError: OrderedIOEffect': random_bits and "
        "the other key primitives are declared effect-free (prng.py random_bits_lowering, "
        "mlir.lower_fun), and the interpreted kernel is ordered io_callbacks with no token",
        _kernel_key_impls_targets,
    ),
    Patch(
        "poison_buffers",
        "with jax_pallas_poison_buffers on, Mosaic fills a fresh integer buffer with the smallest "
        "integer (lowering.py _poison_memref); the interpreter fills it with the largest "
        "(utils.py get_uninitialized_value)",
        _poison_buffers_targets,
    ),
    Patch(
        "uninitialized_reads",
        "a load or DMA of memory nobody wrote returns the fill value (NaN, or the largest "
        "integer) in silence (utils.py get_uninitialized_array)",
        _shadow_targets,
    ),
    Patch(
        "fetch_and_add",
        "plsc.fetch_and_add (sc_fetch_and_add) has no interpreter rule in any jax release "
        "(0.10.2 to 0.12.0.1: the fallback at the end of _interpret_jaxpr binds it with the "
        "ref's buffer id and fails), and the subcores of a kernel without a barrier share one "
        "interpreter core, so another subcore's SMEM does not exist apart",
        _fetch_and_add_targets,
    ),
    Patch(
        "semaphore_read",
        "pl.semaphore_read has no interpreter rule in any jax release (0.10.2 to 0.12.0.1: the "
        "fallback at the end of _interpret_jaxpr binds it on the semaphore's id, which XLA:CPU "
        "cannot lower)",
        _semaphore_read_targets,
    ),
    Patch(
        "custom_vjp_callbacks",
        "with jax_enable_checks on (as JAX's tests run), an interpreted kernel inside a "
        "jax.custom_vjp (JAX's splash attention, whose backward pass is kernels of its own) "
        "fails its type check: 'NotImplementedError: Effects not supported in `custom_vjp`: "
        "[IOEffect, OrderedIOEffect]' (custom_derivatives.py _custom_vjp_call_typecheck): the "
        "interpreter's io_callbacks are effects jax allows in custom derivatives only from 0.12",
        _custom_vjp_callbacks_targets,
        fixed_in="0.12.0",
    ),
    Patch(
        "pinned_buffers",
        "a pinned array (jax._src.state.primitives pin / unpin) aliased through a pallas_call "
        "fails to lower on the CPU: the interpreter's callback has no XLA shape for it "
        "('No xla_shape_handler for type: AbstractLinVal'), and pin and unpin lower only for TPU "
        "(custom calls 'Pin' and 'Unpin' on a memref type)",
        _pinned_buffers_targets,
    ),
    Patch(
        "padded_aliased_outputs",
        "an output aliased to an input that is not a whole number of blocks comes back at the "
        "input's padded shape (interpret_pallas_call reads it as input_args[...], padded by "
        "pad_to_block_dimension), and lowering fails: 'type of return operand ... doesn't match "
        "function result type'",
        _aliased_outputs_targets,
    ),
    Patch(
        "chip_matmul",
        "a float32 matrix product at the default precision is computed in float32 on the CPU "
        "(XLA:CPU's dot_general), where a TPU's MXU rounds the operands to bfloat16, outside "
        "kernels (XLA:TPU) and inside them (Mosaic); and XLA:CPU's float32 sums depend on the "
        "shapes, so a blocked kernel and its whole-matrix reference differ in their last bits",
        _chip_matmul_targets,
    ),
    Patch(
        "scalar_division",
        "XLA's algebraic simplifier rewrites a floating division by a broadcast scalar into a "
        "multiplication by its reciprocal in some programs and not others (not in the one "
        "jax.vjp compiles for x / 3.0), so a function and its vjp differ in the last bit on the "
        "CPU, and the chip's bfloat16 rounding of products makes that bit visible",
        _scalar_division_targets,
    ),
    Patch(
        "kernels_under_remat",
        "an interpreted kernel declares the effects of its host callbacks (IOEffect, "
        "OrderedIOEffect), which jax.checkpoint refuses: differentiating a remat'd function "
        "that calls a kernel fails ('Effects not supported in partial-eval of "
        "`checkpoint`/`remat`'), where on a TPU the kernel has no effects and is recomputed",
        _kernel_effects_targets,
    ),
    Patch(
        "interpreter_checks",
        "under jax_enable_checks (JAX's test case turns it on) the interpreter's own program, a "
        "host callback for every load, store and DMA of a kernel, is type-checked as the "
        "kernel's lowering traces it (interpret_pallas_call.py): checks of jax's interpreter, "
        "not of the kernel, whose jaxpr was checked when it was traced",
        _interpreter_checks_targets,
    ),
)

PATCH_NAMES = tuple(p.name for p in PATCHES)


@dataclasses.dataclass
class _State:
    """What install() did: the originals to restore and the patches that are on."""

    saved: list[tuple[Any, str, Any]] = dataclasses.field(default_factory=list)
    enabled: frozenset[str] = frozenset()


_lock = threading.RLock()
_state = _State()
#: Saved in place of an attribute a class inherits: restoring deletes the override.
_INHERITED = object()


def _own_attribute(obj: Any, attr: str) -> Any:
    own = getattr(obj, "__dict__", None)
    if own is not None and attr not in own:
        return _INHERITED  # a class's inherited attribute, or an instance's class attribute
    return getattr(obj, attr)


def active() -> tuple[str, ...]:
    """The patches this jax needs (whatever ``disable_patches`` leaves out)."""
    return tuple(p.name for p in PATCHES if p.needed())


def install(slice_: ActiveSlice, without: Collection[str] = ()) -> None:
    """Apply the patches (all but ``without``) for the simulator ``slice_``, whose chip and
    devices they answer with; nested calls stack it."""
    unknown = set(without) - set(PATCH_NAMES)
    if unknown:
        raise CoremeshError(
            f"unknown simulator patch(es) {sorted(unknown)}",
            rule=f"the patches are {', '.join(PATCH_NAMES)}",
            fix="name patches from that list",
        )
    wanted = frozenset(PATCH_NAMES) - set(without)
    with _lock:
        if active_slice() is None:
            check_jax_version()
            _state.enabled = wanted
            # sparsecore_axes lives in the interpret_pallas_call wrapper, which also checks
            # meshes against the chip: install that wrapper whenever either is wanted.
            for patch in PATCHES:
                if patch.needed() and (patch.name in wanted or patch.name == "sparsecore_axes"):
                    for obj, attr, new in patch.targets():
                        _state.saved.append((obj, attr, _own_attribute(obj, attr)))
                        setattr(obj, attr, new)
        elif wanted != _state.enabled:
            raise CoremeshError(
                "a nested simulate() asks for a different set of patches",
                rule="patches are process-wide; nested contexts share the outer one's",
                fix="pass the same disable_patches to nested simulate() contexts",
            )
        enter(slice_)
        _user_threads[threading.get_ident()] += 1
        _clear_caches()
        _sync_lowering_states()


def _sync_lowering_states() -> None:
    """Set the jit-keyed states of the lowering patches to what the innermost simulator has in
    force (off outside every simulator)."""
    chip_matmul.sync(in_force("chip_matmul"))
    scalar_division.sync(in_force("scalar_division"))


def uninstall() -> None:
    """Undo the innermost :func:`install`; the last one restores every original."""
    with _lock:
        leave()
        me = threading.get_ident()
        _user_threads[me] -= 1
        if _user_threads[me] <= 0:
            del _user_threads[me]
        if active_slice() is None:
            while _state.saved:
                obj, attr, old = _state.saved.pop()
                if old is _INHERITED:
                    delattr(obj, attr)
                else:
                    setattr(obj, attr, old)
            _state.enabled = frozenset()
            shadow.forget()
        _clear_caches()
        _sync_lowering_states()


def enabled() -> frozenset[str]:
    return _state.enabled


def in_force(name: str) -> bool:
    """Is patch ``name`` applied now: enabled in this simulate() and needed by this jax?"""
    return name in _state.enabled and any(p.name == name and p.needed() for p in PATCHES)


def _clear_caches() -> None:
    jax_compat.tpu_info_module().get_tpu_info.cache_clear()


@functools.cache
def describe() -> tuple[tuple[str, str], ...]:
    """(name, upstream gap) of every patch, for documentation and reports."""
    return tuple((p.name, p.why) for p in PATCHES)


def installed_chip() -> SimulatedChip | None:
    """The chip the patched jax answers for now, or None outside every context."""
    slice_ = active_slice()
    return slice_.simulated_chip if slice_ is not None else None
