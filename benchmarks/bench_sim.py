"""Benchmark: the coremesh CPU simulator against stock Pallas TPU interpret mode of the same jax.

Both run the core_map guide's programs (``coremesh.testing.guide``) in fresh subprocesses with a
timeout, one after the other; a run that does not finish in time is reported as a deadlock.

"stock" is jax's own TPU interpret mode, given only what it needs to trace the programs on a CPU
at all: ``pltpu.get_tpu_info()`` and the core count of ``create_tensorcore_mesh`` for the chip,
and the requested number of devices (``simulate(disable_patches=...)`` with every fix off but
those two). "coremesh" is ``coremesh.testing.simulate`` as it runs by default, with all its
fixes and the compiled fast path; "interpreted" the same with ``fast_path=False`` (every kernel
on the interpreter); "unchecked" is the default without the uninitialized-read check
(``check_uninitialized=False``), whose cost the bench records (goal: at most 1.5x). For add_one
the same math in ``jax.numpy`` runs in the coremesh process, jitted on the same devices and
inputs. Goals (issue 17): add_one on 1 device within 100x of ``jax.numpy``; on 4 devices x 2
cores with 4x the rows, at most 4x the 1-device time (the time follows the work, not the host
threads).

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

#: (program, devices, rows) in the order they are run; rows None is the guide's size. The last
#: case gives each of 4 devices as many rows as add_one's 1-device case has, to show that the
#: time grows with the work, not with the host threads (it skips stock, which does not finish).
CASES: list[tuple[str, int, int | None]] = [
    ("add_one", 1, None),
    ("swap_kernel", 1, None),
    ("swap_core_map", 1, None),
    ("indexed_add_one", 1, None),
    ("sc_add_one", 1, None),
    ("swap_core_map", 4, None),
    ("swap_kernel", 4, None),
    ("add_one", 4, None),
    ("indexed_add_one", 4, None),
    ("sc_add_one", 4, None),
    ("add_one", 4, 4096),
]

#: A program whose warm call takes under SHORT_S seconds is called up to SHORT_CALLS times (or
#: for a second): its warm time is the fastest of those.
SHORT_CALLS, SHORT_S = 40, 0.05

#: add_one's rows at the guide's size (1024 x 1024 float32)
GUIDE_ROWS = 1024

#: what each run is: jax's stock interpret mode, the simulator (compiled fast path where it
#: applies, the default), the simulator interpreting every kernel (``fast_path=False``), and
#: the simulator without the uninitialized-read check.
MODES = ("stock", "coremesh", "interpreted", "unchecked")

WORKER = """
import dataclasses, json, time
import jax
import numpy as np
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.sim import PATCH_NAMES, simulate

mode, name, devices, reps, chip = {mode!r}, {name!r}, {devices}, {reps}, {chip!r}
rows = {rows!r}
kept = {kept!r}
fast_path = mode != "interpreted"
if mode in ("coremesh", "interpreted"):
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

JNP = {{"add_one": lambda x: x + 1}}

try:
    with simulate(
        chip=chip, devices=devices, disable_patches=disabled, deadline=600, fast_path=fast_path
    ) as sim:
        program = PROGRAMS[name]
        if rows:
            program = dataclasses.replace(program, shape=(rows, program.shape[1]))
        mesh = sim.mesh()
        fn = program.build(mesh)
        inputs = program.make_inputs(mesh)
        want = program.expected(*map(np.asarray, inputs))
        calls, warm = 0, 0.0
        # A program of a few milliseconds is called until a second of warm calls (at most
        # {short_calls}): the fastest of 3 is noise at that scale.
        while calls < reps or (calls < {short_calls} and warm < 1.0 and wall < {short_s}):
            calls += 1
            wall, cpu = time.perf_counter(), time.process_time()
            got = np.asarray(fn(*inputs))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            warm += wall if calls > 1 else 0.0
            wrong = int((got != want).sum())
            report(call=True, wall=wall, cpu=cpu, wrong=wrong, size=int(got.size))
        report(paths=dict(sim.paths))
        if mode == "coremesh" and name in JNP:
            # The same math in jax.numpy, jitted, on the same host devices and inputs.
            same = jax.jit(JNP[name])
            jax.block_until_ready(same(*inputs))
            for _ in range(max(reps, {short_calls})):
                wall = time.perf_counter()
                jax.block_until_ready(same(*inputs))
                report(jnp=time.perf_counter() - wall)
except Exception as err:
    report(error=f"{{type(err).__name__}}: {{str(err).strip().splitlines()[0][:160]}}")
"""


def run_worker(
    mode: str,
    name: str,
    devices: int,
    reps: int,
    chip: str,
    timeout: float,
    rows: int | None = None,
) -> dict[str, Any]:
    """Run one program ``reps`` times in a fresh process; each finished call is reported as it
    ends, so a run that is slow but alive is told apart from one that never finishes a call."""
    code = WORKER.format(
        mode=mode,
        name=name,
        devices=devices,
        reps=reps,
        chip=chip,
        kept=FIXES_KEPT_FOR_STOCK,
        rows=rows,
        short_calls=SHORT_CALLS,
        short_s=SHORT_S,
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
        "jnp_times": [e["jnp"] for e in events if "jnp" in e],
        "paths": next((e["paths"] for e in events if "paths" in e), {}),
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
    jnp_times = result.get("jnp_times") or []
    out["jnp_s"] = min(jnp_times) if jnp_times else None
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


def vs_jnp(ours: dict[str, Any]) -> float | None:
    """The simulator's warm time over the same math's in jax.numpy (same process, devices)."""
    if ours["status"] != "ok" or not ours.get("jnp_s"):
        return None
    return float(ours["warm_s"] / ours["jnp_s"])


def label(row: dict[str, Any]) -> str:
    return str(row["program"]) + (f" ({row['rows']} rows)" if row.get("rows") else "")


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def speedup(stock: dict[str, Any], ours: dict[str, Any]) -> str:
    if stock["status"] == "not run":
        return "-"
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
    for name, devices, size in CASES:
        if args.only and name not in args.only:
            continue
        row: dict[str, Any] = {"program": name, "devices": devices, "rows": size}
        for mode in MODES:
            if mode == "stock" and size is not None:
                row[mode] = {"status": "not run", "detail": "not run at this size", "times": []}
                continue
            # The simulator never needs long; a generous bound still catches a regression.
            timeout = args.timeout if mode == "stock" else max(args.timeout, 120.0)
            row[mode] = summarize(
                run_worker(mode, name, devices, args.reps, args.chip, timeout, size)
            )
        row["speedup"] = speedup(row["stock"], row["coremesh"])
        row["check_cost"] = check_cost(row)
        row["vs_jnp"] = vs_jnp(row["coremesh"])
        rows.append(row)
        print(
            f"{label(row):24s} {devices} dev | stock: {cell(row['stock']):55s} | "
            f"coremesh: {cell(row['coremesh']):40s} | {row['speedup']} | "
            f"interpreted: {cell(row['interpreted']):40s} | jnp: {fmt_ratio(row['vs_jnp'])} | "
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
    by = {(r["program"], r["devices"]): r for r in rows if not r.get("rows")}
    out = []
    one = by.get(("add_one", 1))
    if one is not None and one.get("vs_jnp") is not None:
        c, slow = one["coremesh"], fmt_time(one["interpreted"].get("warm_s"))
        out.append(
            {
                "goal": "add_one 1024x1024 f32, 1 device: within 100x of jax.numpy",
                "met": one["vs_jnp"] <= 100,
                "measured": f"{one['vs_jnp']:.1f}x ({fmt_time(c['warm_s'])} against "
                f"{fmt_time(c['jnp_s'])}; interpreted: {slow})",
            }
        )
    big = next((r for r in rows if r["program"] == "add_one" and r.get("rows")), None)
    if one is not None and big is not None:
        a, b = one["coremesh"], big["coremesh"]
        ok = a["status"] == "ok" and b["status"] == "ok"
        work = big["rows"] / GUIDE_ROWS
        ratio = b["warm_s"] / a["warm_s"] if ok else None
        out.append(
            {
                "goal": f"add_one on {big['devices']} devices x 2 cores with {work:g}x the rows of "
                f"1 device: time grows with the work (at most {work:g}x the 1-device time)",
                "met": bool(ratio is not None and ratio <= work),
                "measured": (
                    f"{ratio:.2f}x ({fmt_time(a['warm_s'])} -> {fmt_time(b['warm_s'])}; "
                    f"jax.numpy on the same devices: {fmt_ratio(big.get('vs_jnp'))} of it)"
                )
                if ratio is not None
                else f"1 device {a['status']}, {big['devices']} devices {b['status']}",
            }
        )
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

    def key(r: dict[str, Any]) -> tuple[str, int, int | None]:
        return r["program"], r["devices"], r.get("rows")

    keys = list(dict.fromkeys(key(r) for rep in reports for r in rep["rows"]))
    for program, devices, size in keys:
        cells = []
        for rep in reports:
            row = next((r for r in rep["rows"] if key(r) == (program, devices, size)), None)
            cells.append(
                "-"
                if row is None
                else f"{short(row['stock'])} / {short(row['coremesh'])} ({row['speedup']})"
            )
        name = program + (f" ({size} rows)" if size else "")
        lines.append(f"| {name} | {devices} | {' | '.join(cells)} |")
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
        f"fastest of the rest; a program under {SHORT_S * 1e3:g} ms is called for a second, at "
        f"most {SHORT_CALLS} times); stock runs time out after {report['stock_timeout_s']:g} s.",
        f"Stock = {report['stock_means']}.",
        "",
        "coremesh = the simulator as it runs by default (kernels on the compiled fast path "
        "where it applies); interpreted = `simulate(fast_path=False)`; jax.numpy = the same "
        "math jitted on the same host devices and inputs (add_one only).",
        "",
        "| program | devices | stock | coremesh | speedup (warm wall time, CPU time) "
        "| interpreted | coremesh / jax.numpy | uninitialized-read check (with / without) "
        "| path |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        paths = "; ".join(sorted(set(r["coremesh"].get("paths", {}).values())))
        lines.append(
            f"| {label(r)} | {r['devices']} | {cell(r['stock'])} | {cell(r['coremesh'])} "
            f"| {r['speedup']} | {cell(r['interpreted'])} | {fmt_ratio(r.get('vs_jnp'))} "
            f"| {fmt_ratio(r.get('check_cost'))} | {paths} |"
        )
    lines += ["", "## Goals", ""]
    for g in report["goals"]:
        lines.append(f"- {'PASS' if g['met'] else 'FAIL'}: {g['goal']} — {g['measured']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
