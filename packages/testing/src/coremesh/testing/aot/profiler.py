"""``profile``: libtpu's static cycle estimates, gathered in one child process per chip.

libtpu estimates the cycles of every TensorCore operation it compiles (Mosaic kernels and XLA
fusions alike) when the process starts with ``--xla_jf_dump_static_llo_profile_to``. The flag is
process-wide, must be set before libtpu loads, and the profiler can abort the whole process (v4:
"Dma latency model is currently only supported on VF/VL/GF/GL"). So estimates are gathered in
child processes (``aot.profile_child``), one per chip, that rebuild each program from its
reference, compile it, and read the dump directory (``aot.profile_dump``). This module is the
parent: it starts and watches the children. A child that aborts loses only the program it was
compiling: the parent records the abort, reads the bundle counts the compiler had already
written, and starts a new child for the rest (after two profile aborts in a row on one chip,
without the static profile). The ops dumped before such a death are kept for diagnosis but never
summed into an estimate. A child over its memory cap (``aot.child_memory``) is killed, which
counts as an abort of the program it was compiling; one that reports nothing within ``timeout_s``
is killed and its program reported "timeout".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from coremesh.core.chips import Chip, get_chip
from coremesh.testing import libtpu_env
from coremesh.testing.aot import versions
from coremesh.testing.aot.child_memory import memory_cap, memory_note, over_cap
from coremesh.testing.aot.compile import DEFAULT_CHIPS, Progress, ProgressFn
from coremesh.testing.aot.cycles import CycleEstimate, Variant
from coremesh.testing.aot.profile_child import MARK
from coremesh.testing.aot.profile_dump import OpCycles, dump_flags, read_dump
from coremesh.testing.aot.program import (
    ProgramError,
    ProgramRef,
    as_programs,
    program_name,
    reference_of,
    xla_reference,
)
from coremesh.testing.aot.roofline import Work, roofline_for
from coremesh.testing.aot.topology import topology_for

#: A chip whose static profile aborted this many times in a row is profiled without it for the
#: rest (v4, where every psum aborts it); one that profiles in between resets the count.
_ABORTS_BEFORE_BUNDLES_ONLY = 2
#: Seconds between two reads of the child's resident memory.
_MEMORY_POLL_S = 1.0


@dataclasses.dataclass(frozen=True)
class _Item:
    """One compile a child does: a program (by reference) and its variant."""

    ref: ProgramRef
    name: str
    variant: Variant
    timeout_s: float | None = None  # the program's own bound, if it declares one


def profile(
    programs: Sequence[Any] | Any,
    chips: Sequence[str | Chip] = DEFAULT_CHIPS,
    *,
    devices: int | None = None,
    cores_per_device: int | None = None,
    mode: str | None = None,
    include_xla: bool = True,
    timeout_s: float = 180.0,
    jobs: int = 1,
    progress: ProgressFn | None = None,
    memory_cap_bytes: int | None = None,
) -> list[CycleEstimate]:
    """Static cycle estimates for ``programs`` on ``chips``, with roofline bounds.

    ``programs`` are program objects that can be found again by reference (module-level names,
    entries of module-level mappings) or reference strings (``"package.module:NAME"``,
    ``"path/to/file.py:NAME[key]"``). With ``include_xla``, a program's ``xla_reference`` is
    estimated too. One child process per chip (``jobs`` at a time); ``timeout_s`` bounds each
    program's compile, unless the program has a ``timeout_s`` attribute of its own. A child
    whose resident memory exceeds ``memory_cap_bytes`` (default: ``COREMESH_PROFILE_MEMORY_CAP``,
    e.g. ``"16G"``, else half the machine's memory; 0 for no cap) is killed and its program
    reported "aborted". Needs libtpu 0.0.52 or newer
    (``versions.STATIC_PROFILE_LIBTPU``): ``LibtpuError`` otherwise, before any child starts.
    Each estimate records the jax and libtpu versions that made it.
    """
    built_with = {"jax": versions.jax_version(), "libtpu": versions.require_static_profile()}
    items = _items(programs, include_xla)
    cap = memory_cap(memory_cap_bytes)
    chip_list = [get_chip(c) for c in chips]
    total = len(items) * len(chip_list)
    done = [0]
    lock = threading.Lock()

    def report(p: Progress) -> None:
        if progress is None:
            return
        with lock:
            if p.result is not None:
                done[0] += 1
            progress(dataclasses.replace(p, index=done[0], total=total))

    def run(chip: Chip) -> list[CycleEstimate]:
        spec = topology_for(chip, devices=devices, cores_per_device=cores_per_device, mode=mode)
        raw = _ChipRun(
            chip=spec.chip,
            devices=devices,
            cores_per_device=spec.cores_per_device,
            items=items,
            timeout_s=timeout_s,
            report=report,
            memory_cap=cap,
        ).run()
        return [_finish(item, r, spec, built_with) for item, r in zip(items, raw, strict=True)]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        per_chip = list(pool.map(run, chip_list))
    results = [r for chip_results in per_chip for r in chip_results]
    return _share_flops(results)


def _items(programs: Sequence[Any] | Any, include_xla: bool) -> list[_Item]:
    seq = programs if isinstance(programs, list | tuple) else [programs]
    items: list[_Item] = []
    for obj in seq:
        if isinstance(obj, str):
            ref = ProgramRef.parse(obj)
            found = as_programs(ref.resolve(), what=str(ref))
            refs = [(ref if len(found) == 1 else _keyed(ref, p), p) for p in found]
        else:
            refs = []
            for p in as_programs(obj):
                r = reference_of(p)
                if r is None:
                    raise ProgramError(
                        f"cannot find {program_name(p)} again in another process",
                        rule="static cycle estimates compile in a child process, which imports "
                        "the program by reference",
                        fix="define the program at module level (or in a module-level dict or "
                        "list), or pass a reference string 'package.module:NAME'",
                    )
                refs.append((r, p))
        for ref, p in refs:
            own = getattr(p, "timeout_s", None)
            items.append(_Item(ref, program_name(p), "kernel", own))
            if include_xla and xla_reference(p) is not None:
                items.append(_Item(ref, program_name(p), "xla", own))
    return items


def _keyed(ref: ProgramRef, program: Any) -> ProgramRef:
    return dataclasses.replace(ref, key=program_name(program))


def _finish(
    item: _Item, raw: Mapping[str, Any], spec: Any, built_with: Mapping[str, str | None]
) -> CycleEstimate:
    """``built_with``: the jax and libtpu of this process, which the child runs too."""
    ops = tuple(OpCycles(**o) for o in raw.get("ops", ()))
    work = Work(**raw["work"]) if raw.get("work") else None
    roof = roofline_for(work, spec.chip, spec.cores_per_device) if work else None
    return CycleEstimate(
        program=item.name,
        variant=item.variant,
        chip=spec.chip.name,
        topology=spec.name,
        mode=spec.mode,
        num_devices=spec.num_devices,
        cores_per_device=spec.cores_per_device,
        status=raw["status"],
        ops=ops,
        sparsecore_bundles=dict(raw.get("sparsecore_bundles") or {}),
        note=raw.get("note"),
        work=work,
        roofline=roof,
        compile_seconds=float(raw.get("compile_seconds") or 0.0),
        error=raw.get("error"),
        partial=bool(raw.get("partial")),
        prefetch_bytes=int(raw.get("prefetch_bytes") or 0),
        jax_version=built_with["jax"],
        libtpu_version=built_with["libtpu"],
    )


def _share_flops(results: list[CycleEstimate]) -> list[CycleEstimate]:
    """A Pallas kernel reports no flops; bound it with its XLA version's count where known."""
    xla_flops = {
        (r.program, r.chip): r.work.flops
        for r in results
        if r.variant == "xla" and r.work is not None and r.work.flops
    }
    out = []
    for r in results:
        flops = xla_flops.get((r.program, r.chip))
        if r.variant == "kernel" and r.work is not None and flops and not r.work.flops:
            work = dataclasses.replace(r.work, flops=flops)
            roof = roofline_for(work, r.chip, r.cores_per_device)
            out.append(dataclasses.replace(r, work=work, roofline=roof))
        else:
            out.append(r)
    return out


class _ChipRun:
    """All items for one chip through as few child processes as aborts allow."""

    def __init__(
        self,
        *,
        chip: Chip,
        devices: int | None,
        cores_per_device: int,
        items: Sequence[_Item],
        timeout_s: float,
        report: ProgressFn,
        memory_cap: int | None = None,
    ) -> None:
        self.chip, self.devices, self.cores = chip, devices, cores_per_device
        self.items, self.timeout_s, self.report = items, timeout_s, report
        self.memory_cap = memory_cap
        self.aborts = 0

    def run(self) -> list[dict[str, Any]]:
        results: list[dict[str, Any] | None] = [None] * len(self.items)
        pending = list(range(len(self.items)))
        with tempfile.TemporaryDirectory(prefix="coremesh-aot-") as dump:
            while pending:
                static = self.aborts < _ABORTS_BEFORE_BUNDLES_ONLY
                self._child(pending, dump, static, results)
                pending = [i for i in pending if results[i] is None]
        return [r if r is not None else _missing() for r in results]

    def _timeout(self, item: _Item) -> float:
        return item.timeout_s if item.timeout_s is not None else self.timeout_s

    def _child(
        self, indices: list[int], dump: str, static: bool, results: list[dict[str, Any] | None]
    ) -> None:
        """One child for ``indices``; fills ``results`` up to the first abort, timeout or end."""
        job = {
            "chip": self.chip.name,
            "devices": self.devices,
            "cores_per_device": self.cores,
            "dump_dir": dump,
            "static_profile": static,
            "sys_path": list(sys.path),
            "items": [
                {
                    "ref": self.items[i].ref.to_json(),
                    "name": self.items[i].name,
                    "variant": self.items[i].variant,
                }
                for i in indices
            ],
        }
        env = libtpu_env.child_environment(dump_flags(dump, static_profile=static))
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
            proc = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-m", "coremesh.testing.aot._child_main"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
                start_new_session=True,
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(job))
            proc.stdin.close()
            lines: queue.Queue[str | None] = queue.Queue()
            reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
            reader.start()
            current: int | None = None
            finished = 0  # programs this child reported
            deadline = time.monotonic() + self.timeout_s + 60.0  # start-up allowance
            next_poll = time.monotonic() if self.memory_cap else float("inf")
            timed_out = False
            rss: int | None = None  # set when the child went over the memory cap
            try:
                while True:
                    now = time.monotonic()
                    if now >= next_poll:
                        next_poll = now + _MEMORY_POLL_S
                        rss = over_cap(proc.pid, self.memory_cap)
                        if rss is not None:
                            break
                    try:
                        line = lines.get(timeout=max(0.05, min(deadline, next_poll) - now))
                    except queue.Empty:
                        if time.monotonic() >= deadline:
                            timed_out = True
                            break
                        continue
                    if line is None:
                        break
                    try:
                        msg = json.loads(line)
                        index = indices[int(msg["index"])]
                    except (ValueError, KeyError, IndexError, TypeError):
                        continue  # not one of ours after all
                    item = self.items[index]
                    label = item.name + _suffix(item)
                    if msg.get("event") == "begin":
                        current = index
                        deadline = time.monotonic() + self._timeout(item)
                        self.report(Progress("profile", 0, 0, label, self.chip.name))
                    else:
                        results[index] = msg["result"]
                        current = None
                        finished += 1
                        status = msg["result"]["status"]
                        if static and status == "ok":
                            self.aborts = 0  # the aborts were the programs', not the chip's
                        self.report(Progress("profile", 0, 0, label, self.chip.name, status))
            except BaseException:  # interrupted: leave no child behind
                _kill(proc)
                raise
            if timed_out or rss is not None:
                _kill(proc)
            rc = proc.wait()
            reader.join(timeout=5)
            err.seek(0)
            stderr = err.read()
        if rss is not None and current is None:
            if finished:
                return  # between programs: the rest go to a fresh child
            # Over the cap before any program began: a new child would be too.
            note = memory_note(rss, self.memory_cap) + " (while starting up)"
            for i in indices:
                item = self.items[i]
                results[i] = {"program": item.name, "status": "aborted", "note": note, "ops": []}
                self.report(
                    Progress("profile", 0, 0, item.name + _suffix(item), self.chip.name, "aborted")
                )
            return
        if current is None:
            # Between programs: every item reported, or the child died before the next began.
            for i in indices:
                if results[i] is None:
                    results[i] = _failed_start(rc, stderr)
            return
        item = self.items[current]
        ops, sc = read_dump(dump)
        if rss is not None:
            status, note = "aborted", memory_note(rss, self.memory_cap)
        elif timed_out:
            status = "timeout"
            note = f"no result within {self._timeout(item):.0f} s; the child was killed"
        else:
            reason = _abort_reason(stderr, rc)
            status, note = "aborted", f"libtpu aborted the compile: {reason}"
            if "Static LLO profiling" in reason:
                # The compile itself got through code generation (its bundles are dumped);
                # only the estimate is missing.
                self.aborts += 1
                status = "no_estimate"
                note = f"no static estimate: libtpu's static profile aborted ({reason})"
        results[current] = {
            "program": item.name,
            "status": status,
            "note": note,
            "ops": [dataclasses.asdict(o) for o in ops],
            "sparsecore_bundles": sc,
            "partial": True,
        }
        self.report(Progress("profile", 0, 0, item.name + _suffix(item), self.chip.name, status))


def _suffix(item: _Item) -> str:
    return " (xla)" if item.variant == "xla" else ""


def _pump(stream: IO[str], out: queue.Queue[str | None]) -> None:
    for line in stream:
        if line.startswith(MARK):
            out.put(line[len(MARK) :])
    out.put(None)


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


_FATAL = re.compile(r"^F\d{4} [\d:.]+\s+\d+ [^\]]+\] (?P<msg>.+)$", re.M)


def _abort_reason(stderr: str, rc: int) -> str:
    m = _FATAL.search(stderr)
    if m:
        return m["msg"].strip()[:500]
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    sig = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
    return f"{sig}: {lines[-1].strip()[:400]}" if lines else sig


def _failed_start(rc: int, stderr: str) -> dict[str, Any]:
    return {
        "status": "error",
        "note": f"the profiling process failed before compiling: {_abort_reason(stderr, rc)}",
        "ops": [],
    }


def _missing() -> dict[str, Any]:
    return {"status": "error", "note": "no result", "ops": []}
