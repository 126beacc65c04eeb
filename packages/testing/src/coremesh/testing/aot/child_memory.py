"""The resident memory of a profiling child: its cap, and how it is measured.

libtpu's static profiler can need more memory than the machine has (~24 GB on one XLA gather for
TPU7x), and the kernel's OOM killer may then pick another process. So ``profile`` polls each
child's resident memory and kills it above a cap: half the machine's memory by default,
``profile(memory_cap_bytes=...)`` or ``COREMESH_PROFILE_MEMORY_CAP`` otherwise.
"""

from __future__ import annotations

import contextlib
import os

from coremesh.testing.aot.sizes import parse_size

MEMORY_CAP_ENV = "COREMESH_PROFILE_MEMORY_CAP"


def memory_cap(value: int | None = None) -> int | None:
    """The cap on a child's resident bytes: ``value``, else the env var, else half of physical
    memory (None, no cap, for 0 or where physical memory is unknown)."""
    if value is None:
        env = os.environ.get(MEMORY_CAP_ENV, "").strip()
        if env:
            try:
                value = parse_size(env)
            except ValueError as e:
                raise ValueError(f"{MEMORY_CAP_ENV}: {e}") from None
        else:
            with contextlib.suppress(ValueError, OSError, AttributeError):
                value = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    return value if value and value > 0 else None


def group_rss_bytes(pgid: int) -> int | None:
    """Resident bytes of process group ``pgid`` (a child started in its own session and anything
    it started), from Linux's ``/proc``; None elsewhere or once the group is gone."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        page = os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
    total, found = 0, False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                # Fields after the parenthesised command: state ppid pgrp ... rss (24th overall).
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:
                total, found = total + int(fields[21]) * page, True
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return total if found else None


def over_cap(pgid: int, cap: int | None) -> int | None:
    """The group's resident bytes if above ``cap``, else None."""
    rss = group_rss_bytes(pgid)
    return rss if rss is not None and cap is not None and rss > cap else None


def memory_note(rss: int | None, cap: int | None) -> str:
    """The note of a program whose child was killed over the cap: what it used, how to raise it."""
    return (
        f"the profiling process used {_gib_or_mib(rss)}, over the memory cap of "
        f"{_gib_or_mib(cap)}, and was killed; raise the cap with "
        f"profile(memory_cap_bytes=...) or {MEMORY_CAP_ENV}=<bytes, e.g. 32G> if the machine "
        "has the memory"
    )


def _gib_or_mib(n: int | None) -> str:
    n = n or 0
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"
