"""TensorCore benchmark: libtpu's static cycle estimates for coremesh's ops on every generation.

For each op at benchmark size (at least 8 MiB moved per device) and each chip it reports the
kernel's cycles, XLA's own cycles for the op's XLA reference (``coremesh.tensorcore``'s
``<op>_reference``), the roofline bound from the chip registry and the ratios; on v5p it also
compiles map_blocks and matmul forced onto one of the two TensorCores, to show what megacore
buys. No TPU is needed.

Writes ``tensorcore.md``, ``tensorcore.json`` and ``tensorcore.png`` to ``--out``.

    python benchmarks/bench_tensorcore.py --out bench-results
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import coremesh.tensorcore as tc
from coremesh.core import current_target
from coremesh.testing.aot import Arg, FunctionProgram, Work

sys.path.insert(0, str(Path(__file__).parent))
from _report import chips_of, compared, estimate, fmt, parser, publish

ROWS = P("device", None)
MiB = 1 << 20
#: Targets the issue sets: 2 cores at most this share of 1 core's cycles; kernel vs XLA at most.
MEGACORE_TARGET, XLA_TARGET = 0.6, 1.2


def _one_core() -> tc.TensorCoreMesh:
    return tc.TensorCoreMesh(current_target().chip, 1)


def _program(
    name: str,
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    args: Callable[[int], list[Arg]],
    work: Callable[[int], Work],
) -> FunctionProgram:
    return compared(name, kernel, reference, args, work_fn=work)


def _map(n: int) -> list[Arg]:
    return [Arg((2048 * n, 1024), jnp.float32, ROWS)] * 2


def _map_work(_n: int) -> Work:
    return Work(bytes_accessed=3 * 8 * MiB, flops=2 * 2048 * 1024, peak_dtype="float32")


def _mm(n: int) -> list[Arg]:
    return [Arg((2048 * n, 2048), jnp.bfloat16, ROWS), Arg((2048, 2048), jnp.bfloat16)]


def _mm_work(_n: int) -> Work:
    return Work(bytes_accessed=8 * MiB + 8 * MiB + 16 * MiB, flops=2 * 2048**3)


def _red(n: int) -> list[Arg]:
    return [Arg((4096 * n, 1024), jnp.float32, ROWS)]


def _red_work(_n: int) -> Work:
    return Work(bytes_accessed=16 * MiB, flops=4096 * 1024, peak_dtype="float32")


def _gather(n: int) -> list[Arg]:
    return [Arg((8192, 1024), jnp.float32), Arg((256 * n,), jnp.int32, P("device"))]


def _gather_64(n: int) -> list[Arg]:
    """The same 8 MiB as 32 blocks of 64 rows: libtpu can profile XLA's gather of these on TPU7x
    (of 256 blocks of 8 rows it needs about 24 GB of host memory)."""
    return [Arg((8192, 1024), jnp.float32), Arg((32 * n,), jnp.int32, P("device"))]


def _gather_work(_n: int) -> Work:
    return Work(bytes_accessed=2 * 256 * 8 * 1024 * 4)


def _map_f(x: jax.Array, y: jax.Array) -> jax.Array:
    return x * 2 + y


def _map_ref(x: jax.Array, y: jax.Array) -> jax.Array:
    return tc.map_blocks_reference(_map_f, x, y)


def _copy_bound(x: jax.Array, idx: jax.Array) -> jax.Array:
    """XLA copying, on each device, one contiguous run of the rows a gather of ``idx`` returns.

    The nearest XLA figure where libtpu cannot profile XLA's gather (v5e; 256 small blocks on
    TPU7x). Not a lower bound in libtpu's model: many DMAs estimate below one, so XLA's gather of
    64-row blocks comes in just under it on v6e and TPU7x. The report says so beside it.
    """
    from coremesh.core.sharding import on_devices

    def per_device(x: jax.Array, idx: jax.Array) -> jax.Array:
        rows = idx.shape[0] * 8
        start = jnp.clip(idx[0] * 8, 0, x.shape[0] - rows)
        return jax.lax.dynamic_slice(x, (start, 0), (rows, x.shape[1]))

    out: jax.Array = on_devices(per_device, in_specs=(P(), P("device")), out_specs=ROWS)(x, idx)
    return out


PROGRAMS: dict[str, FunctionProgram] = {
    "map_blocks": _program(
        "map_blocks", lambda x, y: tc.map_blocks(_map_f, x, y), _map_ref, _map, _map_work
    ),
    "map_blocks_1core": _program(
        "map_blocks_1core",
        lambda x, y: tc.map_blocks(_map_f, x, y, mesh=_one_core()),
        _map_ref,
        _map,
        _map_work,
    ),
    "matmul": _program("matmul", tc.matmul, tc.matmul_reference, _mm, _mm_work),
    "matmul_1core": _program(
        "matmul_1core",
        lambda a, b: tc.matmul(a, b, mesh=_one_core()),
        tc.matmul_reference,
        _mm,
        _mm_work,
    ),
    "reduce_rows": _program(
        "reduce_rows",
        lambda x: tc.reduce(x, 0, "sum"),
        lambda x: tc.reduce_reference(x, 0, "sum"),
        _red,
        _red_work,
    ),
    "reduce_columns": _program(
        "reduce_columns",
        lambda x: tc.reduce(x, 1, "max"),
        lambda x: tc.reduce_reference(x, 1, "max"),
        _red,
        _red_work,
    ),
    "gather_blocks": _program(
        "gather_blocks", tc.gather_blocks, tc.gather_blocks_reference, _gather, _gather_work
    ),
    "gather_blocks_64rows": _program(
        "gather_blocks_64rows",
        lambda x, i: tc.gather_blocks(x, i, block_rows=64),
        lambda x, i: tc.gather_blocks_reference(x, i, block_rows=64),
        _gather_64,
        _gather_work,
    ),
    "xla_copy": FunctionProgram(
        name="xla_copy", builder=lambda _m: jax.jit(_copy_bound), args=_gather, work_fn=_gather_work
    ),
}
#: Ops whose XLA version libtpu cannot always profile: PROGRAMS["xla_copy"] is shown beside them.
COPY_BOUNDED = frozenset({"gather_blocks", "gather_blocks_64rows"})


def _row(e: Any, xla: dict[tuple[str, str], Any], bounds: dict[str, Any]) -> dict[str, Any]:
    from coremesh.testing.aot import cycles_to_seconds

    x = xla.get((e.program, e.chip))
    bound = bounds.get(e.chip) if e.program in COPY_BOUNDED else None
    bc = bound.cycles if bound is not None else None
    # Whole programs on both sides: the kernel's includes the XLA ops around it (the psum that
    # combines devices' row sums, reshapes), as XLA's includes its all-reduce.
    kc, xc = e.cycles, (x.cycles if x is not None else None)
    seconds = cycles_to_seconds(kc, e.chip) if kc else None
    # libtpu's static profile charges nothing for XLA's copies into VMEM (its cross-program
    # prefetch, coremesh.testing.aot.hlo); charged: those bytes at HBM bandwidth, both sides.
    k_charged = e.charged_seconds()
    x_charged = x.charged_seconds() if x is not None else None
    # Held to the roofline: neither side may beat the bound both compute the same thing under;
    # the static model can (it does not cap concurrent DMAs, nor charge copies into VMEM).
    floor = e.roofline.bound_s if e.roofline else None
    x_seconds = cycles_to_seconds(xc, e.chip) if xc else None
    held = max(seconds, floor) / max(x_seconds, floor) if seconds and x_seconds and floor else None
    return {
        "program": e.program,
        "chip": e.chip,
        "status": e.status,
        "kernel_cycles": kc,
        "xla_cycles": xc,
        "kernel_vs_xla": (kc / xc) if kc and xc else None,
        "xla_copy_cycles": bc,
        "kernel_vs_xla_copy": (kc / bc) if kc and bc else None,
        "xla_vs_xla_copy": (xc / bc) if xc and bc else None,
        "xla_prefetch_mib": x.prefetch_bytes / MiB if x is not None and xc else None,
        "xla_charged_us": x_charged * 1e6 if x_charged and xc else None,
        "kernel_prefetch_mib": e.prefetch_bytes / MiB,
        "kernel_vs_xla_charged": (k_charged / x_charged) if k_charged and x_charged else None,
        "kernel_vs_xla_held": held,
        "kernel_us": seconds * 1e6 if seconds else None,
        "xla_us": x_seconds * 1e6 if x_seconds else None,
        "roofline_us": e.roofline.bound_s * 1e6 if e.roofline else None,
        "vs_roofline": e.roofline.ratio(seconds) if e.roofline and seconds else None,
        "note": e.note,
        "xla_status": x.status if x is not None else None,
        "xla_note": x.note if x is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    kernels, xla = estimate(
        __file__, PROGRAMS, chips_of(args), devices=4, jobs=args.jobs, title="static cycles"
    )
    bounds = {e.chip: e for e in kernels if e.program == "xla_copy"}
    rows = [_row(e, xla, bounds) for e in kernels if e.program != "xla_copy"]

    by = {(r["program"], r["chip"]): r for r in rows}
    megacore = {}
    for op in ("map_blocks", "matmul"):
        two, one = by.get((op, "v5p")), by.get((f"{op}_1core", "v5p"))
        if two and one and two["kernel_cycles"] and one["kernel_cycles"]:
            megacore[op] = two["kernel_cycles"] / one["kernel_cycles"]

    lines = [
        "# TensorCore ops: libtpu static cycle estimates",
        "",
        "Per device, benchmark sizes (>= 8 MiB moved per device). `kernel/XLA` compares the",
        f"coremesh kernel with XLA's own jnp version (target <= {XLA_TARGET}); `vs roofline` is",
        "the kernel's time over the registry's roofline bound. libtpu's static profile charges",
        "nothing for XLA's copies into VMEM (a cross-program prefetch before the program, or a",
        "copy-start inside it); `prefetch MiB` is what XLA copied in for its version (kernel's in",
        "brackets), and `charged` compares the two with those bytes charged at HBM bandwidth.",
        "`held` compares them with each held to the roofline bound (the model can go below it:",
        "it caps neither concurrent DMAs at HBM bandwidth nor charges copies into VMEM).",
        "`kernel/XLA copy` (gathers only) compares with XLA copying the same bytes as one",
        "contiguous run: the nearest XLA figure where libtpu cannot profile XLA's gather. It is",
        "context, not a target and not a bound (`XLA/copy` in the JSON: XLA's gather of 64-row",
        "blocks estimates just under its copy on v6e and TPU7x).",
        "",
        "| op | chip | kernel cycles | XLA cycles | kernel/XLA | prefetch MiB | charged | held "
        "| kernel/XLA copy | kernel us | roofline us | vs roofline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['chip']} | {fmt(r['kernel_cycles'], ',')} | "
            f"{fmt(r['xla_cycles'], ',')} | {fmt(r['kernel_vs_xla'])} | "
            f"{fmt(r['xla_prefetch_mib'], '.0f')} ({fmt(r['kernel_prefetch_mib'], '.0f')}) | "
            f"{fmt(r['kernel_vs_xla_charged'])} | {fmt(r['kernel_vs_xla_held'])} | "
            f"{fmt(r['kernel_vs_xla_copy'])} | "
            f"{fmt(r['kernel_us'], '.1f')}"
            f" | {fmt(r['roofline_us'], '.1f')} | {fmt(r['vs_roofline'])} |"
        )
    lines += ["", f"## Megacore on v5p (2 cores / 1 core cycles, target <= {MEGACORE_TARGET})", ""]
    lines += [f"- {op}: {ratio:.2f}" for op, ratio in megacore.items()]
    lines += ["", "## Against the targets", "", *_verdicts(rows, megacore)]
    publish(args.out, "tensorcore", lines, {"rows": rows, "megacore_v5p": megacore})
    _chart(rows, args.out / "tensorcore.png")
    return 0


def _verdicts(rows: list[dict[str, Any]], megacore: dict[str, float]) -> list[str]:
    """One line per op and chip that misses a target or cannot be compared, plainly."""
    out = []
    for r in rows:
        if r["program"].endswith("_1core"):
            continue
        where = f"{r['program']} on {r['chip']}"
        ratio, charged, held = (
            r["kernel_vs_xla"],
            r["kernel_vs_xla_charged"],
            r["kernel_vs_xla_held"],
        )
        if r["kernel_cycles"] is None:
            out.append(f"- {where}: no estimate for the kernel ({r['note']})")
        elif r["xla_cycles"] is None:
            why = f" ({r['xla_status']}: {r['xla_note']})" if r["xla_note"] else ""
            copy = r["kernel_vs_xla_copy"]
            tail = f"; against XLA's copy of the same bytes: {copy:.2f}" if copy else ""
            out.append(f"- {where}: XLA's version has no estimate to compare with{why}{tail}")
        elif ratio > XLA_TARGET:
            tail = f"; {charged:.2f} with XLA's uncounted prefetch charged" if charged else ""
            tail += f"; {held:.2f} with both held to the roofline" if held else ""
            out.append(f"- {where}: {ratio:.2f}x XLA, over {XLA_TARGET}{tail}")
    out += [
        f"- megacore {op}: {m:.2f}, over {MEGACORE_TARGET}"
        for op, m in megacore.items()
        if m > MEGACORE_TARGET
    ]
    chips = ", ".join(dict.fromkeys(r["chip"] for r in rows))
    return out or [f"- every op meets both targets on {chips}"]


def _chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["kernel_us"] and r["roofline_us"]]
    if not shown:
        return
    labels = [f"{r['program']}\n{r['chip']}" for r in shown]
    fig, ax = plt.subplots(figsize=(max(8, len(shown) * 0.5), 4.5))
    xs = range(len(shown))
    bars = (
        ("coremesh", "kernel_us", -0.3),
        ("XLA's jnp version", "xla_us", -0.1),
        ("XLA + its uncounted prefetch", "xla_charged_us", 0.1),
        ("roofline bound", "roofline_us", 0.3),
    )
    for label, key, dx in bars:
        ax.bar([x + dx for x in xs], [r[key] or 0 for r in shown], 0.2, label=label)
    ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
    ax.set_ylabel("microseconds (static estimate)")
    ax.set_yscale("log")
    ax.set_title("TensorCore ops: libtpu static estimates (kernel, XLA) vs roofline, per device")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
