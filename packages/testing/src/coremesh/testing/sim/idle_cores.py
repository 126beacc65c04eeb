"""A ``pallas_call`` whose grid gives work to its first core only runs that core inline.

On a chip of two TensorCores (v4, v5p, TPU7x) the interpreter splits a ``pallas_call``'s grid
between the cores by its ``parallel`` dimensions, and runs the cores on threads (``thread_map``):
each core's program is traced, lowered and compiled by XLA:CPU as a program of its own, and every
core runs, even one the split leaves without a grid step. With no ``parallel`` dimension (or one
of a single point) the split gives the whole grid to core 0 and nothing to core 1: the second
core's thread runs an empty loop, and the separate program costs about 0.1 s of XLA compile per
kernel shape (a small kernel's whole call is about 0.15 s).

When the split leaves every core but the first without a step, core 0's grid runs in the call's
own program, as the interpreter runs a chip of one core (``thread_map`` with one thread). The
kernel's buffers are still allocated for every core. All an idle core did was evaluate the block
index maps at the grid point past its empty range and loop zero times: nothing a result, a race
report or a DMA depends on.
"""

from __future__ import annotations

from typing import Any

#: The grid-running function the interpreter hands ``thread_map`` for a ``pallas_call``.
_GRID_RUNNER = "_execute_grid_for_core"


def only_first_core_works(f: Any) -> bool:
    """Does ``f`` (a function given to ``thread_map``) run a ``pallas_call`` grid that leaves
    every core but core 0 without a step? Read from its closure: a static grid's
    ``num_iterations`` and ``num_iterations_per_core`` (core c runs steps ``[c * per_core,
    min((c + 1) * per_core, num_iterations))``). A ``core_map`` (``mesh`` set) or a dynamic grid
    (traced counts) is never run inline."""
    if getattr(f, "__name__", None) != _GRID_RUNNER or f.__closure__ is None:
        return False
    cells = dict(zip(f.__code__.co_freevars, f.__closure__, strict=True))
    try:
        mesh = cells["mesh"].cell_contents
        total = cells["num_iterations"].cell_contents
        per_core = cells["num_iterations_per_core"].cell_contents
    except (KeyError, ValueError):  # a jax whose grid runner keeps other names: upstream's way
        return False
    if mesh is not None or type(total) is not int or type(per_core) is not int:
        return False
    return per_core >= total


def targets() -> list[tuple[Any, str, Any]]:
    import jax.numpy as jnp
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    original = ipc.thread_map

    def thread_map(f: Any, num_threads: int, token: Any, *args: Any, **kwargs: Any) -> Any:
        if num_threads > 1 and only_first_core_works(f):
            # thread_map's own one-thread path (thread_map.py): core 0 in the caller's program.
            return f(jnp.int32(0), token, *args)
        return original(f, num_threads, token, *args, **kwargs)

    return [(ipc, "thread_map", thread_map)]
