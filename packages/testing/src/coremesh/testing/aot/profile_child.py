"""What runs in a profiling child: compile each program of a job and report what libtpu dumped.

The parent (``aot.profiler``) starts the child with ``LIBTPU_INIT_ARGS`` from
``profile_dump.dump_flags`` already set, writes one JSON job on its stdin (chip, devices, cores per
device, dump directory, whether the static profile is on, ``sys.path``, and the items: program
reference, name, variant) and reads its stdout. For each item the child prints one ``MARK``-led
JSON line as it begins (``{"event": "begin", "index": i}``) and one with the result
(``{"event": "done", "index": i, "result": {...}}``); a child that dies between the two leaves the
dump of the program it was compiling for the parent to read.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from coremesh.core.chips import Chip
from coremesh.testing.aot.compile import compile_on, error_json
from coremesh.testing.aot.hlo import vmem_copy_bytes
from coremesh.testing.aot.profile_dump import OpCycles, clear_dump, read_dump
from coremesh.testing.aot.program import (
    ProgramError,
    ProgramRef,
    as_programs,
    program_name,
    xla_reference,
)
from coremesh.testing.aot.roofline import Work
from coremesh.testing.aot.topology import CompileTarget

#: Marks the child's event lines on stdout (libraries may print there too).
MARK = "@@coremesh-aot@@ "


def emit(event: Mapping[str, Any]) -> None:
    """One event line for the parent, flushed at once (the child may die right after)."""
    sys.stdout.write(MARK + json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def run_job(job: Mapping[str, Any]) -> None:
    """Compile each item for the job's chip and report what libtpu dumped."""
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
