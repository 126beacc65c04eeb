"""What the static-estimate benchmarks share: programs (a kernel beside its jax.numpy version),
the command line, the profile run with progress, and the report as markdown and JSON.

Not a benchmark itself (``nox -s bench`` runs ``bench_*.py``); each script imports it from its own
folder, so it works as ``python benchmarks/bench_x.py`` and inside profile's child processes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def line_chart(
    path: Path,
    panels: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    log: bool = True,
) -> bool:
    """One panel per ``panels`` key, one line per series of (x, y) points (log-log unless
    ``log`` is off; a series keeps its colour across panels), written as a PNG; False (and a
    note on stderr) without matplotlib."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        print("no chart: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    labels = list(dict.fromkeys(label for series in panels.values() for label in series))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        ticks: set[float] = set()
        for label, points in series.items():
            if not points:
                continue
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", label=label, color=colors[label])
            ticks.update(xs)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        if ticks:
            ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
