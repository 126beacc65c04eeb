"""Host CPU devices that stand in for simulated TPU devices.

jax fixes the number of CPU devices when its CPU backend starts (``jax_num_cpu_devices``, or the
older ``--xla_force_host_platform_device_count`` XLA flag) and it cannot change afterwards. So the
count must be set before the first JAX operation: :func:`simulate` does it when it is entered
first, the pytest plugin does it before any test runs, and a script can call
:func:`configure_host_devices` right after ``import jax``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from coremesh.core.errors import CoremeshError

#: What the pytest plugin asks for: enough for 4 devices x 2 cores as separate devices, too.
PLUGIN_HOST_DEVICES = 8


def _backend_started() -> bool:
    from jax._src import xla_bridge as xb

    return bool(xb.backends_are_initialized())


def _flag_count() -> int | None:
    flags = os.environ.get("XLA_FLAGS", "")
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", flags)
    return int(match.group(1)) if match else None


def requested_host_devices() -> int | None:
    """The CPU device count jax will start with, if one was asked for."""
    from jax._src import xla_bridge as xb

    configured = int(xb.num_cpu_devices.value)
    if configured >= 0:
        return configured
    return _flag_count()


def configure_host_devices(
    count: int, *, prefer: int | None = None, chip: str | None = None
) -> None:
    """Ask jax for at least ``count`` CPU devices; a no-op if its backend already has them.

    ``prefer``: how many to ask for when the backend has not started yet. Each host device
    brings execution threads, and a simulated core blocked on a semaphore holds one, so a
    slice of ``devices`` x ``cores`` runs most reliably with ``devices * (cores + 1)``.
    Raises :class:`CoremeshError` if the CPU backend already started with fewer than ``count``
    (naming ``chip``, the simulated chip, where there is one).
    """
    import jax

    if count < 1:
        raise CoremeshError(
            f"{count} host devices requested",
            rule="a simulation needs at least one device",
            fix="ask for 1 or more devices",
        )
    if not _backend_started():
        have = requested_host_devices()
        want = max(count, prefer or count)
        if have is None or have < want:
            jax.config.update("jax_num_cpu_devices", want)
        return
    have_now = len(cpu_devices())
    if have_now < count:
        raise CoremeshError(
            f"the simulation needs {count} host CPU devices, and jax's CPU backend already "
            f"started with {have_now}",
            rule="jax fixes the number of CPU devices when its backend starts, and a simulated "
            "TPU device is one host CPU device",
            fix=f"enter coremesh.testing.simulate(devices={count}) (or call "
            f"coremesh.testing.sim.configure_host_devices({count})) before any JAX operation, "
            f"or start the process with JAX_NUM_CPU_DEVICES={count} (or "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count}); under pytest the "
            "coremesh plugin arranges 16",
            chip=chip,
        )


def cpu_devices() -> list[Any]:
    """The host CPU devices, starting jax's CPU backend if needed."""
    from jax._src import xla_bridge as xb

    return list(xb.get_backend("cpu").devices())
