"""The ``coremesh`` command.

    coremesh info                                   the chip registry as a table
    coremesh check MODULE:NAME [...]                compile for every TPU generation (no TPU needed)
    coremesh profile MODULE:NAME [...]              libtpu's static cycle estimates vs the roofline
    coremesh aot-all                                check every program the packages ship
    coremesh demo                                   the core_map guide's programs, end to end
    coremesh upstream --jax-tests PATH [...]        JAX's own Pallas TPU tests on the simulator
    coremesh upstream --jax-tests PATH --guides     JAX's TPU guides, cell by cell, on the simulator

``MODULE:NAME`` names a module-level object (``package.module:NAME``, ``path/to/file.py:NAME``,
``...:NAME[key]`` for one entry of a dict). The object may be:

* a program: anything with ``build(mesh)``, ``arg_specs(num_devices)`` and ``in_specs()``, like the
  guide's ``coremesh.testing.guide:PROGRAMS[add_one]`` (see ``coremesh.testing.aot.program``);
* a dict or list of programs (``coremesh.testing.guide:PROGRAMS`` checks all five);
* a ``(fn, args)`` pair, where ``args`` are ``coremesh.testing.aot.Arg(shape, dtype, spec)`` or
  ``jax.ShapeDtypeStruct`` and ``fn``, jitted or not, takes its mesh from context (``jax.shard_map``
  without ``mesh=``, a Pallas kernel inside it); each chip after the first compiles in a fresh
  process, since such a shard_map keeps the first mesh it is traced under;
* a function with no required parameters returning any of these.

Results go to stdout (a table, or JSON with ``--json -``); progress goes to stderr. ``check`` exits
with 1 when a program does not compile where it should (or compiles where it should not), 2 on a
usage error (a missing file, module or attribute). ``profile`` names the programs that have no
``xla_reference`` to compare with. ``aot-all`` checks the guide's programs and every program
registered in the ``coremesh.programs`` entry-point group.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from coremesh.core.chips import CHIPS, get_chip
from coremesh.core.errors import CoremeshError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

REF_HELP = """\
MODULE:NAME names a module-level object: package.module:NAME, path/to/file.py:NAME,
or ...:NAME[key] for one entry of a dict. The object may be
  - a program (build(mesh), arg_specs(num_devices), in_specs()), e.g.
    coremesh.testing.guide:PROGRAMS[add_one];
  - a dict or list of programs, e.g. coremesh.testing.guide:PROGRAMS;
  - a (fn, args) pair: args are coremesh.testing.aot.Arg(shape, dtype, spec) or
    jax.ShapeDtypeStruct, and fn, jitted or not, takes its mesh from context
    (jax.shard_map without mesh=);
  - a function with no required parameters returning any of these.
"""


def _chips(text: str) -> list[str]:
    if text.strip().lower() == "all":
        return list(CHIPS)
    try:
        return [get_chip(c).name for c in text.split(",") if c.strip()]
    except CoremeshError as e:
        raise argparse.ArgumentTypeError(f"{e.what}; use {', '.join(CHIPS)} or all") from e


class _Parser(argparse.ArgumentParser):
    """argparse with coremesh's usage errors: two lines at most on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n(see '{self.prog} --help')\n")


def usage_error(command: str, err: CoremeshError) -> str:
    """A coremesh error as a usage error: what was wrong, then the fix; two lines at most."""
    what = err.what if err.chip is None else f"[{err.chip}] {err.what}"
    head = f"coremesh {command}: {' '.join(what.split())}"
    return head + (f"\n  fix: {' '.join(err.fix.split())}" if err.fix else "") + "\n"


def _parser() -> argparse.ArgumentParser:
    from coremesh.testing import __version__

    p = _Parser(
        prog="coremesh",
        description="Verify core-level Pallas TPU programs without a TPU.",
        epilog="MODULE:NAME forms: see 'coremesh check --help'.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="the chip registry as a table")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def target_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("refs", nargs="+", metavar="MODULE:NAME", help="programs to compile")
        sp.add_argument(
            "--chips",
            type=_chips,
            default=None,
            help="comma-separated chips (v4,v5e,v5p,v6e,TPU7x or 'all'; default all)",
        )
        sp.add_argument(
            "--devices", type=int, default=None, help="JAX devices per topology (default 4)"
        )
        sp.add_argument(
            "--mode",
            choices=("megacore", "split"),
            default=None,
            help="core mode where the chip has both (v4, v5p); default: the chip's default",
        )
        sp.add_argument(
            "--json",
            metavar="PATH",
            default=None,
            help="write JSON results to PATH ('-': to stdout instead of the table)",
        )
        sp.add_argument(
            "--format", choices=("plain", "markdown"), default="plain", help="table format"
        )
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    check = sub.add_parser(
        "check",
        help="compile programs for every TPU generation",
        description="Compile programs for each chip with libtpu (no TPU needed) and show the "
        "matrix. Exit status 1 when a program does not compile where it should.\n\n" + REF_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target_args(check)
    check.add_argument(
        "--no-validate",
        action="store_true",
        help="skip coremesh's own checks and let the compiler judge",
    )

    prof = sub.add_parser(
        "profile",
        help="static cycle estimates against the roofline",
        description="Estimate cycles per kernel and chip with libtpu's static profile (in child "
        "processes), next to the roofline bound from the chip registry and, where the program "
        "has an xla_reference, XLA's own version.\n\n" + REF_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target_args(prof)
    prof.add_argument("--no-xla", action="store_true", help="skip the programs' XLA versions")
    prof.add_argument("--jobs", type=int, default=1, help="chips profiled at once (default 1)")
    prof.add_argument(
        "--timeout", type=float, default=180.0, help="seconds per program compile (default 180)"
    )

    every = sub.add_parser(
        "aot-all",
        help="compile every program the installed coremesh packages ship, for every chip",
        description="Compile the core_map guide's programs and every program registered in the "
        f"'{PROGRAMS_GROUP}' entry-point group (name = 'module:ATTR') for every chip. Exit "
        "status 1 when one does not compile where it should, or (with --baseline) no longer "
        "compiles where it did.",
    )
    for action in check._actions:  # same options as check, without the references
        if action.dest not in ("help", "refs"):
            every._add_action(action)
    every.add_argument(
        "--baseline",
        metavar="PATH",
        default=None,
        help="a previous --json result (of this or another jax line); fail when something "
        "that compiled there does not now",
    )

    sub.add_parser("demo", help="run the core_map guide's programs end to end")

    from coremesh.testing.upstream import command as upstream

    up = sub.add_parser(
        "upstream",
        help="run JAX's own Pallas TPU tests on the simulator and in stock interpret mode",
        description="Run each test file of a JAX test tree in its own pytest, the tests' device "
        "gates answering for the simulated chip each test needs, with a per-test watchdog; write "
        "a per-file table of pass/fail/error/hang/skip (markdown + JSON) under --out.",
    )
    upstream.add_arguments(up)
    return p


def _progress(stream: TextIO, quiet: bool) -> Any:
    if quiet:
        return None
    started = time.perf_counter()

    def report(p: Any) -> None:
        if p.result is None:
            return
        r = p.result
        if isinstance(r, str):
            status = r
        else:
            status = r.status + (f" {r.seconds:.2f}s" if r.status == "ok" else "")
        width = len(str(p.total))
        stream.write(
            f"[{p.index:>{width}}/{p.total}] {p.stage:<7} {p.chip:<6} {p.program:<28} {status}"
            f"  ({time.perf_counter() - started:.1f}s)\n"
        )
        stream.flush()

    return report


def _load_all(refs: Sequence[str]) -> list[Any]:
    from coremesh.testing.aot.program import load

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    programs: list[Any] = []
    for ref in refs:
        programs.extend(load(ref))
    return programs


def _write_json(path: str | None, text: str, stdout: TextIO) -> bool:
    """Write JSON; True when it replaced the table on stdout."""
    if path is None:
        return False
    if path == "-":
        stdout.write(text + "\n")
        return True
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return False


def _check(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    return _compile_and_report(_load_all(args.refs), args, stdout, stderr)


def _compile_and_report(
    programs: Sequence[Any], args: argparse.Namespace, stdout: TextIO, stderr: TextIO
) -> int:
    from coremesh.testing.aot import DEFAULT_CHIPS, compile_matrix, matrix_table, to_json

    results = compile_matrix(
        programs,
        args.chips or DEFAULT_CHIPS,
        devices=args.devices,
        mode=args.mode,
        prevalidate=not args.no_validate,
        progress=_progress(stderr, args.quiet),
    )
    if not _write_json(args.json, to_json(results), stdout):
        stdout.write(matrix_table(results, args.format) + "\n")
    unexpected = [r for r in results if not r.as_expected]
    baseline = getattr(args, "baseline", None)
    regressed = _regressions(results, baseline)
    made_by = _made_by(baseline) if regressed else ""
    for r in regressed:
        stderr.write(
            f"regression: {r.program} on {r.chip} ({r.mode}) compiled in the baseline"
            f"{made_by}, now {r.status}\n"
        )
    if not args.quiet:
        stderr.write(
            f"{len(results) - len(unexpected)}/{len(results)} as expected "
            f"({sum(r.ok for r in results)} compiled)\n"
        )
    return EXIT_FAILED if unexpected or regressed else EXIT_OK


def _regressions(results: Sequence[Any], baseline: str | None) -> list[Any]:
    """Results that are not ok where the baseline JSON (from ``--json``) had them compile."""
    if baseline is None:
        return []
    import json

    with open(baseline, encoding="utf-8") as f:
        before = json.load(f).get("compile", [])
    ok_before = {(d["program"], d["chip"], d["mode"]) for d in before if d["status"] == "ok"}
    return [r for r in results if (r.program, r.chip, r.mode) in ok_before and not r.ok]


def _made_by(baseline: str | None) -> str:
    """`` (jax 0.10.2, libtpu 0.0.52)``: what compiled the baseline, against what runs now."""
    import json

    from coremesh.testing.aot.report import versions

    if baseline is None:
        return ""
    with open(baseline, encoding="utf-8") as f:
        then = json.load(f).get("versions") or {}
    now = versions()
    if (then.get("jax"), then.get("libtpu")) == (now["jax"], now["libtpu"]):
        return ""
    return f" (jax {then.get('jax')}, libtpu {then.get('libtpu')})"


#: Entry-point group where packages list the programs they ship (``name = "module:ATTR"``).
PROGRAMS_GROUP = "coremesh.programs"


def shipped_references() -> list[str]:
    """The guide's programs plus every program registered under ``coremesh.programs``."""
    from importlib.metadata import entry_points

    refs = ["coremesh.testing.guide:PROGRAMS"]
    refs += sorted(ep.value for ep in entry_points(group=PROGRAMS_GROUP))
    return list(dict.fromkeys(refs))


def _aot_all(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    refs = shipped_references()
    if not args.quiet:
        stderr.write(f"compiling the programs of: {', '.join(refs)}\n")
    return _compile_and_report(_load_all(refs), args, stdout, stderr)


def _profile(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from coremesh.testing.aot import DEFAULT_CHIPS, cycles_table, profile, to_json
    from coremesh.testing.aot.program import ProgramRef, program_name, xla_reference

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    programs = []
    for ref in args.refs:  # fail fast on a reference that does not resolve
        programs += _load_all([ref])
        ProgramRef.parse(ref)
    without_xla = [] if args.no_xla else [program_name(p) for p in programs if not xla_reference(p)]
    results = profile(
        list(args.refs),
        args.chips or DEFAULT_CHIPS,
        devices=args.devices,
        mode=args.mode,
        include_xla=not args.no_xla,
        jobs=args.jobs,
        timeout_s=args.timeout,
        progress=_progress(stderr, args.quiet),
    )
    doc = to_json(cycle_results=results, no_xla_reference=without_xla)
    if not _write_json(args.json, doc, stdout):
        stdout.write(cycles_table(results, args.format, no_xla_reference=without_xla) + "\n")
    bad = ("error", "timeout", "aborted", "failed", "invalid")
    broken = [r for r in results if r.status in bad]
    return EXIT_FAILED if broken else EXIT_OK


def _info(args: argparse.Namespace, stdout: TextIO) -> int:
    import json

    from coremesh.testing import chip_table
    from coremesh.testing.aot.report import format_table

    docs = []
    for c in CHIPS.values():
        sc = c.sparsecore
        docs.append(
            {
                "name": c.name,
                "device_kind": c.device_kind,
                "tensorcores_per_chip": c.tensorcores_per_chip,
                "core_modes": {str(k): v for k, v in c.core_modes.items()},
                "sparsecore": None
                if sc is None
                else {
                    "cores": sc.cores,
                    "subcores": sc.subcores,
                    "lanes": sc.lanes,
                    "vmem_bytes_per_subcore": sc.vmem_bytes_per_subcore,
                },
                "vmem_bytes_per_core": c.vmem_bytes_per_core,
                "scoped_vmem_default_bytes": c.scoped_vmem_default_bytes,
                "hbm_bytes": c.hbm_bytes,
                "hbm_bytes_per_s": c.hbm_bytes_per_s,
                "peak_ops_per_s": dict(c.peak_ops_per_s),
                "clock_hz": c.clock_hz,
                "default_topology": c.default_topology,
                "sources": dict(c.sources),
            }
        )
    if args.json:
        stdout.write(json.dumps(docs, indent=2) + "\n")
        return EXIT_OK
    stdout.write(format_table(list(chip_table.HEADERS), chip_table.rows(), "plain") + "\n")
    stdout.write("".join(f"{note}\n" for note in chip_table.core_notes()))
    stdout.write("Figures are per chip; sources: coremesh.core.chips.Chip.sources\n")
    return EXIT_OK


def _demo(stdout: TextIO) -> int:
    from coremesh.testing.demo import main as demo

    return EXIT_FAILED if demo(stdout) else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stdout, stderr = sys.stdout, sys.stderr
    try:
        if args.command == "info":
            return _info(args, stdout)
        if args.command == "check":
            return _check(args, stdout, stderr)
        if args.command == "profile":
            return _profile(args, stdout, stderr)
        if args.command == "aot-all":
            return _aot_all(args, stdout, stderr)
        if args.command == "upstream":
            from coremesh.testing.upstream import command as upstream

            return upstream.run(args, stdout, stderr)
        return _demo(stdout)
    except CoremeshError as e:
        stderr.write(usage_error(args.command, e))
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
