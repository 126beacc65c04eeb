"""Patch ``regular_dma_semaphores`` on every supported jax line: a DMA that signals a REGULAR
semaphore adds 1 to it (Mosaic, TPU v6 and later), locally and between devices, on either side
of a remote copy, in both DMA modes: the copied data against numpy, and each kernel ends with its
semaphores at zero (or the simulator refuses it); stock interpret mode counts the bytes moved."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import Simulator, UnfinishedKernelError, simulate
from coremesh.testing.sim.simulator import DmaMode

pytestmark = pytest.mark.sim

ROWS = 8
#: The bytes an (8, 128) float32 copy moves: what the interpreter adds to a regular semaphore.
BYTES = ROWS * 128 * 4


def local_copy(x: jax.Array) -> jax.Array:
    """Copy ``x`` HBM -> VMEM -> HBM, each copy signalling one regular semaphore waited for 1
    (the interpreter has no rule for ``pl.semaphore_read``: what a kernel leaves in a semaphore
    is what the simulator reports at its end, a count above zero refused)."""

    def kernel(x_hbm: Any, o_hbm: Any, vmem: Any, sem: Any) -> None:
        pltpu.async_copy(x_hbm, vmem, sem)
        pl.semaphore_wait(sem, 1)
        pltpu.async_copy(vmem, o_hbm, sem)
        pl.semaphore_wait(sem, 1)

    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct.like(x),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.REGULAR],
    )(x)


def remote_shift(sim: Simulator, send_regular: bool, recv_regular: bool) -> Any:
    """Each device sends its block to the next (upstream's test_remote_dma_regular_semaphore,
    with either semaphore regular or a DMA one); returns (blocks sent, blocks received)."""

    def kernel(x_hbm: Any, y_hbm: Any) -> None:
        def body(ready: Any, send: Any, recv: Any) -> None:
            me, n = jax.lax.axis_index("device"), jax.lax.axis_size("device")
            pl.semaphore_signal(ready, device_id={"device": jax.lax.rem(me + n - 1, n)})
            pl.semaphore_wait(ready)
            copy = pltpu.async_remote_copy(
                x_hbm, y_hbm, send, recv, device_id={"device": jax.lax.rem(me + 1, n)}
            )
            if send_regular:
                pl.semaphore_wait(send, 1)
            else:
                copy.wait_send()
            if recv_regular:
                pl.semaphore_wait(recv, 1)
            else:
                copy.wait_recv()

        def kind(regular: bool) -> Any:
            return pltpu.SemaphoreType.REGULAR if regular else pltpu.SemaphoreType.DMA

        pl.run_scoped(body, pltpu.SemaphoreType.REGULAR, kind(send_regular), kind(recv_regular))

    mesh = sim.mesh()
    spec = jax.P("device")

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    def f(x: Any) -> Any:
        return pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
            mesh=jax_compat.tensorcore_mesh("core"),
        )(x)

    x = np.arange(2 * ROWS * 128, dtype=np.float32).reshape(2 * ROWS, 128)
    y = sim.run(f, jax.device_put(x, jax.NamedSharding(mesh, spec)))
    return x, np.asarray(y)


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_local_dma_adds_one_to_a_regular_semaphore(mode: DmaMode) -> None:
    x = np.arange(ROWS * 128, dtype=np.float32).reshape(ROWS, 128)
    with simulate("v6e", 1, dma_execution_mode=mode):  # ends with the semaphore at 0
        y = local_copy(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(y), x)


def test_stock_interpreter_adds_the_bytes_moved() -> None:
    x = np.arange(ROWS * 128, dtype=np.float32).reshape(ROWS, 128)
    # The first copy adds BYTES; the second wait takes 1 of what it left, so the second copy is
    # never waited for (nor, on_wait, run: the result would be the unwritten fill).
    never_waited = r"1 DMA\(s\) signalling semaphore #0 of the kernel .* never waited for"
    with (
        simulate("v6e", 1, disable_patches=["regular_dma_semaphores"]),
        pytest.raises(UnfinishedKernelError, match=never_waited),
    ):
        local_copy(jnp.asarray(x))


@pytest.mark.parametrize(
    ("send_regular", "recv_regular"), [(True, True), (True, False), (False, True)]
)
@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_remote_dma_adds_one_to_each_regular_side(
    mode: DmaMode, send_regular: bool, recv_regular: bool
) -> None:
    with simulate("v6e", 2, dma_execution_mode=mode) as sim:
        x, y = remote_shift(sim, send_regular, recv_regular)
    np.testing.assert_array_equal(y, np.roll(x, ROWS, axis=0))


def test_stock_remote_dma_counts_bytes() -> None:
    with (
        simulate("v6e", 2, disable_patches=["regular_dma_semaphores"]) as sim,
        pytest.raises(UnfinishedKernelError, match=f"ends at count {BYTES - 1}"),
    ):
        remote_shift(sim, True, True)


@pytest.mark.parametrize(("chip", "refused"), [("v5e", True), ("v4", True), ("v5p", False)])
def test_a_regular_semaphore_dma_is_refused_where_mosaic_refuses_it(
    chip: str, refused: bool
) -> None:
    """libtpu's Mosaic refuses a DMA that signals a regular semaphore for v4 and v5e and compiles
    it for v5p; the simulator refuses it on the same chips, with Mosaic's words."""
    from coremesh.testing.aot.topology import CompileTarget
    from coremesh.testing.sim.errors import MosaicRefusalError

    words = "Regular semaphores in EnqueueDMA are not supported on this target"
    x = np.arange(ROWS * 128, dtype=np.float32).reshape(ROWS, 128)
    said = ""
    with CompileTarget.for_chip(chip, devices=1).activate():
        try:
            jax.jit(local_copy).trace(jax.ShapeDtypeStruct(x.shape, x.dtype)).lower().compile()
        except Exception as err:  # the compiler's own error type
            said = str(err)
    assert (words in said) == refused, said
    with simulate(chip, 1):
        if refused:
            with pytest.raises(MosaicRefusalError, match=words):
                jax.jit(local_copy)(x)
        else:
            np.testing.assert_array_equal(np.asarray(jax.jit(local_copy)(x)), x)


def window_copy(full: tuple[int, ...], window: tuple[slice, ...]) -> Any:
    """A kernel copying ``x[window]`` HBM -> VMEM on a REGULAR semaphore, then the VMEM copy
    out with a DMA semaphore (JAX's test_unrolled_dma_with_regular_semaphore_raises, sized)."""
    shape = tuple(len(range(*w.indices(n))) for w, n in zip(window, full, strict=True))

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        def body(vmem: Any, sem: Any, done: Any) -> None:
            pltpu.async_copy(x_hbm.at[window], vmem, sem)
            pl.semaphore_wait(sem)
            pltpu.async_copy(vmem, o_hbm, done).wait()

        pl.run_scoped(
            body,
            pltpu.VMEM(shape, jnp.float32),
            pltpu.SemaphoreType.REGULAR,
            pltpu.SemaphoreType.DMA,
        )

    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
    )


_ALL = slice(None)
_TWO = slice(0, 2)
#: (ref shape, window, strided levels) around the bound: libtpu 0.0.52 compiles 3, unrolls 4.
WINDOWS = [
    ((3, 3, 3, 3, 8, 128), (_TWO,) * 4 + (_ALL,) * 2, 3),
    ((3, 3, 3, 3, 3, 8, 128), (_TWO,) * 5 + (_ALL,) * 2, 4),
    ((3, 3, 3, 3, 3, 8, 128), (_TWO,) * 4 + (_ALL,) * 3, 3),
    ((2, 3, 3, 3, 3, 128), (_ALL,) + (_TWO,) * 4 + (_ALL,), 4),  # JAX's test
    ((2, 3, 3, 3, 3, 128), (slice(0, 1),) + (_TWO,) * 4 + (_ALL,), 3),
    ((3, 3, 3, 3, 128), (_TWO,) * 4 + (_ALL,), 3),
    ((2, 2, 2, 2, 3, 128), (_ALL,) * 4 + (_TWO, _ALL), 1),
    ((3, 3, 3, 3, 16, 128), (_TWO,) * 4 + (slice(0, 8), _ALL), 4),
    ((3, 3, 3, 3, 256), (_TWO,) * 4 + (slice(0, 128),), 3),
    ((3, 3, 3, 3, 3, 8, 256), (_TWO,) * 4 + (_ALL, _ALL, slice(0, 128)), 4),
]


@pytest.mark.parametrize(("full", "window", "levels"), WINDOWS)
def test_a_regular_semaphore_dma_mosaic_unrolls_is_refused(
    full: tuple[int, ...], window: tuple[slice, ...], levels: int
) -> None:
    """libtpu unrolls a transfer of 4 or more strided levels, and then refuses its regular
    semaphore; the simulator counts the same levels and refuses the same kernels with Mosaic's
    words, and runs the others (the window against numpy)."""
    from coremesh.testing.aot.topology import CompileTarget
    from coremesh.testing.sim import dma_unrolling
    from coremesh.testing.sim.errors import MosaicRefusalError

    words = "Non-DMA semaphores in transfers that require unrolling"
    refused = levels >= dma_unrolling.UNROLLED_FROM
    call = window_copy(full, window)
    x = np.arange(np.prod(full), dtype=np.float32).reshape(full)
    said = ""
    with CompileTarget.for_chip("v6e", devices=1).activate():
        try:
            jax.jit(call).trace(jax.ShapeDtypeStruct(full, jnp.float32)).lower().compile()
        except Exception as err:  # the compiler's own error type
            said = str(err)
    assert (words in said) == refused, said
    assert dma_unrolling.levels(*_levels_input(full, window)) == levels
    with simulate("v6e", 1):
        if refused:
            with pytest.raises(MosaicRefusalError, match=words):
                jax.jit(call)(x)
        else:
            np.testing.assert_array_equal(np.asarray(jax.jit(call)(x)), x[window])


def _levels_input(full: tuple[int, ...], window: tuple[slice, ...]) -> Any:
    """The window as :func:`dma_unrolling.levels` takes it, from the traced DMA."""
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    from coremesh.testing.sim import dma_unrolling
    from coremesh.testing.sim.jaxprs import all_eqns

    closed = jax.make_jaxpr(window_copy(full, window))(jax.ShapeDtypeStruct(full, jnp.float32))
    kernel = next(e for e in all_eqns(closed.jaxpr) if e.primitive.name == "pallas_call")
    dma = next(
        e for e in all_eqns(kernel.params["jaxpr"]) if e.primitive is mosaic_primitives.dma_start_p
    )
    src = dma.params["tree"].unflatten(dma.invars)[0]
    return dma_unrolling._window(src)
