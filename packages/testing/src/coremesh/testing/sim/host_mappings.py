"""The host's memory mappings, which compiled programs use up: dropped before they run out.

XLA:CPU keeps each program it compiles in memory mappings of its own (code, constants), and a
Linux process may hold at most ``vm.max_map_count`` of them (65,530 unless the machine raises
it). Past that, XLA:CPU's compiler does not fail: the process dies of a segmentation fault
inside ``backend_compile_and_load``. jax keeps what it compiles in its caches for the life of
the process, and the simulator compiles a program per core beside the caller's own, so a long
run of tests reaches the limit. Measured 2026-12-07 on jax 0.12.0.1: JAX's six padded-matmul
pipeline tests (200 Hypothesis examples each, every one other shapes) crashed their test
process in the fifth test; run again, the process grew by about 6,000 mappings a minute, to
57,647 after three tests; and a plain jax process (no coremesh) holding 64,000 mappings died of
a segmentation fault compiling small jitted functions at 65,482.

:func:`relieve` drops jax's caches and the simulator's compiled core programs when the process
holds more than a share of the limit: programs are compiled again when next needed, and a
process that keeps to its share no longer crashes. The test runners call it between tests (the
upstream runner's shims, the pytest plugin), where nothing is tracing or running.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence

#: Past this share of the limit, :func:`relieve` drops the caches.
SHARE = 0.5


def count() -> int | None:
    """The memory mappings this process holds (None where ``/proc`` does not say)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def limit() -> int | None:
    """The most mappings a process may hold (``vm.max_map_count``; None where not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def over(share: float) -> bool:
    """Does the process hold more than ``share`` of the limit?"""
    held, most = count(), limit()
    return held is not None and most is not None and held > share * most


def drop_compiled() -> None:
    """Forget every compiled program: jax's caches and the simulator's core programs."""
    import jax

    from coremesh.testing.sim import patches

    jax.clear_caches()
    patches.clear_compiled_core_programs()
    gc.collect()


def relieve(share: float = SHARE) -> bool:
    """Drop the compiled programs if the process holds more than ``share`` of its mappings;
    whether it did. Call it where nothing is being traced or run (between tests)."""
    if not over(share):
        return False
    drop_compiled()
    return True


__all__: Sequence[str] = ("SHARE", "count", "drop_compiled", "limit", "over", "relieve")
