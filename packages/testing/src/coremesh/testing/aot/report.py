"""Tables (markdown or plain text) and JSON for compile matrices and cycle estimates."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from coremesh.testing.aot.compile import DEFAULT_CHIPS, CompileResult
from coremesh.testing.aot.cycles import CycleEstimate

Format = Literal["markdown", "plain"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], fmt: Format) -> str:
    """A table with a header row, as GitHub markdown or aligned plain text."""
    cells = [list(headers)] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if fmt == "markdown":

        def row(r: Sequence[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([row(cells[0]), rule, *(row(r) for r in cells[1:])])
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells[1:]
    ]
    return "\n".join(lines)


def chips_in(results: Sequence[Any]) -> list[str]:
    """The chips of ``results``, oldest generation first."""
    seen = list(dict.fromkeys(r.chip for r in results))
    order = {c: i for i, c in enumerate(DEFAULT_CHIPS)}
    return sorted(seen, key=lambda c: (order.get(c, 99), c))


def _cell(r: CompileResult) -> str:
    if r.status == "ok":
        cell = f"ok {r.seconds:.2f}s"
    elif r.status == "unsupported":
        cell = "n/a"
    else:
        cell = f"FAIL {getattr(r.error, 'kind', None) or type(r.error).__name__}"
    return cell if r.as_expected else f"{cell} (!)"


def matrix_table(results: Sequence[CompileResult], fmt: Format = "markdown") -> str:
    """Programs down, chips across: ``ok 0.12s``, ``n/a`` (the chip lacks what it needs) or
    ``FAIL <kind>``; ``(!)`` marks an outcome other than the expected one. Errors follow."""
    chips = chips_in(results)
    by = {(r.program, r.chip): r for r in results}
    programs = list(dict.fromkeys(r.program for r in results))
    rows = [[p] + [_cell(by[p, c]) if (p, c) in by else "" for c in chips] for p in programs]
    out = [format_table(["program", *chips], rows, fmt)]
    problems = [r for r in results if r.error is not None]
    # Expected n/a cells (a chip without what the program needs) say the same thing for every
    # program and chip they hit: one line per reason.
    skipped = [r for r in problems if r.status == "unsupported" and r.as_expected]
    problems = [r for r in problems if r not in skipped]
    bullet = "- " if fmt == "markdown" else "* "
    if skipped:
        out.append("")
        reasons: dict[tuple[str, str], list[CompileResult]] = {}
        for r in skipped:
            assert r.error is not None
            reasons.setdefault((r.error.rule or r.error.what, r.error.fix or ""), []).append(r)
        for (rule, fix), group in reasons.items():
            programs_hit = ", ".join(dict.fromkeys(r.program for r in group))
            chips_hit = ", ".join(dict.fromkeys(r.chip for r in group))
            out.append(f"{bullet}n/a ({rule}): {programs_hit} on {chips_hit}")
            if fix:
                out[-1] += f"\n    fix: {fix}"
    if problems:
        out.append("")
        for r in problems:
            e = r.error
            assert e is not None
            head = f"{bullet}{r.program} on {r.chip} ({r.topology}, {r.mode}): {e.what}"
            if e.fix:
                head += f"\n    fix: {e.fix}"
            msg = getattr(e, "headline", None)
            if msg:
                head += f"\n    compiler: {msg}"
            out.append(head)
    return "\n".join(out)


def _us(seconds: float | None) -> str:
    """Microseconds with 3 significant digits (1,234 / 12.3 / 0.0123)."""
    if seconds is None:
        return ""
    us = seconds * 1e6
    return f"{us:,.0f}" if us >= 100 else f"{us:.3g}"


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:,.2f}"


def _int(x: int | None) -> str:
    return "" if x is None else f"{x:,}"


_SHORT = {"no_estimate": "no estimate", "unsupported": "n/a", "timeout": "timeout"}


def _cycles_cell(r: CycleEstimate | None) -> str:
    if r is None:
        return ""
    if r.cycles is not None:
        return _int(r.cycles)
    return _SHORT.get(r.status, "FAIL")


def cycles_table(
    results: Sequence[CycleEstimate],
    fmt: Format = "markdown",
    *,
    no_xla_reference: Sequence[str] = (),
) -> str:
    """One row per program and chip: the kernel's cycles and time, XLA's, the roofline bound and
    the ratios; notes (no estimate, aborts, errors, and the ``no_xla_reference`` programs, whose
    XLA cells are empty for want of one) follow."""
    chips = chips_in(results)
    order = {c: i for i, c in enumerate(chips)}
    kernel = {(r.program, r.chip): r for r in results if r.variant == "kernel"}
    xla = {(r.program, r.chip): r for r in results if r.variant == "xla"}
    keys = sorted(
        dict.fromkeys((r.program, r.chip) for r in results),
        key=lambda k: (list(dict.fromkeys(r.program for r in results)).index(k[0]), order[k[1]]),
    )
    headers = [
        "program",
        "chip",
        "kernel cycles",
        "kernel us",
        "XLA cycles",
        "XLA us",
        "roofline us",
        "bound",
        "kernel/roofline",
        "XLA/roofline",
        "kernel/XLA",
    ]
    rows = []
    notes = []
    for key in keys:
        k, x = kernel.get(key), xla.get(key)
        any_r = k or x
        assert any_r is not None
        roof = (k.roofline if k else None) or (x.roofline if x else None)
        k_s = k.seconds if k else None
        x_s = x.seconds if x else None
        rows.append(
            [
                key[0],
                key[1],
                _cycles_cell(k),
                _us(k_s),
                _cycles_cell(x),
                _us(x_s),
                _us(roof.bound_s if roof else None),
                roof.limiter if roof else "",
                _ratio(k.ratio) if k else "",
                _ratio(x.ratio) if x else "",
                _ratio(k_s / x_s) if k_s and x_s else "",
            ]
        )
        for r in (k, x):
            if r is None:
                continue
            text = r.note
            if r.error:
                text = f"{r.error.get('what')} (fix: {r.error.get('fix')})"
            if text or r.status not in ("ok",):
                label = f"{r.program}{' (XLA)' if r.variant == 'xla' else ''} on {r.chip}"
                bundles = ""
                if r.status != "ok" and r.bundles is not None:
                    bundles = f"; TensorCore bundles {r.bundles:,}"
                notes.append(f"- {label}: {r.status}: {text or ''}{bundles}")
    out = [format_table(headers, rows, fmt)]
    made_by = sorted({(r.libtpu_version, r.jax_version) for r in results if r.libtpu_version})
    if made_by:
        runs = "; ".join(f"libtpu {lt} with jax {jx}" for lt, jx in made_by)
        out += ["", f"Estimated by {runs}."]
    notes += [
        f"- {name}: no XLA reference, so no XLA figures (give the program an xla_reference: the "
        "same computation in plain jax.numpy)"
        for name in dict.fromkeys(no_xla_reference)
    ]
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def _run_key(record: Mapping[str, Any]) -> tuple[str, str]:
    return (str(record.get("jax")), str(record.get("libtpu")))


def _version_order(key: tuple[str, str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    from coremesh.testing.aot.versions import parse

    return (parse(key[0]), parse(key[1]))


def lines_table(
    records: Sequence[Mapping[str, Any]], fmt: Format = "markdown", *, variant: str = "kernel"
) -> str:
    """How the estimates moved between runs on different jax lines (or libtpu releases).

    ``records`` are ``CycleEstimate.to_json()`` dicts from any number of runs, each carrying its
    ``jax`` and ``libtpu``. One row per program and chip (of ``variant``), one column of cycles per
    (jax, libtpu), oldest first, and the change between the oldest and the newest run that have
    an estimate. Cells without an estimate show the status.
    """
    runs = sorted({_run_key(r) for r in records}, key=_version_order)
    chosen = [r for r in records if r.get("variant", "kernel") == variant]
    by = {(r["program"], r["chip"], _run_key(r)): r for r in chosen}
    order = {c: i for i, c in enumerate(DEFAULT_CHIPS)}
    programs = list(dict.fromkeys(r["program"] for r in chosen))
    keys = sorted(
        dict.fromkeys((r["program"], r["chip"]) for r in chosen),
        key=lambda k: (programs.index(k[0]), order.get(k[1], 99), k[1]),
    )
    rows = []
    for program, chip in keys:
        cells: list[str] = []
        known: list[int] = []
        for run in runs:
            r = by.get((program, chip, run))
            if r is None:
                cells.append("")
            elif r.get("cycles") is not None:
                cells.append(f"{int(r['cycles']):,}")
                known.append(int(r["cycles"]))
            else:
                cells.append(_SHORT.get(str(r.get("status")), str(r.get("status"))))
        change = ""
        if len(known) >= 2 and known[0]:
            change = f"{(known[-1] - known[0]) / known[0]:+.2%}"
        rows.append([program, chip, *cells, change])
    headers = ["program", "chip", *(f"jax {j} / libtpu {t}" for j, t in runs), "oldest -> newest"]
    return format_table(headers, rows, fmt)


def to_json(
    compile_results: Sequence[CompileResult] = (),
    cycle_results: Sequence[CycleEstimate] = (),
    **extra: Any,
) -> str:
    """Both kinds of results (and any ``extra`` fields) as one JSON document."""
    doc: dict[str, Any] = {"versions": versions()}
    doc.update(extra)
    if compile_results:
        doc["compile"] = [r.to_json() for r in compile_results]
    if cycle_results:
        doc["cycles"] = [r.to_json() for r in cycle_results]
    return json.dumps(doc, indent=2, default=str)


def versions() -> Mapping[str, str | None]:
    """Versions of what produced the numbers (estimates shift between libtpu releases)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("jax", "jaxlib", "libtpu", "coremesh-testing", "coremesh-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out
