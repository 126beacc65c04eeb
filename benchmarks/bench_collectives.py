"""Collectives benchmark: bytes per link against the lower bound, static cycles against XLA's own
collective, and what the bidirectional ring gains over the unidirectional one. No TPU needed.

1. **Bytes.** For every collective x axis x algorithm on a 4-device v5p (2 TensorCores per
   device) and v6e slice: the remote-DMA bytes the kernel program issues per participant,
   counted from its traced Pallas program (every DMA start with a remote device id, at its
   static size), beside the schedule's model (``coremesh.collectives.cost``), the busiest link
   and the lower bound ((n - 1) / n of the data for all-gather, reduce-scatter and all-to-all).
2. **Cycles.** libtpu's static cycle estimate per chip (v5e, v5p, v6e, TPU7x) for the kernels on
   4 MiB per device, beside XLA's own collective (``jax.lax`` under ``shard_map``) on the same
   arrays.
3. **Bidirectional gain.** Unidirectional over bidirectional: in busiest-link bytes (what
   bounds a bandwidth-bound ring) and in static cycles.

Writes ``collectives.md``, ``collectives.json`` and ``collectives.png`` to ``--out``.

    python benchmarks/bench_collectives.py --out bench-results
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from coremesh.collectives import cost
from coremesh.collectives.reference import collective, lax_equivalent, shift
from coremesh.testing.aot import Arg, FunctionProgram

sys.path.insert(0, str(Path(__file__).parent))
from _report import chips_of, fmt, parser, publish

MiB = 1 << 20
CHIPS = ("v5e", "v5p", "v6e", "TPU7x")
DEVICES = 4
#: Per-device operand: 1024 x 1024 float32 = 4 MiB.
ROWS, COLS = 1024, 1024
AXES: dict[str, Any] = {"device": "device", "core": "core", "hier": ("device", "core")}
ALGORITHMS = {
    "device": ("ring", "bidirectional"),
    "core": ("ring", "bidirectional"),
    "hier": ("ring", "bidirectional", "hierarchical"),
}


def _kw(op: str, n: int) -> dict[str, Any]:
    if op in ("all_gather", "reduce_scatter"):
        return {"tiled": True}
    if op == "all_to_all":
        return {"split_axis": 0, "concat_axis": 1, "tiled": True}
    if op == "ppermute":
        return {"perm": shift(n)}
    return {}


def _participants(kind: str, cores: int) -> int:
    return {"device": DEVICES, "core": cores, "hier": DEVICES * cores}[kind]


# ------------------------------------------------------------------------------- bytes


def remote_dma_bytes(jaxpr: Any) -> int:
    """Bytes of every DMA started with a remote device id in ``jaxpr`` (branches included)."""
    total = 0

    def walk(j: Any) -> None:
        nonlocal total
        for eqn in j.eqns:
            if eqn.primitive.name == "dma_start":
                src, _dst, _sem, _src_sem, device_id = eqn.params["tree"].unflatten(eqn.invars)
                if device_id is not None:
                    transforms = getattr(src, "transforms", ())
                    ref = getattr(src, "ref", src)
                    shape = transforms[-1].get_indexer_shape() if transforms else ref.aval.shape
                    total += math.prod(shape) * jnp.dtype(ref.aval.dtype).itemsize
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple | list) else (value,):
                    inner = getattr(item, "jaxpr", item)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr)
    return total


def traffic_rows(chip: str) -> list[dict[str, Any]]:
    """Measured and modelled bytes per participant for every case on ``chip``."""
    from coremesh.testing.aot import CompileTarget

    target = CompileTarget.for_chip(chip, devices=DEVICES)
    cores = target.cores_per_device
    rows = []
    x = jax.ShapeDtypeStruct((DEVICES * ROWS, COLS), jnp.float32)
    device_bytes = ROWS * COLS * 4
    for kind, algos in ALGORITHMS.items():
        n = _participants(kind, cores)
        if n == 1:
            continue
        per_participant = device_bytes // (1 if kind == "device" else cores)
        cases = [(op, a) for op in ("all_gather", "reduce_scatter", "all_reduce") for a in algos]
        cases += [("all_to_all", "direct"), ("ppermute", "direct")]
        for op, algo in cases:
            fn = collective(op, AXES[kind], algorithm=algo, **_kw(op, n))
            with target.activate():
                measured = remote_dma_bytes(jax.jit(fn).trace(x).jaxpr.jaxpr)
            # The model's chunk: one participant's share of the data.
            chunk = per_participant if op in ("all_gather", "ppermute") else per_participant // n
            t = cost.traffic(
                op,
                algo,
                n,
                chunk,
                devices=DEVICES,
                cores=cores,
                axis_kind={"hier": "hierarchical"}.get(kind, kind),
                perm=_kw(op, n).get("perm", ()),
            )
            rows.append(
                {
                    "chip": chip,
                    "op": op,
                    "axis": kind,
                    "algorithm": algo,
                    "participants": n,
                    "data_MiB": t.data_bytes / MiB,
                    "measured_MiB": measured / MiB,
                    "model_MiB": t.sent / MiB,
                    "busiest_link_MiB": t.busiest_link / MiB,
                    "lower_bound_MiB": t.lower_bound / MiB,
                    "sent_over_bound": t.sent / t.lower_bound if t.lower_bound else None,
                    "steps": t.steps,
                    "ici_MiB_per_device": t.ici_bytes / MiB,
                    "core_link_MiB_per_device": t.core_link_bytes / MiB,
                }
            )
    return rows


# ------------------------------------------------------------------------------ cycles


def _args(_n: int) -> list[Arg]:
    return [Arg((DEVICES * ROWS, COLS), jnp.float32, P("device"))]


def _xla_program(op: str, n: int, kw: dict[str, Any]) -> Any:
    def build(mesh: Any) -> Any:
        fn = lax_equivalent(op, "device", size=n, **kw)
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("device"), out_specs=P("device")))

    return FunctionProgram(name=f"{op}[xla]", builder=build, args=_args)


def _program(op: str, kind: str, algo: str) -> FunctionProgram:
    # Device counts are the same on every chip; the core count is read at build time.
    def build(_mesh: Any) -> Any:
        from coremesh.core import current_target

        n = _participants(kind, current_target().cores_per_device)
        return jax.jit(collective(op, AXES[kind], algorithm=algo, **_kw(op, n)))

    return FunctionProgram(
        name=f"{op}/{kind}/{algo}",
        builder=build,
        args=_args,
        xla_reference=_xla_program(op, DEVICES, _kw(op, DEVICES)),
    )


PROGRAMS: dict[str, FunctionProgram] = {}
for _op in ("all_gather", "reduce_scatter", "all_reduce"):
    for _algo in ("ring", "bidirectional"):
        PROGRAMS[f"{_op}/device/{_algo}"] = _program(_op, "device", _algo)
for _op in ("all_to_all", "ppermute"):
    PROGRAMS[f"{_op}/device/direct"] = _program(_op, "device", "direct")
#: Over every core of every device (v5p has 2 per device); XLA's reference is the device-axis
#: collective of the same arrays.
HIERARCHICAL: dict[str, FunctionProgram] = {
    f"{op}/hier/{algo}": _program(op, "hier", algo)
    for op in ("all_gather", "all_reduce")
    for algo in ("ring", "bidirectional", "hierarchical")
}


def cycle_rows(chips: list[str], jobs: int) -> list[dict[str, Any]]:
    from coremesh.testing.aot import cycles_to_seconds, profile

    here = Path(__file__).resolve()
    refs = [f"{here}:PROGRAMS[{name}]" for name in PROGRAMS]

    def progress(p: Any) -> None:
        if p.result is not None:
            print(f"  [{p.index}/{p.total}] {p.chip} {p.program}", file=sys.stderr, flush=True)

    estimates = profile(refs, chips, devices=DEVICES, jobs=jobs, progress=progress)
    if "v5p" in chips:
        hier = [f"{here}:HIERARCHICAL[{name}]" for name in HIERARCHICAL]
        estimates += profile(hier, ["v5p"], devices=DEVICES, jobs=1, progress=progress)
    # libtpu's static profile aborts the whole process on some kernels (v5e); after two aborts a
    # chip's remaining programs are compiled without it. Give each such program its own process.
    retry = [
        e
        for e in estimates
        if e.variant == "kernel" and e.kernel_cycles is None and e.note and "aborted" in e.note
    ]
    for e in retry:
        group = "HIERARCHICAL" if "/hier/" in e.program else "PROGRAMS"
        again = profile([f"{here}:{group}[{e.program}]"], [e.chip], devices=DEVICES, jobs=1)
        estimates = [r for r in estimates if (r.program, r.chip) != (e.program, e.chip)] + again
    xla = {(e.program, e.chip): e for e in estimates if e.variant == "xla"}
    order = {c: i for i, c in enumerate(CHIPS)}
    estimates.sort(key=lambda e: (order.get(e.chip, 99), e.program))
    rows = []
    for e in estimates:
        if e.variant != "kernel":
            continue
        x = xla.get((e.program, e.chip))
        kernel, total, xc = e.kernel_cycles, e.cycles, (x.cycles if x else None)
        rows.append(
            {
                "program": e.program,
                "chip": e.chip,
                "status": e.status,
                "kernel_cycles": kernel,
                "program_cycles": total,
                "xla_cycles": xc,
                "kernel_vs_xla": kernel / xc if kernel and xc else None,
                "kernel_us": cycles_to_seconds(kernel, e.chip) * 1e6 if kernel else None,
                "xla_us": cycles_to_seconds(xc, e.chip) * 1e6 if xc else None,
                "note": "; ".join(
                    f"{who}: {n}" for who, n in (("kernel", e.note), ("XLA", x and x.note)) if n
                ),
            }
        )
    return rows


def gains(traffic: list[dict[str, Any]], cycles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unidirectional over bidirectional, in busiest-link bytes and in static cycles."""
    out = []
    link = {(r["chip"], r["op"], r["axis"], r["algorithm"]): r for r in traffic}
    cyc = {(r["chip"], r["program"]): r for r in cycles}
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        for chip in CHIPS:
            uni, bi = (
                link.get((chip, op, "device", "ring")),
                link.get((chip, op, "device", "bidirectional")),
            )
            cu = cyc.get((chip, f"{op}/device/ring"), {}).get("kernel_cycles")
            cb = cyc.get((chip, f"{op}/device/bidirectional"), {}).get("kernel_cycles")
            if uni is None and cu is None:
                continue
            out.append(
                {
                    "op": op,
                    "chip": chip,
                    "link_bytes_gain": (
                        uni["busiest_link_MiB"] / bi["busiest_link_MiB"] if uni and bi else None
                    ),
                    "cycles_gain": cu / cb if cu and cb else None,
                }
            )
    return out


# ------------------------------------------------------------------------------ report


def report(
    traffic: list[dict[str, Any]], cycles: list[dict[str, Any]], gain: list[dict[str, Any]]
) -> str:
    lines = [
        "# Collectives: bytes per link, static cycles, bidirectional gain",
        "",
        f"4 devices; {ROWS}x{COLS} float32 (4 MiB) per device. Bytes are per participant (a",
        "device for the device axis, a core for the core axes); `measured` is what the kernel",
        "program issues (remote DMA starts at their static sizes), `model` the schedule's",
        "count, `bound` the lower bound any algorithm must move to each participant.",
        "",
        "## Bytes per participant",
        "",
        "| chip | op | axis | algorithm | n | measured MiB | model MiB | busiest link MiB "
        "| bound MiB | sent/bound | steps | ICI MiB/device | core links MiB/device |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in traffic:
        lines.append(
            f"| {r['chip']} | {r['op']} | {r['axis']} | {r['algorithm']} | {r['participants']} "
            f"| {fmt(r['measured_MiB'])} | {fmt(r['model_MiB'])} "
            f"| {fmt(r['busiest_link_MiB'])} | {fmt(r['lower_bound_MiB'])} "
            f"| {fmt(r['sent_over_bound'])} | {r['steps']} "
            f"| {fmt(r['ici_MiB_per_device'])} | {fmt(r['core_link_MiB_per_device'])} |"
        )
    lines += [
        "",
        "## libtpu static cycles per device, kernel vs XLA's own collective",
        "",
        "`kernel` sums the Pallas kernels' estimates; `program` adds the XLA glue around them",
        "(reshapes); `XLA` is jax.lax on the same arrays over the device axis.",
        "",
        "| program | chip | kernel cycles | program cycles | XLA cycles | kernel/XLA | kernel us "
        "| XLA us | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cycles:
        lines.append(
            f"| {r['program']} | {r['chip']} | {fmt(r['kernel_cycles'], ',')} "
            f"| {fmt(r['program_cycles'], ',')} | {fmt(r['xla_cycles'], ',')} "
            f"| {fmt(r['kernel_vs_xla'])} | {fmt(r['kernel_us'], '.1f')} "
            f"| {fmt(r['xla_us'], '.1f')} | {r['note'] or ''} |"
        )
    lines += [
        "",
        "## Bidirectional ring gain (unidirectional / bidirectional, device axis)",
        "",
        "| op | chip | busiest-link bytes | static cycles |",
        "|---|---|---|---|",
    ]
    for g in gain:
        lines.append(
            f"| {g['op']} | {g['chip']} | {fmt(g['link_bytes_gain'])} | {fmt(g['cycles_gain'])} |"
        )
    return "\n".join(lines) + "\n"


def chart(traffic: list[dict[str, Any]], cycles: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    shown = [r for r in traffic if r["chip"] == "v5p"]
    xs = range(len(shown))
    left.bar(
        [x - 0.2 for x in xs], [r["busiest_link_MiB"] for r in shown], 0.4, label="busiest link"
    )
    left.bar(
        [x + 0.2 for x in xs],
        [r["lower_bound_MiB"] for r in shown],
        0.4,
        label="lower bound (per participant)",
    )
    left.set_xticks(
        list(xs),
        [f"{r['op']}\n{r['axis']} {r['algorithm']}" for r in shown],
        rotation=90,
        fontsize=6,
    )
    left.set_ylabel("MiB")
    left.set_title("v5p 4x2: bytes on the busiest link vs the lower bound")
    left.legend()
    timed = [r for r in cycles if r["kernel_us"] and r["xla_us"]]
    xs = range(len(timed))
    right.bar([x - 0.2 for x in xs], [r["kernel_us"] for r in timed], 0.4, label="coremesh")
    right.bar([x + 0.2 for x in xs], [r["xla_us"] for r in timed], 0.4, label="XLA collective")
    right.set_xticks(
        list(xs), [f"{r['program']}\n{r['chip']}" for r in timed], rotation=90, fontsize=6
    )
    right.set_ylabel("microseconds (libtpu static estimate)")
    right.set_yscale("log")
    right.set_title("static cycles per device, 4 MiB per device")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, CHIPS)
    p.add_argument("--no-cycles", action="store_true", help="bytes only (fast)")
    args = p.parse_args(argv)
    print("bytes per participant (traced kernels)", file=sys.stderr)
    traffic = [r for chip in ("v5p", "v6e") for r in traffic_rows(chip)]
    cycles = [] if args.no_cycles else cycle_rows(chips_of(args), args.jobs)
    gain = gains(traffic, cycles)
    data = {"bytes": traffic, "cycles": cycles, "bidirectional_gain": gain}
    publish(args.out, "collectives", report(traffic, cycles, gain).rstrip("\n").split("\n"), data)
    chart(traffic, cycles, args.out / "collectives.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
