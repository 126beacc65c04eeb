"""Compile-only benchmark: the core_map guide's programs on every TPU generation, no TPU needed.

1. The compile matrix: every guide program compiled by libtpu for v4, v5e, v5p, v6e and TPU7x in
   this process; wall time against the 60 s budget.
2. libtpu's static cycle estimate per kernel and chip (child processes), next to the roofline
   bound from the chip registry and XLA's own version of the same computation.

Writes ``aot-jax<version>-libtpu<version>.{md,json,png}`` to ``--out`` (default
``bench-results/``), so runs on different jax lines (``nox -s bench`` runs one per line) and
libtpu releases sit side by side, and prints the tables. When the directory holds results of other
runs, ``aot-lines.md`` shows how each guide program's estimate moved between them (program x chip
x run). Exit status 1 when a program does not compile where it should.

    python benchmarks/bench_aot.py --out bench-results
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402 - the clock starts before the imports it measures
import importlib.util  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

MATRIX_BUDGET_S = 60.0
REFERENCE = "coremesh.testing.aot.guide:PROGRAMS"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-results", help="output directory")
    parser.add_argument("--jobs", type=int, default=2, help="chips profiled at once")
    parser.add_argument("--chips", default=None, help="comma-separated chips (default: all)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from coremesh.testing import aot
    from coremesh.testing.aot.guide import PROGRAMS
    from coremesh.testing.aot.topology import CompileTarget

    chips = args.chips.split(",") if args.chips else list(aot.DEFAULT_CHIPS)
    t_import = time.perf_counter() - T_START

    def progress(p: Any) -> None:
        if p.result is not None:
            status = p.result if isinstance(p.result, str) else p.result.status
            print(
                f"  [{p.index}/{p.total}] {p.stage} {p.chip} {p.program}: {status}",
                file=sys.stderr,
                flush=True,
            )

    t = time.perf_counter()
    CompileTarget.for_chip(chips[0]).devices  # noqa: B018 - loads libtpu
    t_libtpu = time.perf_counter() - t

    print(f"compile matrix: {len(PROGRAMS)} programs x {len(chips)} chips", file=sys.stderr)
    t = time.perf_counter()
    matrix = aot.compile_matrix(list(PROGRAMS.values()), chips, progress=progress)
    t_matrix = time.perf_counter() - t

    print("static cycle estimates", file=sys.stderr)
    t = time.perf_counter()
    cycles = aot.profile([REFERENCE], chips, jobs=args.jobs, progress=progress)
    t_cycles = time.perf_counter() - t

    timing = {
        "import_s": round(t_import, 2),
        "libtpu_init_s": round(t_libtpu, 2),
        "matrix_s": round(t_matrix, 2),
        "matrix_with_start_s": round(t_import + t_libtpu + t_matrix, 2),
        "matrix_compiles": len(matrix),
        "matrix_budget_s": MATRIX_BUDGET_S,
        "matrix_within_budget": t_import + t_libtpu + t_matrix < MATRIX_BUDGET_S,
        "compile_s_sum": round(sum(r.seconds for r in matrix), 2),
        "profile_s": round(t_cycles, 2),
        "profile_jobs": args.jobs,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
    }
    md = report(matrix, cycles, timing)
    name = run_name()  # dotted versions: Path.with_suffix would cut them
    written = [out / f"{name}.md", out / f"{name}.json"]
    written[0].write_text(md)
    written[1].write_text(aot.to_json(matrix, cycles, timing=timing))
    if importlib.util.find_spec("matplotlib") is None:
        print("no chart: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    else:
        chart(cycles, out / f"{name}.png")
        written.append(out / f"{name}.png")
    print(md)
    lines = compare_runs(out)
    if lines is not None:
        (out / "aot-lines.md").write_text(lines)
        written.append(out / "aot-lines.md")
        print(lines)
    print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0 if all(r.as_expected for r in matrix) else 1


def run_name() -> str:
    """``aot-jax0.12.0.1-libtpu0.0.52``: the versions that made this run's numbers."""
    from coremesh.testing.aot.versions import jax_version, libtpu_version

    return f"aot-jax{jax_version()}-libtpu{libtpu_version()}"


def compare_runs(out: Path) -> str | None:
    """The estimates of every run in ``out`` side by side; None when there is only one run."""
    import json

    from coremesh.testing.aot import lines_table

    records = []
    verdicts: dict[tuple[str, str], dict[str, str]] = {}
    for path in sorted(out.glob("aot-jax*-libtpu*.json")):
        doc = json.loads(path.read_text())
        records += doc.get("cycles", [])
        run = f"jax {doc['versions']['jax']} / libtpu {doc['versions']['libtpu']}"
        for c in doc.get("compile", []):
            verdicts.setdefault((c["program"], c["chip"]), {})[run] = c["status"]
    runs = {(r.get("jax"), r.get("libtpu")) for r in records}
    if len(runs) < 2:
        return None
    differ = [
        f"- {program} on {chip}: " + ", ".join(f"{run}: {v}" for run, v in sorted(by.items()))
        for (program, chip), by in verdicts.items()
        if len(set(by.values())) > 1
    ]
    return "\n".join(
        [
            "# Compile verdicts and static cycle estimates across jax lines and libtpu releases",
            "",
            "## Compile verdicts that differ between runs",
            "",
            *(differ or ["None: every program has the same verdict on every chip in every run."]),
            "",
            "## Static cycle estimates",
            "",
            f"The guide's programs, from the {len(runs)} runs in this directory "
            "(aot-jax*-libtpu*.json). Cells: libtpu's estimate in cycles (no estimate / n/a "
            "where there is none); the last column is the change from the oldest run to the "
            "newest with an estimate.",
            "",
            "### Pallas kernels",
            "",
            lines_table(records, "markdown"),
            "",
            "### XLA's version of the same computation",
            "",
            lines_table(records, "markdown", variant="xla"),
            "",
        ]
    )


def report(matrix: list[Any], cycles: list[Any], timing: dict[str, Any]) -> str:
    from coremesh.testing import aot
    from coremesh.testing.aot.report import versions

    v = versions()
    verdict = "within" if timing["matrix_within_budget"] else "OVER"
    lines = [
        "# Compile-only benchmark: the core_map guide's programs",
        "",
        f"jax {v['jax']}, libtpu {v['libtpu']}, {timing['cpus']} CPUs ({timing['machine']}).",
        "",
        "## Compile matrix",
        "",
        f"{timing['matrix_compiles']} compiles in {timing['matrix_s']:.1f} s "
        f"({timing['matrix_with_start_s']:.1f} s with Python start, imports "
        f"{timing['import_s']:.1f} s and libtpu start-up {timing['libtpu_init_s']:.1f} s): "
        f"{verdict} the {timing['matrix_budget_s']:.0f} s budget. Cells: compile seconds "
        "(trace + lower + compile); n/a: the chip lacks what the program needs.",
        "",
        aot.matrix_table(matrix, "markdown"),
        "",
        "## Static cycles against the roofline",
        "",
        "libtpu's static estimate of each program's TensorCore operations (Pallas kernel, and "
        "XLA's own version of the same computation in plain jax.numpy), in cycles and in "
        "microseconds at the registry's clock; the roofline is the per-device lower bound "
        "max(bytes / HBM bandwidth, flops / peak) from the chip registry, with bytes = the "
        "program's arguments read once and results written once. Ratios above 1 are slower "
        "than the bound; below 1 means libtpu's static model charges less than the HBM "
        f"bandwidth allows. Estimated in {timing['profile_s']:.1f} s "
        f"({timing['profile_jobs']} child processes at a time).",
        "",
        aot.cycles_table(cycles, "markdown"),
        "",
    ]
    return "\n".join(lines)


def chart(cycles: list[Any], path: Path) -> None:
    """Per program: kernel and XLA estimates next to the roofline, per chip (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from coremesh.testing.aot.report import chips_in

    programs = list(dict.fromkeys(r.program for r in cycles))
    chips = chips_in(cycles)
    by = {(r.program, r.variant, r.chip): r for r in cycles}
    cols = 3
    rows = -(-(len(programs) + 1) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    width = 0.27
    series = [
        ("kernel", "tab:blue", -width, "Pallas kernel (libtpu estimate)"),
        ("xla", "tab:orange", 0.0, "XLA jnp version (libtpu estimate)"),
        ("roofline", "tab:gray", width, "roofline bound (registry)"),
    ]
    for ax, program in zip(axes, programs, strict=False):
        for i, chip in enumerate(chips):
            k = by.get((program, "kernel", chip))
            x = by.get((program, "xla", chip))
            roof = (k.roofline if k else None) or (x.roofline if x else None)
            values = {
                "kernel": (k.seconds, k.status) if k else (None, "n/a"),
                "xla": (x.seconds, x.status) if x else (None, "n/a"),
                "roofline": (roof.bound_s if roof else None, "n/e"),
            }
            for name, color, dx, _ in series:
                seconds, status = values[name]
                if seconds:
                    ax.bar(i + dx, seconds * 1e6, width, color=color)
                else:
                    label = "n/a" if status == "unsupported" else "n/e"
                    ax.text(
                        i + dx,
                        0.02,
                        label,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        rotation=90,
                        transform=ax.get_xaxis_transform(),
                    )
        ax.set_title(program)
        ax.set_xticks(range(len(chips)), chips)
        ax.set_xlim(-0.6, len(chips) - 0.4)
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(axis="y", which="major", alpha=0.3)
        ax.set_ylabel("us per device (log)")
    legend_ax = axes[len(programs)]
    legend_ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, c, _, _ in series]
    legend_ax.legend(
        handles,
        [label for *_, label in series],
        loc="center",
        frameon=False,
        title="n/e: no estimate from libtpu\nn/a: chip lacks SparseCores",
    )
    for ax in axes[len(programs) + 1 :]:
        ax.axis("off")
    fig.suptitle("core_map guide programs: libtpu static cycle estimate vs roofline")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
