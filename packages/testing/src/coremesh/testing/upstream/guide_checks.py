"""What a guide cell printed, checked against what the guide says it should print.

The guides' own asserts are the primary check; these two read their printed words:

* the distributed guide asserts nothing: each example prints ``Difference |Pallas - lax.X| =
  <value>`` against XLA's collective. A value that is not finite, or above
  :data:`DIFFERENCE_TOL` (inputs are uniform in [0, 1) and summed over a few devices in float32,
  so rounding is ~1e-6), is a wrong result and fails the cell;
* a cell's recorded output (core_map and sparsecore record them) is compared line by line, the
  numbers in it within a relative 1e-5. It is a note, not a failure: recorded outputs name the
  machine they ran on (chip, device count) and a jax release.
"""

from __future__ import annotations

import math
import re

#: The largest printed difference from XLA's result that passes.
DIFFERENCE_TOL = 1e-3
#: Relative tolerance of numbers in recorded outputs.
OUTPUT_RTOL = 1e-5

_DIFFERENCE = re.compile(r"^\s*Difference\b.*?[:=]\s*(\S+)\s*$")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b")


def printed_differences(stdout: str) -> list[tuple[str, float]]:
    """Each ``Difference ...: value`` line with its value (NaN where it is not a number)."""
    out: list[tuple[str, float]] = []
    for line in stdout.splitlines():
        m = _DIFFERENCE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(1))
        except ValueError:
            value = math.nan
        out.append((line.strip(), value))
    return out


def difference_failure(stdout: str) -> str | None:
    """Why the printed differences fail the cell, or None."""
    for line, value in printed_differences(stdout):
        if not math.isfinite(value) or abs(value) > DIFFERENCE_TOL:
            return f"printed {line!r}: not within {DIFFERENCE_TOL:g} of XLA's result"
    return None


def _tokens(line: str) -> list[str | float]:
    out: list[str | float] = []
    pos = 0
    for m in _NUMBER.finditer(line):
        out += line[pos : m.start()].split()
        out.append(float(m.group(0)))
        pos = m.end()
    out += line[pos:].split()
    return out


def _same(a: str | float, b: str | float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=OUTPUT_RTOL, abs_tol=0.0)
    return a == b


def compare_output(recorded: str, stdout: str) -> str:
    """``"matches the recorded output"``, or the first line that differs."""
    want = [ln for ln in recorded.splitlines() if ln.strip()]
    got = [ln for ln in stdout.splitlines() if ln.strip()]
    for k, (w, g) in enumerate(zip(want, got, strict=False), 1):
        tw, tg = _tokens(w), _tokens(g)
        if len(tw) != len(tg) or not all(_same(a, b) for a, b in zip(tw, tg, strict=True)):
            return (
                f"differs from the recorded output at line {k}: {g.strip()!r}, "
                f"recorded {w.strip()!r}"
            )
    if len(want) != len(got):
        return f"printed {len(got)} line(s), the guide records {len(want)}"
    return "matches the recorded output"
