"""Compile programs for TPU generations with libtpu and no TPU: the compile matrix.

``compile_program(program, chips)`` gives one ``CompileResult`` per chip: ``ok`` with the compile
time and the per-device memory figures, or the reason it did not compile as a coremesh error:

* ``unsupported``: the chip lacks something the program needs (SparseCores on v4/v5e, a dtype),
  found before tracing;
* ``invalid``: coremesh's own checks refused the program before libtpu saw it (block tiling,
  scratch over VMEM, arguments that do not split over the devices);
* ``failed``: libtpu's compiler (or Mosaic) rejected it; the error keeps the compiler's text and
  says what to change (see ``diagnose``).

Everything runs in this process (one compile takes 0.05-0.8 s and libtpu stays loaded), but for a
program that takes its mesh from context and was already built here for another chip's mesh: that
one compiles in a fresh process (``compile_child``), as its ``jax.shard_map`` keeps its first mesh.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from coremesh.core.chips import Chip, get_chip
from coremesh.core.errors import CoremeshError, UnsupportedOnChipError
from coremesh.testing.aot import versions
from coremesh.testing.aot.diagnose import explain
from coremesh.testing.aot.program import bound_to_other_mesh, program_name, uses_sparsecore
from coremesh.testing.aot.topology import CompileTarget, topology_for
from coremesh.testing.aot.validate import (
    argument_structs,
    check_applicable,
    validate_program,
    validate_traced,
)

#: Every TPU generation coremesh knows, oldest first.
DEFAULT_CHIPS: tuple[str, ...] = ("v4", "v5e", "v5p", "v6e", "TPU7x")

Status = Literal["ok", "failed", "invalid", "unsupported"]


@dataclasses.dataclass(frozen=True)
class MemoryFigures:
    """Per-device sizes libtpu reports for a compiled program."""

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    peak_bytes: int | None

    @classmethod
    def from_compiled(cls, compiled: Any) -> MemoryFigures | None:
        try:
            m = compiled.memory_analysis()
        except Exception:  # some executables have no memory analysis
            return None
        if m is None:
            return None
        return cls(
            argument_bytes=int(m.argument_size_in_bytes),
            output_bytes=int(m.output_size_in_bytes),
            temp_bytes=int(m.temp_size_in_bytes),
            alias_bytes=int(m.alias_size_in_bytes),
            generated_code_bytes=int(m.generated_code_size_in_bytes),
            peak_bytes=int(getattr(m, "peak_memory_in_bytes", 0)) or None,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """One program on one chip."""

    program: str
    chip: str
    topology: str
    mode: str
    num_devices: int
    cores_per_device: int
    status: Status
    expected: Status
    trace_seconds: float = 0.0
    compile_seconds: float = 0.0
    memory: MemoryFigures | None = None
    flops: float | None = None
    error: CoremeshError | None = None
    compiled: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def as_expected(self) -> bool:
        """True when the outcome is the one the program and chip call for."""
        return self.status == self.expected

    @property
    def seconds(self) -> float:
        return self.trace_seconds + self.compile_seconds

    def raise_for_status(self) -> CompileResult:
        if self.error is not None:
            raise self.error
        return self

    def to_json(self) -> dict[str, Any]:
        err = self.error
        return {
            "program": self.program,
            "chip": self.chip,
            "topology": self.topology,
            "mode": self.mode,
            "num_devices": self.num_devices,
            "cores_per_device": self.cores_per_device,
            "status": self.status,
            "expected": self.expected,
            "as_expected": self.as_expected,
            "trace_seconds": round(self.trace_seconds, 4),
            "compile_seconds": round(self.compile_seconds, 4),
            "memory": self.memory.to_json() if self.memory else None,
            "flops": self.flops,
            "error": None if err is None else error_json(err),
        }


def error_json(err: CoremeshError) -> dict[str, Any]:
    return {
        "type": type(err).__name__,
        "what": err.what,
        "rule": err.rule,
        "fix": err.fix,
        "chip": err.chip,
        "kind": getattr(err, "kind", None),
        "code": getattr(err, "code", None),
        "compiler_message": getattr(err, "compiler_message", None),
    }


def expected_status(program: Any, chip: Chip) -> Status:
    return "unsupported" if uses_sparsecore(program) and chip.sparsecore is None else "ok"


@dataclasses.dataclass(frozen=True)
class Progress:
    """A progress report: ``index`` of ``total`` done (``result`` set) or starting (None)."""

    stage: str
    index: int
    total: int
    program: str
    chip: str
    result: Any = None


ProgressFn = Callable[[Progress], None]


def compile_on(
    program: Any,
    target: CompileTarget,
    *,
    prevalidate: bool = True,
    keep_executable: bool = False,
    compiler_options: dict[str, Any] | None = None,
) -> CompileResult:
    """Compile ``program`` for ``target``; never raises for a program that does not compile
    (``LibtpuError`` when there is no libtpu to compile with)."""
    versions.require_compiler()
    spec = target.spec
    chip = target.chip
    if bound_to_other_mesh(program, target.mesh):
        from coremesh.testing.aot.compile_child import compile_in_child

        return compile_in_child(
            program, target, prevalidate=prevalidate, compiler_options=compiler_options
        )

    def result(status: Status, **figures: Any) -> CompileResult:
        return result_for(program, target, status, **figures)

    t0 = time.perf_counter()
    try:
        if prevalidate:
            validate_program(program, target)
        else:
            check_applicable(program, target)
        target.devices  # noqa: B018 - load the topology outside the timed trace
        t0 = time.perf_counter()
        with target.activate():
            fn = program.build(target.mesh)
            args = [
                _struct(s, target.sharding(p))
                for s, p in argument_structs(program, target.num_devices)
            ]
            jitted = fn if hasattr(fn, "trace") else _jit(fn)
            traced = jitted.trace(*args)
            if prevalidate:
                validate_traced(traced.jaxpr, target, program_name(program))
            lowered = traced.lower()
        t1 = time.perf_counter()
        compiled = lowered.compile(compiler_options) if compiler_options else lowered.compile()
        t2 = time.perf_counter()
    except CoremeshError as e:
        status: Status = "unsupported" if isinstance(e, UnsupportedOnChipError) else "invalid"
        return result(status, trace_seconds=time.perf_counter() - t0, error=e)
    except Exception as e:  # the compiler's (or Mosaic's, or jax's) rejection
        err = explain(e, chip=chip, topology=spec, program=program_name(program))
        return result("failed", trace_seconds=time.perf_counter() - t0, error=err)
    return result(
        "ok",
        trace_seconds=t1 - t0,
        compile_seconds=t2 - t1,
        memory=MemoryFigures.from_compiled(compiled),
        flops=_flops(compiled),
        compiled=compiled if keep_executable else None,
    )


def result_for(
    program: Any, target: CompileTarget, status: Status, **figures: Any
) -> CompileResult:
    """A result of ``program`` on ``target`` with ``status`` and the given figures."""
    spec = target.spec
    return CompileResult(
        program=program_name(program),
        chip=spec.chip.name,
        topology=spec.name,
        mode=spec.mode,
        num_devices=spec.num_devices,
        cores_per_device=spec.cores_per_device,
        expected=expected_status(program, spec.chip),
        status=status,
        **figures,
    )


def _struct(s: Any, sharding: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(tuple(s.shape), s.dtype, sharding=sharding)


def _jit(fn: Callable[..., Any]) -> Any:
    import jax

    return jax.jit(fn)


def _flops(compiled: Any) -> float | None:
    try:
        ca = compiled.cost_analysis()
    except Exception:  # cost analysis is best effort
        return None
    if isinstance(ca, list):
        ca = ca[0] if ca else None
    if not ca or "flops" not in ca:
        return None
    flops = float(ca["flops"])
    return flops if flops >= 0 else None


def compile_program(
    program: Any,
    chips: Sequence[str | Chip] = DEFAULT_CHIPS,
    *,
    devices: int | None = None,
    cores_per_device: int | None = None,
    mode: str | None = None,
    prevalidate: bool = True,
    keep_executable: bool = False,
    progress: ProgressFn | None = None,
) -> list[CompileResult]:
    """Compile one program for each chip in ``chips`` (default: every generation)."""
    return compile_matrix(
        [program],
        chips,
        devices=devices,
        cores_per_device=cores_per_device,
        mode=mode,
        prevalidate=prevalidate,
        keep_executable=keep_executable,
        progress=progress,
    )


def compile_matrix(
    programs: Sequence[Any],
    chips: Sequence[str | Chip] = DEFAULT_CHIPS,
    *,
    devices: int | None = None,
    cores_per_device: int | None = None,
    mode: str | None = None,
    prevalidate: bool = True,
    keep_executable: bool = False,
    progress: ProgressFn | None = None,
) -> list[CompileResult]:
    """Compile every program for every chip: program-major, one result per pair."""
    specs = [
        topology_for(c, devices=devices, cores_per_device=cores_per_device, mode=mode)
        for c in (get_chip(c) for c in chips)
    ]
    targets = [CompileTarget(s) for s in specs]
    total = len(programs) * len(targets)
    results: list[CompileResult] = []
    for p in programs:
        for t in targets:
            name = program_name(p)
            if progress:
                progress(Progress("compile", len(results), total, name, t.chip.name))
            r = compile_on(p, t, prevalidate=prevalidate, keep_executable=keep_executable)
            results.append(r)
            if progress:
                progress(Progress("compile", len(results), total, name, t.chip.name, r))
    return results
