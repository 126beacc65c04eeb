"""A profiling child's memory cap and the resident memory it is measured against."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coremesh.testing.aot.child_memory import (
    MEMORY_CAP_ENV,
    group_rss_bytes,
    memory_cap,
    memory_note,
    over_cap,
)


def test_the_cap_from_the_argument_the_env_or_half_the_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MEMORY_CAP_ENV, "3G")
    assert memory_cap() == 3 * 2**30
    assert memory_cap(12345) == 12345
    assert memory_cap(0) is None
    monkeypatch.setenv(MEMORY_CAP_ENV, "0")
    assert memory_cap() is None
    monkeypatch.setenv(MEMORY_CAP_ENV, "lots")
    with pytest.raises(ValueError, match=f"{MEMORY_CAP_ENV}: not a size: 'lots'"):
        memory_cap()
    monkeypatch.delenv(MEMORY_CAP_ENV)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_cap() == physical // 2


def test_the_note_says_what_was_used_and_how_to_raise_the_cap() -> None:
    note = memory_note(3 * 2**30 + 2**29, 2**30)
    assert "used 3.5 GiB, over the memory cap of 1.0 GiB" in note
    assert "memory_cap_bytes" in note and MEMORY_CAP_ENV in note
    assert "cap of 1.0 MiB" in memory_note(5 * 2**20, 2**20)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads Linux's /proc")
def test_group_rss_counts_the_childs_resident_memory() -> None:
    hog = "b = b'x' * (200 << 20); print('ready', flush=True); import sys; sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", hog],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        rss = group_rss_bytes(proc.pid)
        assert rss is not None and 200 << 20 < rss < 400 << 20
        assert over_cap(proc.pid, 100 << 20) == pytest.approx(rss, rel=0.1)
        assert over_cap(proc.pid, 1 << 30) is None
        assert over_cap(proc.pid, None) is None
    finally:
        proc.kill()
        proc.wait()
    assert group_rss_bytes(proc.pid) is None
