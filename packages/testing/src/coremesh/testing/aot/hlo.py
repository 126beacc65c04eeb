"""Facts read from a compiled program's HLO text that libtpu's static profile leaves out.

XLA copies buffers into VMEM (memory space ``S(1)``) with asynchronous ``copy-start`` /
``copy-done`` pairs: before the program's first op (a cross-program prefetch, ``copy-start(...),
cross_program_prefetch_index=N``) or inside it (for a Pallas kernel whose operand is placed in
VMEM). The static profile has no operation for either, so a program looks as if those bytes were
already in VMEM. For XLA's own ``x.max(1)`` of 16 MiB this is the whole HBM read: its estimate
falls 2-4x below the HBM roofline; a kernel taking the same 16 MiB in VMEM on TPU7x estimates at
2346 cycles with its copy uncharged. Reading the copied bytes lets a comparison charge them.
"""

from __future__ import annotations

import math
import re

#: Bytes per element of HLO primitive types (sub-byte types round up to a byte).
_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip

# ``%copy-start = (bf16[2048,2048]{1,0:T(8,128)(2,1)S(1)}, ...) copy-start(%param), ...``: the
# first element of the result tuple is the destination, in VMEM when its layout says ``S(1)``.
_VMEM_COPY = re.compile(
    r"=\s*\(\s*(?P<dtype>[a-z0-9]+)\[(?P<dims>[0-9,]*)\]\{[^}]*S\(1\)[^}]*\}[^\n]*?"
    r"copy-start\("
)


def _nbytes(dtype: str, dims: str) -> int:
    size = _BYTES.get(dtype, 1) if not dtype.startswith("f8") else 1
    return size * math.prod(int(d) for d in dims.split(",") if d)


def vmem_copy_bytes(hlo_text: str) -> int:
    """Bytes XLA copies into VMEM by ``copy-start`` (cross-program prefetches included): what
    libtpu's static profile does not charge (0 when there are none)."""
    return sum(_nbytes(m["dtype"], m["dims"]) for m in _VMEM_COPY.finditer(hlo_text))
