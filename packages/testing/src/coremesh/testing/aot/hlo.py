"""Facts read from a compiled program's HLO text that libtpu's static profile leaves out.

XLA may copy an entry parameter into VMEM before the program's first op (a cross-program
prefetch: ``copy-start(...), cross_program_prefetch_index=N``). The static profile charges
nothing for that copy, so a program whose operand XLA prefetched looks as if its input was
already in VMEM. For XLA's own ``x.max(1)`` of 16 MiB this is the whole HBM read: its estimate
falls 2-4x below the HBM roofline. Reading the prefetched bytes lets a comparison charge them.
"""

from __future__ import annotations

import math
import re

#: Bytes per element of HLO primitive types (sub-byte types round up to a byte).
_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip

# ``%copy-start = (bf16[2048,2048]{...}, ...) copy-start(%param), cross_program_prefetch_index=0``
_PREFETCH = re.compile(
    r"=\s*\(\s*(?P<dtype>[a-z0-9]+)\[(?P<dims>[0-9,]*)\][^\n]*?copy-start\([^\n]*"
    r"cross_program_prefetch_index="
)


def _nbytes(dtype: str, dims: str) -> int:
    size = _BYTES.get(dtype, 1) if not dtype.startswith("f8") else 1
    return size * math.prod(int(d) for d in dims.split(",") if d)


def cross_program_prefetch_bytes(hlo_text: str) -> int:
    """Bytes XLA copies into VMEM before the program starts (0 when it prefetches nothing)."""
    return sum(_nbytes(m["dtype"], m["dims"]) for m in _PREFETCH.finditer(hlo_text))
