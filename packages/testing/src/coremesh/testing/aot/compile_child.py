"""One compile in a fresh process, for a program this process can no longer build for the chip.

A ``jax.shard_map`` without ``mesh=`` keeps the first mesh it is traced under, so once a
context-mesh program (``program.ContextMeshProgram``) has compiled for one chip, only a process
that imports it anew can compile it for another. ``compile_in_child`` starts
``python -c "...compile_child import main; main()"``, writes one JSON job on its stdin (the
program's reference and name, the chip's topology, the options) and reads back the
``CompileResult``. The executable stays in the child: ``compiled`` is always None.
"""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from coremesh.core.errors import CoremeshError
from coremesh.testing import libtpu_env
from coremesh.testing.aot.program import (
    ProgramError,
    ProgramRef,
    as_programs,
    program_name,
    reference_of,
)
from coremesh.testing.aot.topology import CompileTarget

if TYPE_CHECKING:
    from coremesh.testing.aot.compile import CompileResult

#: Marks the child's result line on stdout (libraries may print there too).
MARK = "@@coremesh-compile@@ "
#: Seconds a child may take, start-up included.
TIMEOUT_S = 900.0


def compile_in_child(
    program: Any,
    target: CompileTarget,
    *,
    prevalidate: bool = True,
    compiler_options: dict[str, Any] | None = None,
) -> CompileResult:
    """``compile_on(program, target)`` in a fresh process that imports ``program`` again."""
    from coremesh.testing.aot.compile import result_for

    ref = reference_of(program)
    if ref is None:
        name = program_name(program)
        err = ProgramError(
            f"{name} takes its mesh from context and was already compiled for another chip in "
            "this process, and it cannot be found again in a fresh one",
            rule="jax.shard_map without mesh= keeps the first mesh it is traced under, so each "
            "further chip is compiled in a process that imports the program anew by reference",
            chip=target.chip.name,
            fix="define the (fn, args) pair or the program at module level (or pass its "
            "reference, e.g. 'mykernel.py:NAME'), or use a FunctionProgram whose builder passes "
            "mesh= to jax.shard_map",
        )
        return result_for(program, target, "invalid", error=err)
    job = {
        "ref": ref.to_json(),
        "name": program_name(program),
        "topology": target.spec.name,
        "cores_per_device": target.spec.cores_per_device,
        "prevalidate": prevalidate,
        "compiler_options": compiler_options,
        "sys_path": list(sys.path),
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-c", f"from {__name__} import main; main()"],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=libtpu_env.child_environment(),
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return result_for(program, target, "failed", error=_died(target, f"{TIMEOUT_S:.0f} s"))
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return _loads(line[len(MARK) :])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    why = f"exit code {proc.returncode}" + (f": {lines[-1].strip()[:400]}" if lines else "")
    return result_for(program, target, "failed", error=_died(target, why))


def _died(target: CompileTarget, why: str) -> CoremeshError:
    return CoremeshError(
        f"the fresh process compiling for {target.chip.name} gave no result ({why})",
        rule="a context-mesh program compiles for each further chip in a process of its own",
        chip=target.chip.name,
        fix="run 'coremesh check' on that chip alone to see the whole error",
    )


def main() -> None:
    """The child: compile the job's program for its chip and print the result on one line."""
    from coremesh.testing.aot.compile import compile_on

    job = json.load(sys.stdin)
    for p in job["sys_path"]:
        if p not in sys.path:
            sys.path.append(p)
    ref = ProgramRef.from_json(job["ref"])
    found = as_programs(ref.resolve(), what=str(ref), source=ref)
    program = next((p for p in found if program_name(p) == job["name"]), found[0])
    target = CompileTarget.for_chip(
        _chip_of(job["topology"]),
        topology=job["topology"],
        cores_per_device=job["cores_per_device"],
    )
    result = compile_on(
        program,
        target,
        prevalidate=bool(job["prevalidate"]),
        compiler_options=job["compiler_options"],
    )
    sys.stdout.write(MARK + _dumps(result) + "\n")
    sys.stdout.flush()


def _chip_of(topology: str) -> str:
    """The chip of a topology name (``"v5p:2x2x1"`` -> ``"v5p"``)."""
    return topology.split(":", 1)[0]


def _dumps(result: CompileResult) -> str:
    """The result without its executable, its error as class and state (coremesh errors take
    keyword arguments, which pickling an exception does not replay)."""
    import dataclasses

    err = result.error
    state = None if err is None else (type(err), dict(vars(err)))
    plain = dataclasses.replace(result, error=None, compiled=None)
    return base64.b64encode(pickle.dumps((plain, state))).decode("ascii")


def _loads(text: str) -> CompileResult:
    import dataclasses

    plain, state = pickle.loads(base64.b64decode(text))  # our own child's output
    result = cast("CompileResult", plain)
    return result if state is None else dataclasses.replace(result, error=_error(*state))


def _error(cls: type[CoremeshError], attrs: Mapping[str, Any]) -> CoremeshError:
    err = cls.__new__(cls)
    vars(err).update(attrs)
    Exception.__init__(err, err._format())
    return err
