"""Benchmark: JAX's shipped matmul and flash_attention on the simulator against ``jax.numpy``.

Each kernel runs warm in one process, on the compiled fast path (``simulate(fast_path=True)``;
the default, ``"auto"``, compiles both at these sizes too) and interpreted
(``fast_path=False``), beside its ``jax.numpy`` version on the same host device; the table gives
each path's time over jnp's, and the path each kernel took (``sim.paths``). Goals (issue 17):
flash_attention within 3x and matmul within 2x of jnp on the fast path.

    python benchmarks/bench_fast_path.py [--out bench-results/] [--reps 5]

Writes ``fast-path-jax<version>.json`` and ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

#: name -> goal (fast path time over jnp's)
GOALS = {"matmul": 2.0, "flash_attention": 3.0}


def _matmul_case() -> tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu import matmul

    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((2048, 2048), dtype=np.float32) for _ in range(2))

    def kernel(a: Any, b: Any) -> Any:
        return matmul.matmul(a, b, block_shape=(512, 512), block_k=256)

    def reference(a: Any, b: Any) -> Any:
        return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)

    return kernel, reference, (x, y)


def _flash_case() -> tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 4, 1024, 128), dtype=np.float32) for _ in range(3))

    def kernel(q: Any, k: Any, v: Any) -> Any:
        return fa.flash_attention(q, k, v, sm_scale=1.0)

    def reference(q: Any, k: Any, v: Any) -> Any:
        hi = jax.lax.Precision.HIGHEST
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=hi)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, axis=-1), v, precision=hi)

    return kernel, reference, (q, k, v)


CASES = {"matmul": _matmul_case, "flash_attention": _flash_case}


def _warm(fn: Callable[..., Any], args: tuple[Any, ...], reps: int) -> tuple[float, Any]:
    """(median seconds of ``reps`` warm calls, the result) after one call that compiles."""
    import jax

    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def measure(name: str, reps: int) -> dict[str, Any]:
    import jax
    import numpy as np

    import coremesh.testing as ct

    kernel, reference, args = CASES[name]()
    row: dict[str, Any] = {"kernel": name, "goal": GOALS[name]}
    for fast in (True, False):
        with ct.simulate("v5p", 1, fast_path=fast) as sim:
            device_args = tuple(jax.device_put(a, sim.devices[0]) for a in args)
            jnp_s, want = _warm(jax.jit(reference), device_args, reps)
            sim_s, got = _warm(jax.jit(kernel), device_args, reps if fast else max(2, reps // 2))
            err = float(np.max(np.abs(np.asarray(got) - np.asarray(want))))
            key = "fast" if fast else "interpreted"
            row[f"{key}_s"], row[f"{key}_jnp_s"] = sim_s, jnp_s
            row[f"{key}_ratio"] = sim_s / jnp_s
            row[f"{key}_max_abs_err"] = err
            row[f"{key}_paths"] = sim.paths
    return row


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# Fast path vs jax.numpy (jax {meta['jax']}, {meta['machine']}, {meta['cpus']} CPUs)",
        "",
        "Warm medians; ratio = simulator time / jnp time in the same process (noisy on a "
        "shared machine).",
        "",
        "| kernel | jnp | fast path | ratio (goal) | interpreted | ratio | fast path took |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        took = "; ".join(f"{k}: {v}" for k, v in r["fast_paths"].items())
        lines.append(
            f"| {r['kernel']} | {r['fast_jnp_s'] * 1e3:.1f} ms | {r['fast_s'] * 1e3:.1f} ms | "
            f"{r['fast_ratio']:.2f}x (<= {r['goal']:g}x) | {r['interpreted_s'] * 1e3:.0f} ms | "
            f"{r['interpreted_ratio']:.1f}x | {took} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--kernels", nargs="*", default=list(CASES), choices=list(CASES))
    opts, _ = parser.parse_known_args()  # nox passes its posargs to every benchmark
    import jax

    rows = [measure(name, opts.reps) for name in opts.kernels]
    meta = {
        "jax": jax.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    text = markdown(rows, meta)
    print(text)
    opts.out.mkdir(parents=True, exist_ok=True)
    # Not Path.with_suffix: it would take a version's last part ("0.12.0.1") for a suffix.
    stem = f"fast-path-jax{jax.__version__}"
    (opts.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (opts.out / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
