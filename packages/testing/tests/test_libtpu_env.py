"""libtpu's environment: quieted on a machine without a TPU, left alone on a TPU VM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coremesh.testing import libtpu_env


def test_without_a_tpu_the_quiet_settings_are_applied(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    assert libtpu_env.quiet_without_tpu(env, dev=tmp_path)
    assert env == dict(libtpu_env.QUIET_WITHOUT_TPU)


@pytest.mark.parametrize("device", ["accel0", "vfio/0"])
def test_on_a_tpu_vm_nothing_is_set(tmp_path: Path, device: str) -> None:
    # What a TPU VM has: its chips as /dev/accel<n> (v4, v5e, v6e) or /dev/vfio/<n> (v5p, TPU7x).
    (tmp_path / device).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / device).write_text("")
    env = {"TPU_NAME": "my-tpu"}
    assert libtpu_env.has_tpu(tmp_path)
    assert not libtpu_env.quiet_without_tpu(env, dev=tmp_path)
    libtpu_env.prepare_process(env, dev=tmp_path)
    assert env == {"TPU_NAME": "my-tpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def test_a_vfio_folder_without_devices_is_not_a_tpu(tmp_path: Path) -> None:
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "vfio").write_text("")  # the control node every VFIO host has
    assert not libtpu_env.has_tpu(tmp_path)


def test_what_the_user_set_wins(tmp_path: Path) -> None:
    env = {"TPU_ACCELERATOR_TYPE": "v6e-8"}
    libtpu_env.prepare_process(env, dev=tmp_path)
    assert env["TPU_ACCELERATOR_TYPE"] == "v6e-8"
    assert env["TPU_WORKER_HOSTNAMES"] == "localhost"


@pytest.mark.skipif(libtpu_env.has_tpu(), reason="this machine has a TPU: libtpu is not quieted")
def test_a_compile_prints_no_libtpu_noise_without_settings() -> None:
    # A fresh process with none of the settings, as a user's shell has it.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (*libtpu_env.CHILD_DEFAULTS, "LIBTPU_INIT_ARGS")
    }
    code = (
        "from coremesh.testing import aot\n"
        "from coremesh.testing.guide import PROGRAMS\n"
        "(r,) = aot.compile_program(PROGRAMS['add_one'], chips=('v5e',))\n"
        "print('STATUS', r.status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "STATUS ok" in done.stdout, done.stderr
    for noise in ("unexpected worker hostname", "Source Location Trace", "TPU_ACCELERATOR_TYPE"):
        assert noise not in done.stderr, done.stderr
