"""In-kernel collectives inside a user's own kernel body, checked against jax.lax.

The user writes ``pl.kernel`` (or ``coremesh.tensorcore.kernel``) over the TensorCore mesh, does
its own compute in VMEM, and calls a collective on VMEM refs; it allocates its semaphores and
buffers itself, or takes them from the kernel's scratch (``scratch_for``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.collectives import in_kernel
from coremesh.collectives.axes import resolve
from coremesh.collectives.reference import lax_equivalent
from coremesh.core import jax_compat
from coremesh.testing.conformance.collectives import run_per_device
from coremesh.testing.plugin import SliceFactory

pytestmark = pytest.mark.sim

R, L = 8, 128

CORES = 2  # v5p
BAD_OP: Any = "prod"
AXES: dict[str, Any] = {"device": "device", "core": "core", "hier": ("device", "core")}
PARTICIPANTS = {"device": 4, "core": CORES, "hier": 4 * CORES}
F = Callable[..., Any]


def test_the_guides_core_swap(operand: F, slice_target: SliceFactory) -> None:
    """The core_map guide's swap: each core sends its column half to the other core, x2."""

    def per_device(x: Any) -> Any:
        def body(x_hbm: Any, o_hbm: Any) -> None:
            core = lax.axis_index("core")
            width = x_hbm.shape[1] // lax.axis_size("core")
            cols = pl.ds(core * width, width)

            def scoped(mine: Any, theirs: Any) -> None:
                pltpu.sync_copy(x_hbm.at[:, cols], mine)
                in_kernel.ppermute(mine, theirs, [(0, 1), (1, 0)], axis="core")
                theirs[...] = theirs[...] * 2
                pltpu.sync_copy(theirs, o_hbm.at[:, cols])

            buf = pltpu.VMEM((x_hbm.shape[0], width), x_hbm.dtype)
            pl.run_scoped(scoped, buf, buf)

        cid = cc.default_allocator().id_for("test_the_guides_core_swap")
        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=jax_compat.tensorcore_mesh("core"),  # the device's own cores
            compiler_params=pltpu.CompilerParams(collective_id=cid),
        )(x)

    x = operand((4 * R, 2 * L), "float32")
    with slice_target(chip="v5p", devices=4, races=True) as sim:
        got = run_per_device(sim, per_device, x)
    xs = np.asarray(x)
    np.testing.assert_array_equal(got, np.concatenate([xs[:, L:], xs[:, :L]], axis=1) * 2)


BLOCK_CASES = [
    ("all_gather", "device"),
    ("all_gather", "core"),
    ("all_gather", "hier"),
    ("reduce_scatter", "device"),
    ("reduce_scatter", "hier"),
    ("all_reduce", "core"),
    ("all_reduce", "hier"),
    ("all_to_all", "device"),
    ("all_to_all", "hier"),
]


def _shapes(op: str, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if op == "all_gather":
        return (R, L), (n, R, L)
    if op == "reduce_scatter":
        return (n, R, L), (R, L)
    return (n, R, L), (n, R, L)


def _reference(op: str, kind: str, n: int) -> Callable[[Any], Any]:
    """The package's jax.lax equivalent of ``op`` on one participant's operand, which carries a
    leading dim of 1 here (an all-reduce, elementwise, keeps it)."""
    kw: dict[str, Any] = {"split_axis": 0, "concat_axis": 0} if op == "all_to_all" else {}
    fn = lax_equivalent(op, AXES[kind], size=n, **kw)
    if op == "all_reduce":
        return fn
    return lambda v: fn(v[0])[None]


@pytest.mark.parametrize("allocate", ["scoped", "kernel"])
@pytest.mark.parametrize(("op", "kind"), BLOCK_CASES, ids=["-".join(c) for c in BLOCK_CASES])
def test_collective_in_a_users_kernel(
    op: str, kind: str, allocate: str, operand: F, lax_reference: F, slice_target: SliceFactory
) -> None:
    """Each core loads its operand into VMEM, scales it (the user's compute), runs the collective
    and stores its result: one participant per core (or per device for the device axis)."""
    n = PARTICIPANTS[kind]
    src_shape, dst_shape = _shapes(op, n)

    def per_device(x: Any) -> Any:
        chunk = {"all_gather": src_shape, "reduce_scatter": dst_shape}.get(op, src_shape[1:])
        spec = in_kernel.scratch_for(op, resolve(AXES[kind]), chunk, x.dtype)

        def body(x_hbm: Any, o_hbm: Any, src: Any, dst: Any, *scr: Any) -> None:
            core = lax.axis_index("core")
            pltpu.sync_copy(x_hbm.at[core], src)
            src[...] = src[...] * 3
            getattr(in_kernel, op)(
                src,
                dst,
                axis=AXES[kind],
                scratch=spec.bind(scr) if allocate == "kernel" else None,
            )
            pltpu.sync_copy(dst, o_hbm.at[core])

        return tc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((CORES, *dst_shape), x.dtype),
            scratch=[
                pltpu.VMEM(src_shape, x.dtype),
                pltpu.VMEM(dst_shape, x.dtype),
                *(spec.types if allocate == "kernel" else []),
            ],
            collective_id="auto",
            name=f"test_block_{op}_{kind}_{allocate}",
        )(x)

    x = operand((4 * CORES, *src_shape), "float32", seed=8)
    with slice_target(chip="v5p", devices=4, dma_execution_mode="on_wait", races=True) as sim:
        got = run_per_device(sim, per_device, x)
    # jax.lax over participants: per core for the core axes; for the device axis each core is
    # its own participant set (core c of every device), i.e. a (device, core) mesh reduced
    # over "device" only.
    ref_kind = "hier" if kind == "device" else kind
    fn = _reference(op, kind, n)
    want = lax_reference(lambda v: fn(v * 3), x, ref_kind, CORES)
    np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_two_collectives_in_one_kernel(operand: F, slice_target: SliceFactory) -> None:
    """An all-reduce over the cores of a device, then an all-gather over devices: one
    handshake (the first collective's), kernel-level scratch for the second."""

    def per_device(x: Any) -> Any:
        core_ax, dev_ax = resolve("core"), resolve("device")
        ar = in_kernel.scratch_for("all_reduce", core_ax, (R, L), x.dtype).prefixed("ar.")
        ag_spec = in_kernel.scratch_for("all_gather", dev_ax, (CORES, R, L), x.dtype)
        spec = ar + ag_spec.prefixed("ag.")

        def body(x_hbm: Any, o_hbm: Any, src: Any, red: Any, out: Any, *scr: Any) -> None:
            s = spec.bind(scr)
            # Both handshakes at once: the first collective meets every peer of both collectives.
            core = lax.axis_index("core")
            pltpu.sync_copy(x_hbm, src)
            in_kernel.barrier(("device", "core"))
            in_kernel.all_reduce(src, red, axis="core", scratch=s.sub("ar."), handshake=False)
            in_kernel.all_gather(red, out, axis="device", scratch=s.sub("ag."), handshake=False)

            @pl.when(core == 0)
            def _() -> None:
                pltpu.sync_copy(out, o_hbm)

        return tc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((4, CORES, R, L), x.dtype),
            scratch=[pltpu.VMEM((CORES, R, L), x.dtype)] * 2
            + [pltpu.VMEM((4, CORES, R, L), x.dtype), *spec.types],
            collective_id="auto",
            name="test_two_collectives",
        )(x)

    x = operand((4 * CORES, R, L), "float32", seed=9)
    with slice_target(chip="v5p", devices=4, dma_execution_mode="on_wait", races=True) as sim:
        got = run_per_device(sim, per_device, x)
    # Both cores of a device load the same operand, so the all-reduce over cores doubles it;
    # the all-gather then stacks every device's result on every device.
    doubled = CORES * np.asarray(x).reshape(4, CORES, R, L)
    np.testing.assert_array_equal(got.reshape(4, 4, CORES, R, L), np.stack([doubled] * 4))


def test_in_kernel_collectives_refuse_what_cannot_work(slice_target: SliceFactory) -> None:
    errors: list[Exception] = []

    def per_device(x: Any) -> Any:
        def body(x_hbm: Any, o_hbm: Any, src: Any, dst: Any, big: Any) -> None:
            calls: list[Callable[[], None]] = [
                lambda: in_kernel.all_gather(src, src, axis="device"),  # dst not (n, ...)
                lambda: in_kernel.all_gather(src, o_hbm, axis="core"),  # HBM receiver, core axis
                lambda: in_kernel.all_gather(src, big, axis="device", handshake=False),
                lambda: in_kernel.ppermute(src, src, [(0, 1), (1, 1)], axis="core"),
                lambda: in_kernel.all_gather(src, big, axis="chips"),
                lambda: in_kernel.reduce_scatter(big, src, axis="device", op=BAD_OP),
            ]
            for call in calls:
                try:
                    call()
                except cc.CoremeshError as e:
                    errors.append(e)
            pltpu.sync_copy(x_hbm, o_hbm)

        return tc.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((CORES, R, L), x.dtype),
            scratch=[
                pltpu.VMEM((R, L), x.dtype),
                pltpu.VMEM((R, L), x.dtype),
                pltpu.VMEM((4, R, L), x.dtype),
            ],
            name="test_refusals",
        )(x)

    x = jnp.zeros((4 * CORES, R, L), jnp.float32)
    with slice_target(chip="v5p", devices=4):
        jax.jit(
            jax.shard_map(
                per_device,
                mesh=resolve_mesh(),
                in_specs=jax.P("device"),
                out_specs=jax.P("device"),
                check_vma=False,
            )
        ).trace(x)
    kinds = [type(e).__name__ for e in errors]
    assert kinds == [
        "LayoutError",
        "LayoutError",
        "CoremeshError",
        "LayoutError",
        "MeshError",
        "CoremeshError",
    ], kinds
    assert "must be given kernel-level scratch" in str(errors[2])
    assert "not a permutation" in str(errors[3])


def resolve_mesh() -> Any:
    return cc.current_target().device_mesh("device")


def test_former_module_name_still_imports() -> None:
    """``from coremesh.collectives import blocks`` (the module's former name) still works."""
    from coremesh.collectives import blocks

    assert blocks.all_gather is in_kernel.all_gather
    assert blocks.scratch_for is in_kernel.scratch_for
