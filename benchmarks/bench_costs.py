"""Benchmark: what the simulator spends per operation, how its time grows with the problem, and
the host memory a simulated operand costs (issue 17, points 2 and 4).

Every measurement runs in a fresh subprocess with a timeout (this script re-run with
``--child``), on one simulated v5p device (2 TensorCores):

- **costs**: the guide's ``add_one`` (``coremesh.testing.guide``) and JAX's shipped matmul
  (``coremesh.testing.shipped``). Every interpreter callback of one more warm call, run after
  the timed ones, is counted by the interpreter function it runs, by wrapping
  ``io_callback``'s implementation (the one place every callback passes) once the simulator is
  entered; DMAs are ``dma_start`` callbacks plus
  the ``pallas_call`` pipeline's block copies (a ``get`` of an input block from HBM, a ``store``
  of an output block to HBM). Times per callback and per DMA are warm wall time over those
  counts; "in callbacks" is the time measured inside them (summed over the cores' threads).
- **scaling**: warm simulator time against problem size for ``add_one`` ((8, 128) blocks, the
  guide's) and matmul ((128, 128) blocks, ``block_k`` 128, the shipped ones), interpreted and on
  the compiled fast path (``simulate(fast_path=True)``; the default, ``"auto"``, interprets
  the smallest sizes, where compiling costs more than it saves), the ``jax.numpy`` version
  beside them, drawn in ``costs-jax<version>.png``.
- **memory**: peak host RSS (``ru_maxrss``) of ``add_one`` on a (2048, 1024) float32 operand
  (8 MiB) over the process's own baseline after importing jax and building the input, as a
  multiple of the operand, on the compiled fast path and interpreted: the first call (tracing
  and compiling included; what those take alone is a (64, 1024) operand's first call), and the
  operand's own cost, that peak less the small operand's (target: at most 3x).

    python benchmarks/bench_costs.py [--out bench-results/] [--quick] [--sizes 256,512]
        [--matmul-sizes 256,512] [--reps 3] [--timeout 300] [--memory-only]

Writes ``costs-jax<version>.md``, ``.json`` and ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHIP = "v5p"
#: add_one's block (the guide's) and matmul's blocks (the shipped corpus's).
ADD_ONE_BLOCK = (8, 128)
MATMUL_BLOCK = 128
#: square sizes n (n x n float32) charted by default, and with --quick
ADD_ONE_SIZES = (256, 512, 1024, 2048)
MATMUL_SIZES = (256, 512, 1024, 2048)
QUICK_SIZES = (256, 512)
#: the costs table's cases: (kernel, n, fast_path)
COST_CASES = (
    ("add_one", 1024, False),
    ("add_one", 1024, True),
    ("matmul", 512, False),
    ("matmul", 512, True),
)
#: callbacks that run the cores' programs (the others run inside them, on other threads): their
#: time is not added to the time inside callbacks
CONTAINERS = frozenset({"_thread_map_callback"})
#: the memory case: add_one on an 8 MiB operand, and the issue's target; the small operand's
#: run shows what tracing and compiling the same program take, the large one's what each further
#: operand byte costs
MEMORY_SHAPE = (2048, 1024)
SMALL_SHAPE = (64, 1024)
LARGE_SHAPE = (4096, 2048)
MEMORY_TARGET = 3.0


# --------------------------------------------------------------------------------------------
# The child: one kernel, one size, in its own process.
# --------------------------------------------------------------------------------------------


def _report(**kw: Any) -> None:
    print("BENCH " + json.dumps(kw), flush=True)


class CallbackCounter:
    """Counts and times every interpreter callback, by the function it runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @staticmethod
    def name(flat_callback: Any) -> str:
        """The interpreter function behind an ``io_callback`` (``get``, ``dma_start``, ...);
        ``get`` of an input block and ``store`` of an output block of a ``pallas_call``
        pipeline (whose partials carry ``input_name`` / ``output_name``) are named apart."""
        fn = getattr(flat_callback, "callback_func", flat_callback)
        keywords: dict[str, Any] = {}
        while hasattr(fn, "func"):  # functools.partial, possibly nested
            keywords.update(getattr(fn, "keywords", None) or {})
            fn = fn.func
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        name = str(getattr(fn, "__name__", type(fn).__name__))
        if "input_name" in keywords:
            return f"{name} (input block)"
        if "output_name" in keywords:
            return f"{name} (output block)"
        return name

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Wrap ``io_callback``'s implementation as the simulator left it (its host-copy patch
        included), so the count and the time cover the whole callback."""
        from jax._src import callback as cb

        inner = cb.io_callback_impl
        names: dict[int, str] = {}

        def counted(*args: Any, callback: Any, **kw: Any) -> Any:
            key = names.get(id(callback))
            if key is None:
                key = names.setdefault(id(callback), self.name(callback))
            start = time.perf_counter()
            try:
                return inner(*args, callback=callback, **kw)
            finally:
                spent = time.perf_counter() - start
                with self.lock:
                    self.counts[key] += 1
                    self.seconds[key] += spent

        cb.io_callback_impl = counted
        try:
            yield
        finally:
            cb.io_callback_impl = inner

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"counts": dict(self.counts), "seconds": dict(self.seconds)}


def add_one(rows: int, cols: int) -> Any:
    """The guide's add_one program (its corpus entry) on a (rows, cols) float32 operand."""
    from coremesh.testing.guide import PROGRAMS, AddOne

    program = PROGRAMS["add_one"]
    assert isinstance(program, AddOne)
    return dataclasses.replace(program, shape=(rows, cols))


def _case(kernel: str, n: int, sim: Any) -> tuple[Callable[..., Any], Callable[..., Any], Any]:
    """(simulated function, its jax.numpy version, inputs) of ``kernel`` at size ``n``."""
    import jax
    import numpy as np

    if kernel == "add_one":
        program = add_one(n, n)
        mesh = sim.mesh()
        return program.build(mesh), jax.jit(lambda x: x + 1), program.make_inputs(mesh)
    from coremesh.testing.shipped import KERNELS

    entry = KERNELS["matmul"]
    rng = np.random.default_rng(0)
    args = tuple(
        jax.device_put(rng.standard_normal((n, n), dtype=np.float32), sim.devices[0])
        for _ in range(2)
    )
    return jax.jit(entry.kernel(sim.mesh())), jax.jit(entry.reference), args


def _warm(fn: Callable[..., Any], args: Any, reps: int, *, compile_first: bool) -> list[float]:
    """Wall seconds of ``reps`` calls (after an untimed one if ``compile_first``)."""
    import jax

    if compile_first:
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def child_run(spec: dict[str, Any]) -> None:
    """Time (and count) one kernel at one size; report the jnp version's time beside it."""
    import jax
    import numpy as np

    import coremesh.testing as ct

    counter = CallbackCounter()
    with ct.simulate(CHIP, 1, fast_path=spec["fast_path"]) as sim:
        fn, reference, args = _case(spec["kernel"], spec["n"], sim)
        cold = time.perf_counter()
        got = np.asarray(jax.block_until_ready(fn(*args)))
        cold = time.perf_counter() - cold
        _report(progress=f"first call {cold:.2f} s")
        times = _warm(fn, args, spec["reps"], compile_first=False)
        # One more call, counted: the wrapper's own cost stays out of the timed calls.
        with counter.installed():
            counted = time.perf_counter()
            jax.block_until_ready(fn(*args))
            counted = time.perf_counter() - counted
        calls = counter.snapshot()
        want = np.asarray(reference(*args))
        err = float(np.max(np.abs(got - want)))
        jnp_times = _warm(reference, args, max(spec["reps"], 5), compile_first=True)
        paths = dict(sim.paths)
    _report(
        result=True,
        cold_s=cold,
        times=times,
        counted_s=counted,
        jnp_times=jnp_times,
        max_abs_err=err,
        paths=paths,
        **calls,
    )


def _peak_rss() -> int:
    """This process's peak resident bytes so far (``ru_maxrss`` is KiB on Linux)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _rss() -> int | None:
    """This process's resident bytes now (Linux: /proc/self/statm), None elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def child_memory(spec: dict[str, Any]) -> None:
    """Peak RSS of add_one on one operand over the baseline after jax's import and the input."""
    import jax
    import numpy as np

    import coremesh.testing as ct

    # One path for every operand (spec["fast_path"]): under the default ("auto") the small
    # operand's add_one is interpreted, and its run would not be the large one's tracing and
    # compiling.
    with ct.simulate(CHIP, 1, fast_path=spec["fast_path"]) as sim:
        program = add_one(*spec["shape"])
        mesh = sim.mesh()
        fn = program.build(mesh)
        (x,) = program.make_inputs(mesh)
        jax.block_until_ready(x)
        operand = int(x.size * x.dtype.itemsize)
        # The peak so far can lie above what is resident now (import-time transients); the
        # growth is taken from what is resident, so those do not hide the call's own memory.
        peak_before, resident = _peak_rss(), _rss()
        y = jax.block_until_ready(fn(x))
        peak = _peak_rss()
        ok = bool(np.array_equal(np.asarray(y), np.asarray(x) + 1))
        del y
        # The host arrays (numpy's allocations) of a warm call at its peak: not RSS, which the
        # allocator's reuse makes noisy, but the simulator's own copies, counted exactly.
        tracemalloc.start()
        jax.block_until_ready(fn(x))
        arrays = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    _report(
        result=True,
        operand_bytes=operand,
        baseline_bytes=peak_before if resident is None else resident,
        peak_before_bytes=peak_before,
        peak_bytes=peak,
        warm_array_bytes=arrays,
        correct=ok,
    )


# --------------------------------------------------------------------------------------------
# The parent: runs children, builds the tables and the chart.
# --------------------------------------------------------------------------------------------


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``spec`` in a fresh process (killed after ``timeout`` s); its ``result`` line, or
    ``{"status": "timeout" | "crash", "detail": ...}``. Progress lines go to stderr."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            os.killpg(proc.pid, signal.SIGKILL)

        killer = threading.Timer(timeout, kill)
        killer.start()
        result: dict[str, Any] | None = None
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if not line.startswith("BENCH "):
                    continue
                event = json.loads(line[len("BENCH ") :])
                if "progress" in event:
                    print(f"    {event['progress']}", file=sys.stderr, flush=True)
                elif event.get("result"):
                    result = event
            proc.wait()
        finally:
            killer.cancel()
        err.seek(0)
        tail = (err.read().strip().splitlines() or ["no output"])[-1][:200]
    if result is not None:
        return {"status": "ok", **result}
    if expired.is_set():
        return {"status": "timeout", "detail": f"no result in {timeout:g} s"}
    return {"status": "crash", "detail": f"exit {proc.returncode}: {tail}"}


def dmas(counts: dict[str, int]) -> int:
    """DMA starts plus pipeline block copies (each a DMA on the chip)."""
    return sum(v for k, v in counts.items() if k == "dma_start" or k.endswith(" block)"))


def grid_steps(kernel: str, n: int) -> int:
    """add_one: its emit_pipeline's (8, 128) blocks; matmul: its (n/128)^3 grid points."""
    if kernel == "add_one":
        return (n // ADD_ONE_BLOCK[0]) * (n // ADD_ONE_BLOCK[1])
    return (n // MATMUL_BLOCK) ** 3


def cost_row(kernel: str, n: int, fast: bool, r: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"kernel": kernel, "n": n, "fast_path": fast, "status": r["status"]}
    if r["status"] != "ok":
        return {**row, "detail": r["detail"]}
    warm = min(r["times"])
    counts: dict[str, int] = r["counts"]
    callbacks = sum(counts.values())
    steps = grid_steps(kernel, n)
    n_dma = dmas(counts)
    inside = sum(v for k, v in r["seconds"].items() if k not in CONTAINERS)
    row.update(
        warm_s=warm,
        jnp_s=min(r["jnp_times"]),
        cold_s=r["cold_s"],
        grid_steps=steps,
        callbacks=callbacks,
        callbacks_per_step=callbacks / steps,
        dmas=n_dma,
        us_per_callback=warm / callbacks * 1e6 if callbacks else None,
        us_per_dma=warm / n_dma * 1e6 if n_dma else None,
        us_inside_per_callback=inside / callbacks * 1e6 if callbacks else None,
        counted_s=r["counted_s"],
        inside_share=inside / r["counted_s"],
        counts=counts,
        max_abs_err=r["max_abs_err"],
        paths=r["paths"],
    )
    return row


def scaling_row(kernel: str, n: int, fast: bool, r: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"kernel": kernel, "n": n, "fast_path": fast, "status": r["status"]}
    if r["status"] != "ok":
        return {**row, "detail": r["detail"]}
    warm = min(r["times"])
    jnp_s = min(r["jnp_times"])
    return {
        **row,
        "warm_s": warm,
        "jnp_s": jnp_s,
        "ratio": warm / jnp_s,
        "callbacks": sum(r["counts"].values()),
        "max_abs_err": r["max_abs_err"],
    }


def memory_row(r: dict[str, Any], small: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    """Peak RSS over the baseline as a multiple of the operand; beside it what the small
    operand's run took (tracing and compiling the same program, next to no data) and the host
    bytes per further operand byte (from the large operand's run)."""
    if r["status"] != "ok":
        return r

    def grew(run: dict[str, Any]) -> int | None:
        return run["peak_bytes"] - run["baseline_bytes"] if run["status"] == "ok" else None

    operand, own, large_grew = (
        r["operand_bytes"],
        r["peak_bytes"] - r["baseline_bytes"],
        grew(large),
    )
    per_byte = None
    if large_grew is not None:
        per_byte = (large_grew - own) / (large["operand_bytes"] - operand)
    compile_bytes = grew(small)
    return {
        **r,
        "multiple": own / operand,
        # what the operand itself costs: the peak less what tracing and compiling take alone
        "operand_multiple": None if compile_bytes is None else (own - compile_bytes) / operand,
        "target": MEMORY_TARGET,
        "compile_bytes": compile_bytes,
        "per_operand_byte": per_byte,
        "small": small,
        "large": large,
    }


def fits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel, interpreted: warm time = fixed + callbacks x marginal cost (least squares
    over the sizes run), so a per-call overhead is told apart from a per-callback one."""
    out = []
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        pts = [
            (r["callbacks"], r["warm_s"])
            for r in rows
            if r["kernel"] == kernel and not r["fast_path"] and r["status"] == "ok"
        ]
        if len(pts) < 2 or len({c for c, _ in pts}) < 2:
            continue
        mx = statistics.fmean(c for c, _ in pts)
        my = statistics.fmean(t for _, t in pts)
        slope = sum((c - mx) * (t - my) for c, t in pts) / sum((c - mx) ** 2 for c, _ in pts)
        out.append(
            {
                "kernel": kernel,
                "points": len(pts),
                "us_per_callback": slope * 1e6,
                "fixed_ms": (my - slope * mx) * 1e3,
            }
        )
    return out


def _path(fast: bool) -> str:
    return "fast path" if fast else "interpreted"


def _ms(s: float | None) -> str:
    from _report import fmt

    return fmt(None if s is None else s * 1e3, ".1f")


def markdown(report: dict[str, Any]) -> list[str]:
    lines = [
        f"# Simulator costs (jax {report['jax']}, {report['machine']}, {report['when']})",
        "",
        f"One simulated {CHIP} device (2 TensorCores); warm = the fastest of {report['reps']} "
        "calls after the first (jax.numpy: of at least 5), which the other load on a shared "
        "machine disturbs least; each row is its own process. Still noisy.",
    ]
    if report["costs"]:  # none with --memory-only
        lines += _timing_lines(report)
    return lines + _memory_lines(report)


def _timing_lines(report: dict[str, Any]) -> list[str]:
    from _report import fmt

    lines = [
        "",
        "## Per-operation costs",
        "",
        "callbacks: interpreter callbacks of one warm call; per step: over add_one's (8, 128) "
        "blocks or matmul's grid points; DMAs: `dma_start` plus pipeline block copies; "
        "per callback / per DMA: warm wall time over those counts (everything the call "
        "spends, charged to them); counted call: the one call run with the counter (its "
        "overhead shows against warm); inside: time measured inside the callbacks (summed over "
        "the cores' threads, which contend for the GIL) per callback, and its share of the "
        "counted call.",
        "",
        "| kernel | size | path | warm | callbacks | steps | per step | DMAs | us / callback "
        "| us / DMA | counted call | us inside / callback | inside share | by callback |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["costs"]:
        head = f"| {r['kernel']} | {r['n']}x{r['n']} | {_path(r['fast_path'])} "
        if r["status"] != "ok":
            lines.append(head + f"| {r['status'].upper()}: {r['detail']} |" + " |" * 12)
            continue
        by = ", ".join(f"{k} {v:,}" for k, v in sorted(r["counts"].items(), key=lambda c: -c[1]))
        lines.append(
            head + f"| {_ms(r['warm_s'])} ms | {fmt(r['callbacks'], ',')} "
            f"| {fmt(r['grid_steps'], ',')} | {fmt(r['callbacks_per_step'])} "
            f"| {fmt(r['dmas'], ',')} | {fmt(r['us_per_callback'], '.1f')} "
            f"| {fmt(r['us_per_dma'], '.1f')} | {_ms(r['counted_s'])} ms "
            f"| {fmt(r['us_inside_per_callback'], '.1f')} "
            f"| {r['inside_share']:.0%} | {by or 'none'} |"
        )
    lines += [
        "",
        "## Time against problem size",
        "",
        "| kernel | size | path | simulator | jax.numpy | ratio | callbacks |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["scaling"]:
        head = f"| {r['kernel']} | {r['n']}x{r['n']} | {_path(r['fast_path'])} "
        if r["status"] != "ok":
            lines.append(head + f"| {r['status'].upper()}: {r['detail']} | | | |")
            continue
        lines.append(
            head + f"| {_ms(r['warm_s'])} ms | {_ms(r['jnp_s'])} ms | {r['ratio']:.1f}x "
            f"| {fmt(r['callbacks'], ',')} |"
        )
    if report["fits"]:
        lines += [
            "",
            "Interpreted, fitted over the sizes above (warm = fixed + callbacks x marginal): "
            + "; ".join(
                f"{f['kernel']} {f['us_per_callback']:.1f} us per callback, "
                + (
                    f"{f['fixed_ms']:.1f} ms fixed per call"
                    if f["fixed_ms"] >= 0
                    else "no fixed cost resolved (the fit's is negative: noise)"
                )
                + f" ({f['points']} sizes)"
                for f in report["fits"]
            )
            + ".",
        ]
    return lines


def _memory_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "## Host memory", ""]
    ok = [m for m in report["memory"] if m["status"] == "ok"]
    for m in report["memory"]:
        if m["status"] != "ok":
            lines.append(f"- {_path(m['fast_path'])}: {m['status'].upper()}: {m['detail']}")
    if not ok:
        return lines
    mib = ok[0]["operand_bytes"] / 2**20
    lines += [
        f"add_one on a {MEMORY_SHAPE[0]}x{MEMORY_SHAPE[1]} float32 operand ({mib:g} MiB), one "
        "call in a fresh process per row: peak RSS (`ru_maxrss`) over the baseline, the RSS "
        "after importing jax and building the input, as a multiple of the operand. Tracing "
        f"and compiling: the same over a {SMALL_SHAPE[0]}x{SMALL_SHAPE[1]} operand. Per "
        f"operand byte: the growth from this operand to a {LARGE_SHAPE[0]}x{LARGE_SHAPE[1]} "
        "one over the bytes added.",
        "",
        "| path | peak RSS over the baseline | of which tracing and compiling | the operand "
        "(peak less compiling) | host bytes per further operand byte | host arrays at a warm "
        "call's peak (`tracemalloc`) | result correct |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in ok:
        compile_cell = (
            m["small"]["status"]
            if m["compile_bytes"] is None
            else f"{m['compile_bytes'] / 2**20:.1f} MiB ({m['compile_bytes'] / 2**20 / mib:.1f}x)"
        )
        per_byte = "-" if m["per_operand_byte"] is None else f"{m['per_operand_byte']:.2f}"
        own = m.get("operand_multiple")
        lines.append(
            f"| {_path(m['fast_path'])} | {m['multiple']:.2f}x ({m['multiple'] * mib:.0f} MiB) "
            f"| {compile_cell} | {'-' if own is None else f'{own:.2f}x'} | {per_byte} "
            f"| {m['warm_array_bytes'] / m['operand_bytes']:.2f}x | {m['correct']} |"
        )
    lines.append("")
    for m in ok:
        own = m.get("operand_multiple")
        verdict = "PASS" if own is not None and own <= MEMORY_TARGET else "FAIL"
        lines.append(
            f"- {verdict} ({_path(m['fast_path'])}): the operand costs at most "
            f"{MEMORY_TARGET:g}x its size in host RSS: " + ("-" if own is None else f"{own:.2f}x")
        )
    return lines


def chart(rows: list[dict[str, Any]], path: Path) -> bool:
    """Simulator time against size per kernel and path, jax.numpy beside it."""
    from _report import line_chart

    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        series: dict[str, list[tuple[float, float]]] = {}
        mine = [r for r in rows if r["kernel"] == kernel and r["status"] == "ok"]
        for fast in (False, True):
            points = [(r["n"], r["warm_s"]) for r in mine if r["fast_path"] == fast]
            if points:
                series[f"simulator, {_path(fast)}"] = points
        jnp = {r["n"]: r["jnp_s"] for r in mine if not r["fast_path"]}
        if jnp:
            series["jax.numpy"] = sorted(jnp.items())
        blocks = "(8, 128) blocks" if kernel == "add_one" else "(128, 128, 128) blocks"
        if series:
            panels[f"{kernel}, n x n float32, {blocks}"] = series
    if not panels:
        return False
    return line_chart(
        path,
        panels,
        xlabel="n",
        ylabel="warm seconds per call (log)",
        title="Simulator time against problem size (1 simulated v5p device)",
    )


def _sizes(text: str | None, default: tuple[int, ...]) -> list[int]:
    return [int(s) for s in text.split(",") if s] if text else list(default)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} only")
    p.add_argument("--sizes", help="add_one sizes n (n x n), comma-separated")
    p.add_argument("--matmul-sizes", help="matmul sizes n (n x n x n), comma-separated")
    p.add_argument("--reps", type=int, default=3, help="warm calls per run")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    p.add_argument("--memory-only", action="store_true", help="the host memory runs only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args, _ = p.parse_known_args(argv)  # nox passes its posargs to every benchmark
    if args.child:
        spec = json.loads(args.child)
        (child_memory if spec["what"] == "memory" else child_run)(spec)
        return 0

    import jax

    add_sizes = _sizes(args.sizes, QUICK_SIZES if args.quick else ADD_ONE_SIZES)
    mm_sizes = _sizes(args.matmul_sizes, QUICK_SIZES if args.quick else MATMUL_SIZES)
    sizes = {"add_one": add_sizes, "matmul": mm_sizes}
    # The costs at their default sizes where those run, else at the largest size run.
    cost_cases = [(k, n if n in sizes[k] else max(sizes[k]), f) for k, n, f in COST_CASES]
    cases = [("add_one", n, fast) for n in add_sizes for fast in (False, True)]
    cases += [("matmul", n, fast) for n in mm_sizes for fast in (False, True)]
    runs: dict[tuple[str, int, bool], dict[str, Any]] = {}
    todo = [] if args.memory_only else list(dict.fromkeys([*cost_cases, *cases]))
    started = time.monotonic()
    for i, (kernel, n, fast) in enumerate(todo, 1):
        print(
            f"[{i}/{len(todo)}] {kernel} {n}x{n} {_path(fast)} "
            f"({time.monotonic() - started:.0f} s so far)",
            file=sys.stderr,
            flush=True,
        )
        spec = {"what": "run", "kernel": kernel, "n": n, "fast_path": fast, "reps": args.reps}
        runs[kernel, n, fast] = run_child(spec, args.timeout)
        r = runs[kernel, n, fast]
        done = f"{min(r['times']):.3f} s warm" if r["status"] == "ok" else ""
        print(f"    {r['status']} {done or r.get('detail', '')}", file=sys.stderr, flush=True)
    memory: dict[bool, dict[str, dict[str, Any]]] = {True: {}, False: {}}
    shapes = (("operand", MEMORY_SHAPE), ("small", SMALL_SHAPE), ("large", LARGE_SHAPE))
    for fast in (True, False):
        for key, shape in shapes:
            print(f"[memory] add_one {shape} {_path(fast)}", file=sys.stderr, flush=True)
            spec = {"what": "memory", "shape": list(shape), "fast_path": fast}
            memory[fast][key] = run_child(spec, args.timeout)

    report: dict[str, Any] = {
        "jax": jax.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "chip": CHIP,
        "reps": args.reps,
        "costs": [cost_row(k, n, f, runs[k, n, f]) for k, n, f in cost_cases if runs],
        "scaling": [scaling_row(k, n, f, runs[k, n, f]) for k, n, f in cases if runs],
        "memory": [
            {**memory_row(m["operand"], m["small"], m["large"]), "fast_path": fast}
            for fast, m in memory.items()
        ],
    }
    report["fits"] = fits(report["scaling"])
    from _report import publish

    stem = f"costs-jax{jax.__version__}"
    publish(args.out, stem, markdown(report), report)
    if chart(report["scaling"], args.out / f"{stem}.png"):
        print(f"chart: {args.out / stem}.png", file=sys.stderr)
    print(f"done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
