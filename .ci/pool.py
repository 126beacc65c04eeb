"""Run nox invocations side by side, as many at a time as the machine has CPUs (at most --jobs).

Each job is one line of the job file: a name, a tab, then nox's arguments (shell words). A job
fails when nox fails, when it ran no session, or when any session it ran did not succeed (a skip
is NOT RUN). Its output goes to a log; a failed job's whole log, and the last lines of the
others, are printed when it ends, so CI output stays readable with several jobs at once.
Jobs start in file order: put the longest first.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _verdict(report: Path) -> list[str]:
    """The sessions of a nox report that did not succeed (an empty report is a failure too)."""
    try:
        sessions = json.loads(report.read_text())["sessions"]
    except (OSError, ValueError, KeyError):
        return ["no report"]
    if not sessions:
        return ["ran no session"]
    return [
        f"{s['signatures'][0] if s['signatures'] else s['name']}: {s['result']} {s['reason'] or ''}"
        for s in sessions
        if s["result"] != "success"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("jobs_file", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    jobs = [
        (name, shlex.split(rest))
        for name, _, rest in (
            line.partition("\t") for line in args.jobs_file.read_text().splitlines() if line
        )
    ]
    width = max(1, min(args.jobs, os.cpu_count() or 1))
    out = Path(tempfile.mkdtemp(prefix="ci-pool-"))
    pending = list(jobs)
    running: dict[str, tuple[subprocess.Popen[bytes], float, Path, Path]] = {}
    failed: list[str] = []
    print(f"=== {len(jobs)} jobs, {width} at a time", flush=True)
    while pending or running:
        while pending and len(running) < width:
            name, nox_args = pending.pop(0)
            log, report = out / f"{name}.log", out / f"{name}.json"
            cmd = [sys.executable, "-m", "nox", "--report", str(report), *nox_args]
            with log.open("wb") as sink:
                proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
            running[name] = (proc, time.monotonic(), log, report)
            print(f"=== start {name}: nox {shlex.join(nox_args)}", flush=True)
        time.sleep(2)
        for name, (proc, t0, log, report) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            bad = [f"nox exited {proc.returncode}"] if proc.returncode else []
            bad += [] if bad else _verdict(report)
            text = log.read_text(errors="replace").splitlines()
            print(f"=== {name} {'FAILED' if bad else 'passed'} in {time.monotonic() - t0:.0f} s")
            for line in text if bad else text[-3:]:
                print(f"  {line}")
            for line in bad:
                print(f"  NOT RUN or not passed: {line}")
            sys.stdout.flush()
            if bad:
                failed.append(name)
    if failed:
        print(f"=== failed: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
