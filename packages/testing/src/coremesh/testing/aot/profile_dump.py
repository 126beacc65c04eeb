"""libtpu's dump directory for static cycle estimates: the flags that fill it, and its reader.

The directory has three parts, each named by its flag in ``dump_flags``: ``sp`` (the static
profile, ``estimated_cycles`` per HLO operation), ``jf`` (the final TensorCore bundles per
operation, and the program's HLO, which says which operations are Pallas kernels) and ``scb``
(SparseCore bundles). Files are named after HLO instructions (``shard_map.12``), so the directory
is cleared before each program (``clear_dump``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
from typing import Literal

#: The directory's parts: static profile, TensorCore bundles and HLO, SparseCore bundles.
_PARTS = ("sp", "jf", "scb")

_ESTIMATE = re.compile(
    r'hlo_op_estimate\s*\{[^{}]*?hlo_op_name:\s*"(?P<name>[^"]+)"[^{}]*?'
    r"estimated_cycles:\s*(?P<cycles>-?\d+)",
    re.S,
)
_SCHEDULE = re.compile(r"total scheduled bundles:\s*(\d+)")
_SCHEDULE_FILE = re.compile(r"^\d+-(?P<name>.+)-\d+-schedule-analysis_final_bundles\.txt$")
_MOSAIC_OP = re.compile(r'%(?P<name>[\w.\-]+) = [^\n]*?custom_call_target="tpu_custom_call"')
_SC_SECTION = re.compile(r"^(?P<section>[a-z]+)$")
_SC_BUNDLE = re.compile(r"^0x[0-9a-f]+:")


def dump_flags(dump_dir: str, *, static_profile: bool = True) -> str:
    """``LIBTPU_INIT_ARGS`` that dump estimates and bundles under ``dump_dir``.

    Without ``static_profile`` only the bundles are dumped (for a chip whose profiler aborts).
    """
    flags = [
        f"--xla_jf_dump_to={dump_dir}/jf",
        "--xla_jf_dump_llo_pass_label_regex=final_bundles",
        f"--xla_sc_dump_bundles_to={dump_dir}/scb",
    ]
    if static_profile:
        flags.insert(0, f"--xla_jf_dump_static_llo_profile_to={dump_dir}/sp")
    return " ".join(flags)


def parse_static_profile(directory: str) -> dict[str, int]:
    """HLO operation name -> ``estimated_cycles`` from ``*_static_llo_profile.textproto``."""
    out: dict[str, int] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*static_llo_profile.textproto"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for m in _ESTIMATE.finditer(f.read()):
                out[m["name"]] = int(m["cycles"])
    return out


def parse_tensorcore_bundles(directory: str) -> dict[str, int]:
    """HLO operation name -> scheduled bundles, from the final-bundles schedule analyses.

    The program's own glue (``TLP``, ``<late-initialization>``...) is left out.
    """
    out: dict[str, int] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*schedule-analysis_final_bundles.txt"))):
        m = _SCHEDULE_FILE.match(os.path.basename(path))
        if m is None or m["name"] == "TLP" or m["name"].startswith("<"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            total = _SCHEDULE.search(f.read())
        if total:
            out[m["name"]] = out.get(m["name"], 0) + int(total.group(1))
    return out


def parse_mosaic_ops(directory: str) -> set[str]:
    """Names of the Pallas (Mosaic) kernels in the compiled program (its ``TLP-hlo.txt``)."""
    names: set[str] = set()
    for path in glob.glob(os.path.join(directory, "*-TLP-hlo.txt")):
        with open(path, encoding="utf-8", errors="replace") as f:
            names.update(m["name"] for m in _MOSAIC_OP.finditer(f.read()))
    return names


def parse_sparsecore_bundles(directory: str) -> dict[str, int]:
    """SparseCore bundles per section (``scs``, ``tec``...) summed over the dumped programs."""
    out: dict[str, int] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*_bundles.txt"))):
        section = None
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                s = _SC_SECTION.match(line.rstrip("\n"))
                if s:
                    section = s["section"]
                elif section and _SC_BUNDLE.match(line):
                    out[section] = out.get(section, 0) + 1
    return out


@dataclasses.dataclass(frozen=True)
class OpCycles:
    """One compiled TensorCore operation: a Pallas kernel (``mosaic``) or an XLA op."""

    name: str
    kind: Literal["mosaic", "xla"]
    cycles: int | None
    bundles: int | None


def read_dump(directory: str) -> tuple[list[OpCycles], dict[str, int]]:
    """Operations with their estimates and bundles, and SparseCore bundle counts."""
    estimates = parse_static_profile(os.path.join(directory, "sp"))
    bundles = parse_tensorcore_bundles(os.path.join(directory, "jf"))
    mosaic = parse_mosaic_ops(os.path.join(directory, "jf"))
    names = sorted(set(estimates) | set(bundles))
    ops = [
        OpCycles(n, "mosaic" if n in mosaic else "xla", estimates.get(n), bundles.get(n))
        for n in names
    ]
    return ops, parse_sparsecore_bundles(os.path.join(directory, "scb"))


def clear_dump(directory: str) -> None:
    """Empty each part of the dump, so the next program's files are the only ones read."""
    for part in _PARTS:
        path = os.path.join(directory, part)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, exist_ok=True)
