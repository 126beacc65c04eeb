"""Benchmark: the coremesh CPU simulator against stock Pallas TPU interpret mode of the same jax.

Both run the core_map guide's programs (``coremesh.testing.guide``) in fresh subprocesses with a
timeout, one after the other; a run that does not finish in time is reported as a deadlock.

"stock" is jax's own TPU interpret mode, given only what it needs to trace the programs on a CPU
at all: ``pltpu.get_tpu_info()`` and the core count of ``create_tensorcore_mesh`` for the chip,
and the requested number of devices (``simulate(disable_patches=...)`` with every fix off but
those two). "coremesh" is ``coremesh.testing.simulate`` with all its fixes; "unchecked" is the
same without the uninitialized-read check (``check_uninitialized=False``), whose cost the bench
records (goal: at most 1.5x).

    python benchmarks/bench_sim.py [--out bench-results/] [--timeout 60] [--reps 4]

Prints a table and writes ``sim-jax<version>.json`` and ``.md`` to ``--out``; with results of
other jax lines in the same folder (``nox -t bench-all-lines``), also ``sim-lines.md``, the lines
side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIXES_KEPT_FOR_STOCK = ("simulated_chip", "host_devices")

#: (program, devices) pairs, in the order they are run.
CASES = [
    ("add_one", 1),
    ("swap_kernel", 1),
    ("swap_core_map", 1),
    ("indexed_add_one", 1),
    ("sc_add_one", 1),
    ("swap_core_map", 4),
    ("swap_kernel", 4),
    ("add_one", 4),
    ("indexed_add_one", 4),
    ("sc_add_one", 4),
]

WORKER = """
import json, time
import jax
import numpy as np
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.sim import PATCH_NAMES, simulate

mode, name, devices, reps, chip = {mode!r}, {name!r}, {devices}, {reps}, {chip!r}
kept = {kept!r}
if mode == "coremesh":
    disabled = []
elif mode == "unchecked":
    disabled = ["uninitialized_reads"]
else:
    disabled = [p for p in PATCH_NAMES if p not in kept]
if mode == "stock":
    # Stock interpret mode as it is run: one host CPU device per simulated TPU device.
    # (simulate() itself asks for spare host devices, whose threads can hide the stock hang.)
    jax.config.update("jax_num_cpu_devices", devices)
    jax.devices()

def report(**kw):
    print("BENCH " + json.dumps(kw), flush=True)

try:
    with simulate(chip=chip, devices=devices, disable_patches=disabled, deadline=600) as sim:
        program = PROGRAMS[name]
        mesh = sim.mesh()
        fn = program.build(mesh)
        inputs = program.make_inputs(mesh)
        want = program.expected(*map(np.asarray, inputs))
        for _ in range(reps):
            wall, cpu = time.perf_counter(), time.process_time()
            got = np.asarray(fn(*inputs))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            wrong = int((got != want).sum())
            report(call=True, wall=wall, cpu=cpu, wrong=wrong, size=int(got.size))
except Exception as err:
    report(error=f"{{type(err).__name__}}: {{str(err).strip().splitlines()[0][:160]}}")
"""


def run_worker(
    mode: str, name: str, devices: int, reps: int, chip: str, timeout: float
) -> dict[str, Any]:
    """Run one program ``reps`` times in a fresh process; each finished call is reported as it
    ends, so a run that is slow but alive is told apart from one that never finishes a call."""
    code = WORKER.format(
        mode=mode, name=name, devices=devices, reps=reps, chip=chip, kept=FIXES_KEPT_FOR_STOCK
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        events = [
            json.loads(line[len("BENCH ") :])
            for line in out.read().splitlines()
            if line.startswith("BENCH ")
        ]
        stderr_tail = (err.read().strip().splitlines() or ["no output"])[-1][:160]
    calls = [e for e in events if e.get("call")]
    errors = [e["error"] for e in events if "error" in e]
    result: dict[str, Any] = {
        "times": [c["wall"] for c in calls],
        "cpu_times": [c["cpu"] for c in calls],
        "wall_s": wall,
        "detail": "",
    }
    if errors:
        result.update(status="error", detail=errors[0])
    elif calls and calls[-1]["wrong"]:
        last = calls[-1]
        result.update(status="wrong", detail=f"{last['wrong']} of {last['size']} elements wrong")
    elif calls:
        result["status"] = "ok"
        if timed_out:
            result["detail"] = f"{len(calls)} of {reps} calls before the {timeout:g} s timeout"
    elif timed_out:
        result.update(status="deadlock", detail=f"deadlock (timeout {timeout:g} s)")
    else:
        result.update(status="crash", detail=f"exit {proc.returncode}: {stderr_tail}")
    return result


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    times = result["times"]
    warm = times[1:] or times
    out = dict(result)
    out["cold_s"] = times[0] if times else None
    out["warm_s"] = min(warm) if warm else None
    out["warm_median_s"] = statistics.median(warm) if warm else None
    cpu = result.get("cpu_times") or []
    cpu_warm = cpu[1:] or cpu
    out["warm_cpu_s"] = min(cpu_warm) if cpu_warm else None
    return out


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def cell(r: dict[str, Any]) -> str:
    if r["status"] == "ok":
        note = f"; {r['detail']}" if r["detail"] else ""
        return f"OK, {fmt_time(r['warm_s'])} warm ({fmt_time(r['cold_s'])} first{note})"
    if r["status"] == "deadlock":
        return str(r["detail"])
    if r["status"] == "wrong":
        return f"WRONG ({r['detail']}), {fmt_time(r['warm_s'])} warm"
    return f"{r['status'].upper()}: {r['detail']}"


def check_cost(row: dict[str, Any]) -> float | None:
    """Warm time with the uninitialized-read check over the time without it."""
    on, off = row["coremesh"], row.get("unchecked")
    if off is None or on["status"] != "ok" or off["status"] != "ok":
        return None
    return float(on["warm_s"] / off["warm_s"])


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def speedup(stock: dict[str, Any], ours: dict[str, Any]) -> str:
    if stock["status"] == "ok" and ours["status"] == "ok":
        wall = stock["warm_s"] / ours["warm_s"]
        cpu = stock["warm_cpu_s"] / ours["warm_cpu_s"]
        return f"{wall:.1f}x ({cpu:.1f}x CPU)"
    if ours["status"] == "ok":
        return "stock fails"
    return "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per stock run")
    parser.add_argument("--reps", type=int, default=4, help="calls per run (first is cold)")
    parser.add_argument("--chip", default="v5p")
    parser.add_argument("--only", nargs="*", help="program names to run (default: all)")
    args = parser.parse_args(argv)

    rows = []
    for name, devices in CASES:
        if args.only and name not in args.only:
            continue
        row: dict[str, Any] = {"program": name, "devices": devices}
        for mode in ("stock", "coremesh", "unchecked"):
            # The simulator never needs long; a generous bound still catches a regression.
            timeout = args.timeout if mode == "stock" else max(args.timeout, 120.0)
            row[mode] = summarize(run_worker(mode, name, devices, args.reps, args.chip, timeout))
        row["speedup"] = speedup(row["stock"], row["coremesh"])
        row["check_cost"] = check_cost(row)
        rows.append(row)
        print(
            f"{name:16s} {devices} dev | stock: {cell(row['stock']):55s} | "
            f"coremesh: {cell(row['coremesh']):40s} | {row['speedup']} | "
            f"uninitialized-read check: {fmt_ratio(row['check_cost'])}",
            flush=True,
        )

    checks = goals(rows)
    report = {
        "chip": args.chip,
        "reps": args.reps,
        "stock_timeout_s": args.timeout,
        "stock_means": "jax TPU interpret mode with only " + ", ".join(FIXES_KEPT_FOR_STOCK),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "jax": _jax_version(),
        "rows": rows,
        "goals": checks,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"sim-jax{report['jax']}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    (args.out / f"{stem}.md").write_text(markdown(report))
    lines = sorted(args.out.glob("sim-jax*.json"))
    (args.out / "sim-lines.md").write_text(
        lines_markdown([json.loads(p.read_text()) for p in lines])
    )
    print()
    for goal in checks:
        print(f"[{'PASS' if goal['met'] else 'FAIL'}] {goal['goal']}: {goal['measured']}")
    print(f"\nwrote {args.out / stem}.json/.md and {args.out / 'sim-lines.md'}")
    return 0 if all(g["met"] for g in checks) else 1


def _jax_version() -> str:
    import jax

    return str(jax.__version__)


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["program"], r["devices"]): r for r in rows}
    out = []
    add_one = by.get(("add_one", 1))
    if add_one is not None:
        s, c = add_one["stock"], add_one["coremesh"]
        ok = s["status"] == "ok" and c["status"] == "ok"
        ratio = s["warm_s"] / c["warm_s"] if ok else None
        out.append(
            {
                "goal": "add_one 1024x1024 f32, 1 device: >= 4x faster than stock",
                "met": bool(ratio and ratio >= 4),
                "measured": f"{ratio:.1f}x ({fmt_time(s['warm_s'])} -> {fmt_time(c['warm_s'])})"
                if ratio
                else f"stock {s['status']}, coremesh {c['status']}",
            }
        )
    swap = by.get(("swap_kernel", 1))
    if swap is not None:
        c = swap["coremesh"]
        out.append(
            {
                "goal": "warm 2-core swap (pl.kernel, 1 device) under 50 ms",
                "met": c["status"] == "ok" and c["warm_s"] < 0.05,
                "measured": fmt_time(c["warm_s"]) if c["status"] == "ok" else c["status"],
            }
        )
    for devices in (1, 4):
        sc = by.get(("sc_add_one", devices))
        if sc is not None:
            out.append(
                {
                    "goal": f"sc_add_one, {devices} device(s): correct (stock is wrong)",
                    "met": sc["coremesh"]["status"] == "ok",
                    "measured": f"coremesh {cell(sc['coremesh'])}; stock {cell(sc['stock'])}",
                }
            )
    costs = [(r["check_cost"], r) for r in rows if r.get("check_cost") is not None]
    if costs:
        worst, row = max(costs, key=lambda c: c[0])
        out.append(
            {
                "goal": "the uninitialized-read check costs at most 1.5x (warm, with / without)",
                "met": worst <= 1.5,
                "measured": f"at most {worst:.2f}x ({row['program']}, {row['devices']} device(s))"
                + "; "
                + ", ".join(f"{r['program']}/{r['devices']}: {c:.2f}x" for c, r in costs),
            }
        )
    four = [r for r in rows if r["devices"] == 4]
    if four:
        met = all(r["coremesh"]["status"] == "ok" for r in four)
        stock_ok = [r["program"] for r in four if r["stock"]["status"] == "ok"]
        out.append(
            {
                "goal": "every 4-device program finishes correctly",
                "met": met,
                "measured": ", ".join(f"{r['program']}: {cell(r['coremesh'])}" for r in four)
                + (f"; stock OK on {stock_ok}" if stock_ok else "; stock OK on none"),
            }
        )
    return out


def lines_markdown(reports: list[dict[str, Any]]) -> str:
    """One table with every jax line's run side by side: warm time and speedup per program."""
    reports = sorted(reports, key=lambda r: [int(p) for p in r["jax"].split(".")])
    head = " | ".join(f"jax {r['jax']}: stock / coremesh (speedup)" for r in reports)
    lines = [
        "# Simulator against stock interpret mode, per jax line",
        "",
        "Each line's run is its own `nox -s bench` (same machine, one after the other): "
        + ", ".join(f"jax {r['jax']} on Python {r['python']}" for r in reports)
        + ". Warm wall time of the fastest call after the first.",
        "",
        f"| program | devices | {head} |",
        "|---|---|" + "---|" * len(reports),
    ]
    keys = list(dict.fromkeys((r["program"], r["devices"]) for rep in reports for r in rep["rows"]))
    for program, devices in keys:
        cells = []
        for rep in reports:
            row = next(
                (r for r in rep["rows"] if (r["program"], r["devices"]) == (program, devices)),
                None,
            )
            cells.append(
                "-"
                if row is None
                else f"{short(row['stock'])} / {short(row['coremesh'])} ({row['speedup']})"
            )
        lines.append(f"| {program} | {devices} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def short(r: dict[str, Any]) -> str:
    if r["status"] == "ok":
        return fmt_time(r["warm_s"])
    return str(r["status"]).upper()


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Simulator benchmark: coremesh vs stock TPU interpret mode",
        "",
        f"jax {report['jax']}, Python {report['python']}, {report['machine']}; chip "
        f"{report['chip']}; {report['reps']} calls per run (first is cold, 'warm' is the "
        f"fastest of the rest); stock runs time out after {report['stock_timeout_s']:g} s.",
        f"Stock = {report['stock_means']}.",
        "",
        "| program | devices | stock | coremesh | speedup (warm wall time, CPU time) "
        "| uninitialized-read check (with / without) |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['program']} | {r['devices']} | {cell(r['stock'])} | {cell(r['coremesh'])} "
            f"| {r['speedup']} | {fmt_ratio(r.get('check_cost'))} |"
        )
    lines += ["", "## Goals", ""]
    for g in report["goals"]:
        lines.append(f"- {'PASS' if g['met'] else 'FAIL'}: {g['goal']} — {g['measured']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
