"""Byte sizes as text: what users type for the memory cap and what libtpu prints, one parser."""

from __future__ import annotations

import pytest

from coremesh.core.errors import CapacityError
from coremesh.testing.aot.diagnose import DiagnosedError, explain
from coremesh.testing.aot.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8G", 8 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5k", 1536),
        (" 1000000 ", 10**6),
        ("2tb", 2 * 2**40),
        # libtpu's VMEM messages: two decimals, one capital letter.
        ("16.00M", 16 * 2**20),
        ("68.50M", 68 * 2**20 + 2**19),
        ("4K", 4096),
    ],
)
def test_sizes_in_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "", "8 GG", "-1G", "1e9"])
def test_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_a_diagnosis_reads_the_compilers_sizes() -> None:
    text = (
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Scoped allocation with size "
        "48.00M and limit 16.00M exceeded scoped vmem limit"
    )
    err = explain(RuntimeError(text), chip="v5e", program="big")
    assert isinstance(err, DiagnosedError) and issubclass(type(err), CapacityError)
    assert err.kind == "scoped_vmem"
    assert "needs 48.00 MiB of scoped VMEM; the limit is 16.00 MiB" in err.what
    # 48 MiB * 1.1, rounded up to whole MiB, is what the fix asks for (v5e has 128 MiB).
    assert "vmem_limit_bytes=53 * 1024 * 1024" in str(err.fix)
