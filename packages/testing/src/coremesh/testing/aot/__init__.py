"""Compile-only checks for every TPU generation, static cycle estimates and a roofline.

libtpu's real compiler runs on a machine without a TPU. This package compiles a program for each
TPU generation (``compile_program``/``compile_matrix``), turns the compiler's rejections into
coremesh errors that say what to change (``explain``), refuses what cannot work before tracing
(``validate``), reads libtpu's static cycle estimates in child processes (``profile``) and puts them
next to a roofline bound from the chip registry (``roofline_for``). Compiling needs libtpu; static
estimates need libtpu 0.0.52 or newer and record the jax and libtpu that made them (``versions``).

    from coremesh.testing import aot
    from coremesh.testing.guide import PROGRAMS

    for r in aot.compile_program(PROGRAMS["add_one"], chips=("v5e", "v5p", "v6e", "TPU7x")):
        print(r.chip, r.status, r.compile_seconds, r.error)

    estimates = aot.profile(["coremesh.testing.aot.guide:PROGRAMS[add_one]"])
    print(aot.cycles_table(estimates))
"""

from coremesh.testing.aot.compile import (
    DEFAULT_CHIPS,
    CompileResult,
    MemoryFigures,
    Progress,
    compile_matrix,
    compile_on,
    compile_program,
)
from coremesh.testing.aot.cycles import CycleEstimate
from coremesh.testing.aot.diagnose import (
    CompilerCapacityError,
    CompilerError,
    CompilerLayoutError,
    CompilerMeshError,
    CompilerUnsupportedError,
    DiagnosedError,
    explain,
)
from coremesh.testing.aot.profile_dump import OpCycles
from coremesh.testing.aot.profiler import profile
from coremesh.testing.aot.program import (
    Arg,
    FunctionProgram,
    Program,
    ProgramError,
    ProgramRef,
    as_programs,
    jitted_program,
    load,
    target_program,
)
from coremesh.testing.aot.report import cycles_table, lines_table, matrix_table, to_json
from coremesh.testing.aot.roofline import Roofline, Work, cycles_to_seconds, roofline_for
from coremesh.testing.aot.topology import CompileTarget, TopologySpec, topology_for
from coremesh.testing.aot.validate import (
    BlockUse,
    Declared,
    Scratch,
    validate_program,
    validate_traced,
)
from coremesh.testing.aot.versions import LibtpuError

__all__ = [
    "DEFAULT_CHIPS",
    "Arg",
    "BlockUse",
    "CompileResult",
    "CompileTarget",
    "CompilerCapacityError",
    "CompilerError",
    "CompilerLayoutError",
    "CompilerMeshError",
    "CompilerUnsupportedError",
    "CycleEstimate",
    "Declared",
    "DiagnosedError",
    "FunctionProgram",
    "LibtpuError",
    "MemoryFigures",
    "OpCycles",
    "Program",
    "ProgramError",
    "ProgramRef",
    "Progress",
    "Roofline",
    "Scratch",
    "TopologySpec",
    "Work",
    "as_programs",
    "compile_matrix",
    "compile_on",
    "compile_program",
    "cycles_table",
    "cycles_to_seconds",
    "explain",
    "jitted_program",
    "lines_table",
    "load",
    "matrix_table",
    "profile",
    "roofline_for",
    "target_program",
    "to_json",
    "topology_for",
    "validate_program",
    "validate_traced",
]
