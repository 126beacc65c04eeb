"""Byte sizes written as text: ``"8G"``, ``"512MiB"``, ``"1.5k"``, libtpu's ``"16.00M"``.

One parser for what users type (``COREMESH_PROFILE_MEMORY_CAP``) and what the compiler prints
(``aot.diagnose``'s VMEM messages); units are binary either way.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes from ``"8G"``, ``"512MiB"``, ``"1.5g"``, ``"16.00M"`` or ``"1000000"``."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (e.g. 8G, 512M, 1000000)")
    return int(float(m["n"]) * 1024 ** "_kmgt".index((m["unit"] or "_").lower()))
