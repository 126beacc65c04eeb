"""What the static-estimate benchmarks share: programs (a kernel beside its jax.numpy version),
the command line, the profile run with progress, and the report as markdown and JSON.

Not a benchmark itself (``nox -s bench`` runs ``bench_*.py``); each script imports it from its own
folder, so it works as ``python benchmarks/bench_x.py`` and inside profile's child processes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from coremesh.testing.aot import FunctionProgram

CHIPS = ("v5e", "v5p", "v6e", "TPU7x")


def compared(
    name: str,
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    args: Callable[[int], list[Any]],
    **program: Any,
) -> FunctionProgram:
    """A program jitting ``kernel``, with ``reference`` (its jax.numpy version) as the XLA
    version to estimate beside it; ``program`` goes to ``FunctionProgram`` (``work_fn``, ...)."""
    import jax

    from coremesh.testing.aot import target_program

    return FunctionProgram(
        name=name,
        builder=lambda _mesh: jax.jit(kernel),
        args=args,
        xla_reference=target_program(reference, args, name=f"{name}[xla]"),
        **program,
    )


def fmt(v: Any, spec: str = ".2f") -> str:
    """A table cell: ``-`` for a missing value, ``spec`` for numbers (``","`` for counts)."""
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def parser(doc: str | None, chips: Sequence[str] = CHIPS) -> argparse.ArgumentParser:
    """``--out``, ``--chips`` and ``--jobs``, the flags every static-estimate benchmark takes."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--out", default="bench-results", type=Path)
    p.add_argument("--chips", default=",".join(chips))
    p.add_argument("--jobs", type=int, default=2)
    return p


def chips_of(args: argparse.Namespace) -> list[str]:
    return [c for c in args.chips.split(",") if c]


def estimate(
    script: str,
    names: Iterable[str],
    chips: Sequence[str],
    *,
    devices: int,
    jobs: int,
    title: str,
) -> tuple[list[Any], dict[tuple[str, str], Any]]:
    """libtpu's estimates of ``script``'s ``PROGRAMS[name]`` on ``chips``, with progress on
    stderr: the kernels' estimates, and XLA's versions keyed by (program, chip)."""
    from coremesh.testing.aot import profile

    refs = [f"{Path(script).resolve()}:PROGRAMS[{name}]" for name in names]

    def progress(p: Any) -> None:
        if p.result is not None:
            print(f"  [{p.index}/{p.total}] {p.chip} {p.program}", file=sys.stderr, flush=True)

    print(f"{title}: {len(refs)} programs x {len(chips)} chips", file=sys.stderr)
    estimates = profile(refs, chips, devices=devices, jobs=jobs, progress=progress)
    xla = {(e.program.removesuffix("[xla]"), e.chip): e for e in estimates if e.variant == "xla"}
    return [e for e in estimates if e.variant == "kernel"], xla


def publish(out: Path, stem: str, lines: Sequence[str], data: Any) -> str:
    """Write ``stem``.md and ``stem``.json to ``out`` and print the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=2, default=str))
    print(text)
    return text
