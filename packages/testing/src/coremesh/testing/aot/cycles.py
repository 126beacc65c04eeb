"""libtpu's static cycle estimate per kernel and chip, next to the roofline bound.

libtpu estimates the cycles of every TensorCore operation it compiles (Mosaic kernels and XLA
fusions alike) when the process starts with ``--xla_jf_dump_static_llo_profile_to``. The flag is
process-wide, must be set before libtpu loads, and the profiler can abort the whole process (v4:
"Dma latency model is currently only supported on VF/VL/GF/GL"). So estimates are gathered in
child processes, one per chip, that rebuild each program from its reference, compile it, and read
the dump directory (cleared between programs, because files are named after HLO instructions such
as ``shard_map.12``). A child that aborts loses only the program it was compiling: the parent
records the abort, reads the bundle counts the compiler had already written, and starts a new
child for the rest (after two profile aborts in a row on one chip, without the static profile).
The ops dumped before such a death are kept for diagnosis but never summed into an estimate.

libtpu's static profiler can also need more memory than the machine has (~24 GB on one XLA gather
for TPU7x), and the kernel's OOM killer may then pick another process. So the parent polls the
child's resident memory and kills it above a cap (half the machine's memory by default, per child;
``memory_cap_bytes`` or ``COREMESH_PROFILE_MEMORY_CAP``), which counts as an abort of the program
it was compiling.

Where there is no estimate (v4; SparseCore programs, which the profile does not cover) the result
says so and carries the bundle counts libtpu does dump: scheduled TensorCore bundles per operation
and SparseCore bundles per section (``scs`` scalar sequencer, ``tec`` vector subcores).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Literal

from coremesh.core.chips import Chip, get_chip
from coremesh.testing import libtpu_env
from coremesh.testing.aot import versions
from coremesh.testing.aot.compile import DEFAULT_CHIPS, Progress, ProgressFn
from coremesh.testing.aot.program import (
    ProgramError,
    ProgramRef,
    as_programs,
    program_name,
    reference_of,
    xla_reference,
)
from coremesh.testing.aot.roofline import Roofline, Work, cycles_to_seconds, roofline_for
from coremesh.testing.aot.topology import topology_for

Variant = Literal["kernel", "xla"]
CycleStatus = Literal[
    "ok", "no_estimate", "failed", "invalid", "unsupported", "aborted", "timeout", "error"
]

#: Marks the child's result lines on stdout (libraries may print there too).
_MARK = "@@coremesh-aot@@ "
#: A chip whose static profile aborted this many times in a row is profiled without it for the
#: rest (v4, where every psum aborts it); one that profiles in between resets the count.
_ABORTS_BEFORE_BUNDLES_ONLY = 2
#: Seconds between two reads of the child's resident memory.
_MEMORY_POLL_S = 1.0
MEMORY_CAP_ENV = "COREMESH_PROFILE_MEMORY_CAP"


def libtpu_flags(dump_dir: str, *, static_profile: bool = True) -> str:
    """``LIBTPU_INIT_ARGS`` that dump estimates and bundles under ``dump_dir``."""
    flags = [
        f"--xla_jf_dump_to={dump_dir}/jf",
        "--xla_jf_dump_llo_pass_label_regex=final_bundles",
        f"--xla_sc_dump_bundles_to={dump_dir}/scb",
    ]
    if static_profile:
        flags.insert(0, f"--xla_jf_dump_static_llo_profile_to={dump_dir}/sp")
    return " ".join(flags)


# ------------------------------------------------------------------------------- parsing

_ESTIMATE = re.compile(
    r'hlo_op_estimate\s*\{[^{}]*?hlo_op_name:\s*"(?P<name>[^"]+)"[^{}]*?'
    r"estimated_cycles:\s*(?P<cycles>-?\d+)",
    re.S,
)
_SCHEDULE = re.compile(r"total scheduled bundles:\s*(\d+)")
_SCHEDULE_FILE = re.compile(r"^\d+-(?P<name>.+)-\d+-schedule-analysis_final_bundles\.txt$")
_MOSAIC_OP = re.compile(r'%(?P<name>[\w.\-]+) = [^\n]*?custom_call_target="tpu_custom_call"')
_SC_SECTION = re.compile(r"^(?P<section>[a-z]+)$")
_SC_BUNDLE = re.compile(r"^0x[0-9a-f]+:")


def parse_static_profile(directory: str) -> dict[str, int]:
    """HLO operation name -> ``estimated_cycles`` from ``*_static_llo_profile.textproto``."""
    out: dict[str, int] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*static_llo_profile.textproto"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for m in _ESTIMATE.finditer(f.read()):
                out[m["name"]] = int(m["cycles"])
    return out


def parse_tensorcore_bundles(directory: str) -> dict[str, int]:
    """HLO operation name -> scheduled bundles, from the final-bundles schedule analyses.

    The program's own glue (``TLP``, ``<late-initialization>``...) is left out.
    """
    out: dict[str, int] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*schedule-analysis_final_bundles.txt"))):
        m = _SCHEDULE_FILE.match(os.path.basename(path))
        if m is None or m["name"] == "TLP" or m["name"].startswith("<"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            total = _SCHEDULE.search(f.read())
        if total:
            out[m["name"]] = out.get(m["name"], 0) + int(total.group(1))
    return out


def parse_mosaic_ops(directory: str) -> set[str]:
    """Names of the Pallas (Mosaic) kernels in the compiled program (its ``TLP-hlo.txt``)."""
    names: set[str] = set()
    for path in glob.glob(os.path.join(directory, "*-TLP-hlo.txt")):
        with open(path, encoding="utf-8", errors="replace") as f:
            names.update(m["name"] for m in _MOSAIC_OP.finditer(f.read()))
    return names


def parse_sparsecore_bundles(directory: str) -> dict[str, int]:
    """SparseCore bundles per section (``scs``, ``tec``...) summed over the dumped programs."""
    out: dict[str, int] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*_bundles.txt"))):
        section = None
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                s = _SC_SECTION.match(line.rstrip("\n"))
                if s:
                    section = s["section"]
                elif section and _SC_BUNDLE.match(line):
                    out[section] = out.get(section, 0) + 1
    return out


@dataclasses.dataclass(frozen=True)
class OpCycles:
    """One compiled TensorCore operation: a Pallas kernel (``mosaic``) or an XLA op."""

    name: str
    kind: Literal["mosaic", "xla"]
    cycles: int | None
    bundles: int | None


def read_dump(directory: str) -> tuple[list[OpCycles], dict[str, int]]:
    """Operations with their estimates and bundles, and SparseCore bundle counts."""
    estimates = parse_static_profile(os.path.join(directory, "sp"))
    bundles = parse_tensorcore_bundles(os.path.join(directory, "jf"))
    mosaic = parse_mosaic_ops(os.path.join(directory, "jf"))
    names = sorted(set(estimates) | set(bundles))
    ops = [
        OpCycles(n, "mosaic" if n in mosaic else "xla", estimates.get(n), bundles.get(n))
        for n in names
    ]
    return ops, parse_sparsecore_bundles(os.path.join(directory, "scb"))


def clear_dump(directory: str) -> None:
    for sub in ("sp", "jf", "scb"):
        path = os.path.join(directory, sub)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, exist_ok=True)


# ------------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class CycleEstimate:
    """libtpu's estimate for one program (or its XLA version) on one chip."""

    program: str
    variant: Variant
    chip: str
    topology: str
    mode: str
    num_devices: int
    cores_per_device: int
    status: CycleStatus
    ops: tuple[OpCycles, ...] = ()
    sparsecore_bundles: Mapping[str, int] = dataclasses.field(default_factory=dict)
    note: str | None = None
    work: Work | None = None
    roofline: Roofline | None = None
    compile_seconds: float = 0.0
    error: Mapping[str, Any] | None = None
    #: ``ops`` were read from the dump after the child died mid-program: only those it got to.
    partial: bool = False
    #: Bytes XLA copies into VMEM by copy-start (cross-program prefetches and copies inside the
    #: program, ``aot.hlo``): the profile has no operation for them, so ``cycles`` leaves them out.
    prefetch_bytes: int = 0
    #: The jax and libtpu that compiled and estimated it (estimates move between releases).
    jax_version: str | None = None
    libtpu_version: str | None = None

    @property
    def cycles(self) -> int | None:
        """Sum of the estimated cycles of the program's TensorCore operations.

        None unless the status is "ok": after an abort or timeout ``ops`` holds only the
        operations profiled before it, whose sum would pass for a (far too low) estimate.
        """
        known = [o.cycles for o in self.ops if o.cycles is not None]
        return sum(known) if known and self.status == "ok" else None

    @property
    def kernel_cycles(self) -> int | None:
        """Sum over the Pallas kernels only (None when the program has none with an estimate,
        or the status is not "ok")."""
        known = [o.cycles for o in self.ops if o.kind == "mosaic" and o.cycles is not None]
        return sum(known) if known and self.status == "ok" else None

    @property
    def bundles(self) -> int | None:
        """Scheduled TensorCore bundles. None after an abort or timeout, which can stop code
        generation midway; kept for "no_estimate" (libtpu profiles after scheduling)."""
        known = [o.bundles for o in self.ops if o.bundles is not None]
        return sum(known) if known and self.status not in ("aborted", "timeout") else None

    @property
    def seconds(self) -> float | None:
        c = self.cycles
        return None if c is None else cycles_to_seconds(c, self.chip)

    @property
    def prefetch_seconds(self) -> float | None:
        """The uncounted copies into VMEM (``aot.hlo``) at the device's HBM bandwidth."""
        if self.roofline is None:
            return None
        return self.prefetch_bytes / self.roofline.hbm_bytes_per_s

    def charged_seconds(self, *, kernels_only: bool = False) -> float | None:
        """The estimate (all ops, or the Pallas kernels only) plus the prefetch it leaves out."""
        c = self.kernel_cycles if kernels_only else self.cycles
        extra = self.prefetch_seconds
        if c is None or extra is None:
            return None
        return cycles_to_seconds(c, self.chip) + extra

    @property
    def ratio(self) -> float | None:
        """Estimated time over the roofline bound (1.0 = at the bound)."""
        return None if self.roofline is None else self.roofline.ratio(self.seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "variant": self.variant,
            "chip": self.chip,
            "topology": self.topology,
            "mode": self.mode,
            "num_devices": self.num_devices,
            "cores_per_device": self.cores_per_device,
            "status": self.status,
            "cycles": self.cycles,
            "kernel_cycles": self.kernel_cycles,
            "seconds": self.seconds,
            "clock_hz": get_chip(self.chip).clock_hz,
            "ratio": self.ratio,
            "roofline": self.roofline.to_json() if self.roofline else None,
            "ops": [dataclasses.asdict(o) for o in self.ops],
            "bundles": self.bundles,
            "sparsecore_bundles": dict(self.sparsecore_bundles),
            "note": self.note,
            "compile_seconds": round(self.compile_seconds, 4),
            "error": dict(self.error) if self.error else None,
            "partial": self.partial,
            "prefetch_bytes": self.prefetch_bytes,
            "jax": self.jax_version,
            "libtpu": self.libtpu_version,
        }


@dataclasses.dataclass(frozen=True)
class _Item:
    ref: ProgramRef
    name: str
    variant: Variant


# --------------------------------------------------------------------------------- parent


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
    program's compile. A child whose resident memory exceeds ``memory_cap_bytes`` (default:
    ``COREMESH_PROFILE_MEMORY_CAP``, e.g. ``"16G"``, else half the machine's memory; 0 for no cap)
    is killed and its program reported "aborted". Needs libtpu 0.0.52 or newer
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
            items.append(_Item(ref, program_name(p), "kernel"))
            if include_xla and xla_reference(p) is not None:
                items.append(_Item(ref, program_name(p), "xla"))
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
                self._worker(pending, dump, static, results)
                pending = [i for i in pending if results[i] is None]
        return [r if r is not None else _missing() for r in results]

    def _worker(
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
        env = libtpu_env.child_environment(libtpu_flags(dump, static_profile=static))
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
            proc = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-m", "coremesh.testing.aot._worker"],
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
                        rss = _over_cap(proc.pid, self.memory_cap)
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
                        deadline = time.monotonic() + self.timeout_s
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
            note = _memory_note(rss, self.memory_cap) + " (while starting up)"
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
            status, note = "aborted", _memory_note(rss, self.memory_cap)
        elif timed_out:
            status = "timeout"
            note = f"no result within {self.timeout_s:.0f} s; the child was killed"
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


# --------------------------------------------------------------------------- memory cap

_SIZE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes from ``"8G"``, ``"512MiB"``, ``"1.5g"`` or ``"1000000"`` (binary units)."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"{MEMORY_CAP_ENV}: not a size: {text!r} (e.g. 8G, 512M, 1000000)")
    return int(float(m["n"]) * 1024 ** "_kmgt".index((m["unit"] or "_").lower()))


def memory_cap(value: int | None = None) -> int | None:
    """The cap on a child's resident bytes: ``value``, else the env var, else half of physical
    memory (None, no cap, for 0 or where physical memory is unknown)."""
    if value is None:
        env = os.environ.get(MEMORY_CAP_ENV, "").strip()
        if env:
            value = parse_size(env)
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


def _over_cap(pgid: int, cap: int | None) -> int | None:
    """The group's resident bytes if above ``cap``, else None."""
    rss = group_rss_bytes(pgid)
    return rss if rss is not None and cap is not None and rss > cap else None


def _size(n: int | None) -> str:
    n = n or 0
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def _memory_note(rss: int | None, cap: int | None) -> str:
    return (
        f"the profiling process used {_size(rss)}, over the memory cap of {_size(cap)}, "
        "and was killed; raise the cap with "
        f"profile(memory_cap_bytes=...) or {MEMORY_CAP_ENV}=<bytes, e.g. 32G> if the machine "
        "has the memory"
    )


def _suffix(item: _Item) -> str:
    return " (xla)" if item.variant == "xla" else ""


def _pump(stream: IO[str], out: queue.Queue[str | None]) -> None:
    for line in stream:
        if line.startswith(_MARK):
            out.put(line[len(_MARK) :])
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


# --------------------------------------------------------------------------------- child


def emit(event: Mapping[str, Any]) -> None:
    sys.stdout.write(_MARK + json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def run_job(job: Mapping[str, Any]) -> None:
    """Child side: compile each item for the job's chip and report what libtpu dumped."""
    from coremesh.testing.aot.compile import compile_on, error_json
    from coremesh.testing.aot.topology import CompileTarget

    for p in job.get("sys_path", ()):
        if p not in sys.path:
            sys.path.append(p)
    target = CompileTarget.for_chip(
        job["chip"], devices=job.get("devices"), cores_per_device=job.get("cores_per_device")
    )
    dump = str(job["dump_dir"])
    static = bool(job.get("static_profile", True))
    for index, raw in enumerate(job["items"]):
        emit({"event": "begin", "index": index})
        clear_dump(dump)
        result: dict[str, Any]
        try:
            program = _load(ProgramRef.from_json(raw["ref"]), raw["name"], raw["variant"])
            r = compile_on(program, target, keep_executable=True)
        except Exception as e:  # a reference that does not resolve, or a broken program
            result = {"status": "error", "note": f"{type(e).__name__}: {e}", "ops": []}
            emit({"event": "done", "index": index, "result": result})
            continue
        ops, sc = read_dump(dump)
        result = {
            "program": r.program,
            "status": r.status,
            "compile_seconds": r.compile_seconds,
            "ops": [dataclasses.asdict(o) for o in ops],
            "sparsecore_bundles": sc,
            "error": error_json(r.error) if r.error else None,
        }
        if r.ok:
            result.update(_estimate_status(ops, sc, static, target.chip))
            result["prefetch_bytes"] = _prefetch_bytes(r.compiled)
            declared = getattr(program, "work", None)
            work = declared(target.num_devices) if callable(declared) else None
            if isinstance(work, Work):
                result["work"] = work.to_json()
            elif r.memory is not None:
                traffic = r.memory.argument_bytes + r.memory.output_bytes - r.memory.alias_bytes
                result["work"] = {"bytes_accessed": traffic, "flops": int(r.flops or 0)}
        emit({"event": "done", "index": index, "result": result})


def _prefetch_bytes(compiled: Any) -> int:
    from coremesh.testing.aot.hlo import vmem_copy_bytes

    try:
        return vmem_copy_bytes(compiled.as_text())
    except Exception:  # the HLO text is best effort, as cost analysis is
        return 0


def _estimate_status(
    ops: Sequence[OpCycles], sc: Mapping[str, int], static: bool, chip: Chip
) -> dict[str, Any]:
    notes = []
    if not static:
        notes.append(
            f"no static estimate: libtpu's static profile aborted repeatedly on {chip.name}, "
            "so it ran without it; bundle counts only"
        )
    if sc:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(sc.items()))
        notes.append(f"libtpu gives no static estimate for SparseCore code (bundles: {counts})")
    if any(o.cycles is not None for o in ops):
        return {"status": "ok", "note": "; ".join(notes) or None}
    if not notes:
        notes.append("libtpu wrote no static estimate for this program")
    return {"status": "no_estimate", "note": "; ".join(notes)}


def _load(ref: ProgramRef, name: str, variant: str) -> Any:
    found = as_programs(ref.resolve(), what=str(ref))
    matches = [p for p in found if program_name(p) == name] or found[:1]
    program = matches[0]
    if variant == "xla":
        ref_program = xla_reference(program)
        if ref_program is None:
            raise ProgramError(
                f"{name} has no xla_reference",
                rule="the XLA variant compiles the program's xla_reference",
                fix="give the program an xla_reference",
            )
        return ref_program
    return program


def iter_table(results: Sequence[CycleEstimate]) -> Iterator[CycleEstimate]:
    """Results in (program, chip, variant) order."""
    order = {c: i for i, c in enumerate(DEFAULT_CHIPS)}
    yield from sorted(
        results, key=lambda r: (r.program, order.get(r.chip, 99), r.chip, r.variant != "kernel")
    )
