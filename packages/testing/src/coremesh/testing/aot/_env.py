"""Process environment for libtpu's compile-only client.

libtpu reads its environment once, when the TPU plugin is first initialised; everything here must
happen before that. Two settings matter on a machine without a TPU:

* ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``: libtpu takes ``/tmp/libtpu_lockfile`` on start-up and a
  second process that loads it at the same moment fails with "Internal error when accessing libtpu
  multi-process lockfile". Compile-only work never opens a chip, so concurrent loads are safe; the
  static cycle profile runs in child processes that load libtpu while the parent has it loaded.
* ``TPU_ACCELERATOR_TYPE`` / ``TPU_WORKER_HOSTNAMES``: without them libtpu looks for TPU metadata
  and prints start-up warnings. They do not change what the compiler produces. They are set only in
  child processes: in the caller's process they could mislead a real TPU's initialisation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Set in this process before libtpu loads (only when the user has not set them).
PROCESS_DEFAULTS: Mapping[str, str] = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}

#: Set in child processes that compile with libtpu (only when the user has not set them).
CHILD_DEFAULTS: Mapping[str, str] = {
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "JAX_PLATFORMS": "cpu",
    "TPU_ACCELERATOR_TYPE": "v5p-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_SKIP_MDS_QUERY": "1",
}


def prepare_process() -> None:
    """Apply ``PROCESS_DEFAULTS`` (a no-op once libtpu has loaded, which is why it runs early)."""
    for key, value in PROCESS_DEFAULTS.items():
        os.environ.setdefault(key, value)


def child_environment(libtpu_init_args: str | None = None) -> dict[str, str]:
    """Environment for a child process that compiles with libtpu."""
    env = dict(os.environ)
    for key, value in CHILD_DEFAULTS.items():
        env.setdefault(key, value)
    if libtpu_init_args:
        # Keep flags the user set for their own reasons; ours come last and win on conflict.
        env["LIBTPU_INIT_ARGS"] = f"{env.get('LIBTPU_INIT_ARGS', '')} {libtpu_init_args}".strip()
    return env


prepare_process()
