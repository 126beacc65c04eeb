"""Process environment for libtpu: quiet and shareable on a machine without a TPU, untouched on one.

libtpu reads its environment once, when the TPU plugin is first initialised; everything here must
happen before that. On a machine without a TPU three settings matter:

* ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``: libtpu takes ``/tmp/libtpu_lockfile`` on start-up and a
  second process that loads it at the same moment fails with "Internal error when accessing libtpu
  multi-process lockfile". Compile-only work never opens a chip, so concurrent loads are safe; the
  static cycle profile runs in child processes that load libtpu while the parent has it loaded.
* ``TPU_ACCELERATOR_TYPE`` / ``TPU_WORKER_HOSTNAMES`` (and ``TPU_SKIP_MDS_QUERY``): without them
  libtpu looks for TPU VM metadata and prints five lines of warnings ("unexpected worker
  hostname", "Source Location Trace") in every process that loads it. They do not change what the
  compiler produces.

On a TPU VM (its chips appear as ``/dev/accel*`` or ``/dev/vfio/<n>``) libtpu must find the real
accelerator, so nothing but what the user set is used there. A value the user set always wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

#: Set in this process before libtpu loads (only when the user has not set them).
PROCESS_DEFAULTS: Mapping[str, str] = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}

#: What silences libtpu's TPU VM probing; set only where there is no TPU.
QUIET_WITHOUT_TPU: Mapping[str, str] = {
    "TPU_ACCELERATOR_TYPE": "v5p-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_SKIP_MDS_QUERY": "1",
}

#: Set in child processes that compile with libtpu (only when the user has not set them).
CHILD_DEFAULTS: Mapping[str, str] = {
    **PROCESS_DEFAULTS,
    **QUIET_WITHOUT_TPU,
    "JAX_PLATFORMS": "cpu",
}


def has_tpu(dev: Path = Path("/dev")) -> bool:
    """Does this machine have TPU chips attached? (v2 to v6e show ``/dev/accel<n>``; v5p, v6e
    and TPU7x VMs may use VFIO, ``/dev/vfio/<n>``.)"""
    if any(dev.glob("accel*")):
        return True
    vfio = dev / "vfio"
    return vfio.is_dir() and any(p.name.isdigit() for p in vfio.iterdir())


def quiet_without_tpu(
    environ: MutableMapping[str, str] | None = None, dev: Path = Path("/dev")
) -> bool:
    """Apply ``QUIET_WITHOUT_TPU`` (where unset) unless this machine has a TPU; True if applied."""
    env = os.environ if environ is None else environ
    if has_tpu(dev):
        return False
    for key, value in QUIET_WITHOUT_TPU.items():
        env.setdefault(key, value)
    return True


def prepare_process(
    environ: MutableMapping[str, str] | None = None, dev: Path = Path("/dev")
) -> None:
    """Apply ``PROCESS_DEFAULTS`` and, without a TPU, ``QUIET_WITHOUT_TPU``: a no-op once libtpu
    has loaded, which is why the CLI, the simulator and ``coremesh.testing.aot`` run it early."""
    env = os.environ if environ is None else environ
    for key, value in PROCESS_DEFAULTS.items():
        env.setdefault(key, value)
    quiet_without_tpu(env, dev)


def child_environment(libtpu_init_args: str | None = None) -> dict[str, str]:
    """Environment for a child process that compiles with libtpu (never on a chip: quieting it
    is safe even on a TPU VM)."""
    env = dict(os.environ)
    for key, value in CHILD_DEFAULTS.items():
        env.setdefault(key, value)
    if libtpu_init_args:
        # Keep flags the user set for their own reasons; ours come last and win on conflict.
        env["LIBTPU_INIT_ARGS"] = f"{env.get('LIBTPU_INIT_ARGS', '')} {libtpu_init_args}".strip()
    return env


prepare_process()
