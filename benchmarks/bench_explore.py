"""Benchmark and check: DMA-order exploration (``coremesh.testing.explore``).

Explores ``--schedules`` (default 64) DMA schedules of every core_map guide program, every
collective of ``coremesh.collectives`` and every SparseCore op of ``coremesh.sparsecore`` (their
registered compile-matrix programs), on ``--devices`` simulated v5p devices (the SparseCore
ops, whose kernels run per device, on ``--sparsecore-devices``); each must give the
same result under every schedule. JAX's shipped ``all_gather`` must be flagged (it relies on its
DMAs completing in issue order; its plain run already raises, at a DMA forwarding a block that has
not landed, so it is flagged without exploring). The cost of exploring is the guide's
``add_one``: one plain warm call against the whole exploration.

    python benchmarks/bench_explore.py [--out bench-results/] [--schedules 64] [--only NAME ...]

Prints a table and writes ``explore-jax<version>.json`` and ``.md`` to ``--out``; exits 1 if a
program that must pass diverges, or all_gather is not flagged.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# jax fixes the host device count when it starts: before any jax import.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "16")


def _inputs(program: Any, devices: int) -> list[Any]:
    """Seeded inputs for a compile-matrix program: normal floats, small non-negative ints."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for spec in program.arg_specs(devices):
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.integer):
            out.append(rng.integers(0, 256, spec.shape).astype(dtype))
        else:
            import jax.numpy as jnp

            out.append(jnp.asarray(rng.standard_normal(spec.shape, dtype=np.float32), dtype))
    return out


Case = tuple[str, str, Callable[[Any], tuple[Any, list[Any]]]]


def cases(devices: int) -> Iterator[Case]:
    """(group, name, make(sim) -> (jitted function, inputs)) of every program explored on
    ``devices`` devices but the SparseCore ops."""
    from coremesh.collectives.programs import programs as collective_programs
    from coremesh.testing.guide import PROGRAMS
    from coremesh.testing.shipped import KERNELS

    for name, guide in PROGRAMS.items():

        def make_guide(sim: Any, guide: Any = guide) -> tuple[Any, list[Any]]:
            mesh = sim.mesh()
            return guide.build(mesh), list(guide.make_inputs(mesh))

        yield "guide", name, make_guide
    yield from _programs("collectives", collective_programs(), devices)
    shipped = KERNELS["all_gather"]

    def make_shipped(sim: Any) -> tuple[Any, list[Any]]:
        return shipped.kernel(sim.device_mesh()), list(shipped.inputs(shipped.devices))

    yield "jax (must be flagged)", "pallas.ops.tpu.all_gather", make_shipped


def sparsecore_cases(devices: int) -> Iterator[Case]:
    from coremesh.sparsecore.programs import programs

    yield from _programs("sparsecore", programs(), devices)


def _programs(group: str, progs: list[Any], devices: int) -> Iterator[Case]:
    for program in progs:

        def make(sim: Any, program: Any = program) -> tuple[Any, list[Any]]:
            return program.build(sim.device_mesh()), _inputs(program, devices)

        yield group, program.name, make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--schedules", type=int, default=64)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--sparsecore-devices", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="program names to run (default: all)")
    args = parser.parse_args(argv)

    import jax

    rows: list[dict[str, Any]] = []
    runs = ((args.devices, cases), (args.sparsecore_devices, sparsecore_cases))
    for devices, make_cases in runs:
        rows += _explore(make_cases(devices), devices, args.schedules, args.only)
    data = {
        "jax": str(jax.__version__),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "devices": {"default": args.devices, "sparsecore": args.sparsecore_devices},
        "schedules": args.schedules,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"explore-jax{data['jax']}"
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=2))
    (args.out / f"{stem}.md").write_text(markdown(data))
    print(f"\nwrote {args.out / stem}.json/.md")
    return 0 if all(r["met"] for r in rows) else 1


def _explore(
    todo: Iterator[Case], devices: int, schedules: int, only: list[str] | None
) -> list[dict[str, Any]]:
    import jax
    import numpy as np

    import coremesh.testing as ct

    rows: list[dict[str, Any]] = []
    with ct.simulate("v5p", devices) as sim:
        for group, name, make in todo:
            if only and name not in only:
                continue
            fn, inputs = make(sim)
            must_flag = group.startswith("jax")
            try:
                np.asarray(sim.run(fn, *inputs))  # warm: compile once
            except Exception as err:  # caught by one plain run, before any schedule is explored
                rows.append(_raised(group, name, devices, must_flag, err))
                raised = type(err).__name__
                print(f"{group:22s} {name:36s} the plain run raised {raised}", flush=True)
                continue
            start = time.perf_counter()
            jax.block_until_ready(sim.run(fn, *inputs))
            call = time.perf_counter() - start
            start = time.perf_counter()
            report = ct.explore(fn, *inputs, schedules=schedules)
            took = time.perf_counter() - start
            row = {
                "group": group,
                "devices": devices,
                "program": name,
                "schedules_run": report.run,
                "ok": report.ok,
                "expected": "flagged" if must_flag else "ok",
                "met": (not report.ok) if must_flag else report.ok,
                "call_s": call,
                "explore_s": took,
                "report": str(report),
            }
            rows.append(row)
            print(
                f"{group:22s} {name:36s} {report.run:3d} schedules "
                f"{'ok' if report.ok else 'FLAGGED':8s} {took:7.1f} s (one call {call:.2f} s)",
                flush=True,
            )
            if not row["met"]:
                print(str(report), flush=True)

    return rows


def _seconds(s: float) -> str:
    return "-" if math.isnan(s) else f"{s:.2f} s"


def _raised(group: str, name: str, devices: int, must_flag: bool, err: Exception) -> dict[str, Any]:
    """A row for a program whose first, unexplored run raised: flagged without exploring."""
    first = str(err).splitlines()[0] if str(err) else ""
    return {
        "group": group,
        "devices": devices,
        "program": name,
        "schedules_run": 1,
        "ok": False,
        "expected": "flagged" if must_flag else "ok",
        "met": must_flag,
        "call_s": float("nan"),
        "explore_s": 0.0,
        "report": f"the plain run (the simulator's default DMA order) raised "
        f"{type(err).__name__}: {first}",
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# DMA-order exploration, jax {data['jax']} (Python {data['python']}, "
        f"{data['machine']}), v5p, {data['schedules']} schedules",
        "",
        "| group | program | devices | schedules run | result | expected | explore | one call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        result = "ok" if r["ok"] else "flagged"
        lines.append(
            f"| {r['group']} | {r['program']} | {r['devices']} | {r['schedules_run']} | {result} | "
            f"{r['expected']} | {r['explore_s']:.1f} s | {_seconds(r['call_s'])} |"
        )
    flagged = [r for r in data["rows"] if not r["ok"]]
    for r in flagged:
        lines += ["", f"`{r['program']}`:", "", "```", r["report"], "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
