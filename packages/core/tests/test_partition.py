"""Work splitting and block checks against hand counts."""

from __future__ import annotations

import numpy as np
import pytest

from coremesh.core import LayoutError, Span, check_block_shape, core_share, split_rows, tile_shape


def test_even_split() -> None:
    assert split_rows(1024, 2) == (Span(0, 0, 512), Span(1, 512, 512))


def test_remainder_tiles_go_to_the_first_cores() -> None:
    # 40 rows = 5 tiles of 8 over 2 cores: 3 tiles then 2 tiles.
    spans = split_rows(40, 2)
    assert [(s.start, s.size) for s in spans] == [(0, 24), (24, 16)]


@pytest.mark.parametrize(
    ("n", "parts", "dtype"),
    [(64, 3, "float32"), (96, 4, "bfloat16"), (320, 3, "int8"), (8, 4, "float32")],
)
def test_spans_cover_rows_exactly_once_in_whole_tiles(n: int, parts: int, dtype: str) -> None:
    spans = split_rows(n, parts, dtype=dtype)
    tile = tile_shape(dtype)[0]
    covered = np.zeros(n, int)
    for s in spans:
        assert s.start % tile == 0 and s.size % tile == 0
        covered[s.start : s.stop] += 1
    assert (covered == 1).all()
    sizes = [s.size for s in spans]
    assert max(sizes) - min(sizes) <= tile


def test_packed_dtypes_use_taller_tiles() -> None:
    assert tile_shape("bfloat16") == (16, 128)
    assert tile_shape("int8") == (32, 128)
    with pytest.raises(LayoutError, match="16-row tile"):
        split_rows(40, 2, dtype="bfloat16")


def test_rows_that_do_not_fill_tiles_are_refused_with_the_fix() -> None:
    with pytest.raises(LayoutError) as e:
        split_rows(100, 2)
    msg = str(e.value)
    assert "100 rows" in msg and "8-row tile" in msg and "pad the rows to 104" in msg


def test_refuse_uneven() -> None:
    with pytest.raises(LayoutError, match="do not split evenly over 2 cores"):
        split_rows(24, 2, remainder="refuse")


def test_bad_part_count() -> None:
    with pytest.raises(LayoutError, match="0 parts"):
        split_rows(8, 0)


def test_block_shape_rules() -> None:
    check_block_shape((8, 128), (1024, 1024), "float32", "v5p")
    check_block_shape((1024, 64), (1024, 64), "float32", "v5p")  # full dims are always fine
    with pytest.raises(LayoutError, match=r"100 is not a multiple of 128"):
        check_block_shape((8, 100), (8, 200), "float32", "v5p")
    with pytest.raises(LayoutError, match=r"4 is not a multiple of 8"):
        check_block_shape((4, 128), (1024, 1024), "float32", "v5e")
    with pytest.raises(LayoutError, match=r"8 is not a multiple of 16"):
        check_block_shape((8, 128), (1024, 1024), "bfloat16", "v5e")
    with pytest.raises(LayoutError, match="does not divide"):
        check_block_shape((24, 128), (1024, 1024), "float32", "v5e")
    with pytest.raises(LayoutError, match="rank"):
        check_block_shape((8,), (1024, 1024), "float32", "v5e")


@pytest.mark.parametrize(("total", "parts"), [(0, 3), (5, 8), (64, 64), (100, 64), (7, 1)])
def test_core_share_covers_every_item_once(total: int, parts: int) -> None:
    shares = [tuple(int(v) for v in core_share(total, parts, p)) for p in range(parts)]
    counts = [c for _, c in shares]
    assert sum(counts) == total and max(counts) - min(counts) <= 1
    covered = [i for s, c in shares for i in range(s, s + c)]
    assert covered == list(range(total))


def test_core_share_is_traceable_and_agrees_with_split_rows() -> None:
    # Traced part index, as inside a kernel body; the same split as split_rows in whole tiles.
    import jax

    starts, sizes = jax.vmap(lambda p: core_share(5, 2, p))(np.arange(2))
    spans = split_rows(40, 2)
    assert [8 * int(s) for s in starts] == [s.start for s in spans]
    assert [8 * int(n) for n in sizes] == [s.size for s in spans]
