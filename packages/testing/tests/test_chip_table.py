"""The chip table `coremesh info` and the demo show, and the demo's numbered sections."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from coremesh.core import CHIPS, get_chip
from coremesh.testing import chip_table, demo


def test_core_notes_say_what_a_jax_device_is() -> None:
    # Hand count from the chips' documentation: v4 and v5p pair their two TensorCores into one
    # device, TPU7x exposes each of its two as a device, v5e and v6e have one.
    assert chip_table.core_note(get_chip("TPU7x")) == (
        "TPU7x: 2 TensorCores per chip, each its own JAX device of 1 core"
    )
    assert chip_table.core_note(get_chip("v4")) == (
        "v4: the chip's 2 TensorCores are one JAX device (megacore)"
    )
    assert (
        chip_table.core_note(get_chip("v5p")) == "v5p: the chip's 2 TensorCores are one JAX device"
    )
    assert (
        chip_table.core_note(get_chip("v6e")) == "v6e: one TensorCore per chip, one JAX device each"
    )
    assert len(chip_table.core_notes()) == len(CHIPS)


def test_modes_cell_marks_the_default() -> None:
    assert chip_table.modes_cell(get_chip("v5p")) == "2 (default), 1 (legacy)"
    assert chip_table.modes_cell(get_chip("v4")) == "2 (megacore, default), 1"
    assert chip_table.modes_cell(get_chip("TPU7x")) == "1 (default)"


def test_rows_have_one_cell_per_header() -> None:
    rows = chip_table.rows()
    assert [r[0] for r in rows] == list(CHIPS)
    assert all(len(r) == len(chip_table.HEADERS) for r in rows)
    tpu7x = dict(zip(chip_table.HEADERS, rows[-1], strict=True))
    assert (tpu7x["TCs/chip"], tpu7x["cores per JAX device (mode)"]) == ("2", "1 (default)")


def test_demo_numbers_each_section_once() -> None:
    out = io.StringIO()
    log = demo._Log(out)
    for title in ("chips", "guide", "ops", "ops again"):
        log.section(title)
    numbers = re.findall(r"^== (\d+)\. ", out.getvalue(), re.M)
    assert numbers == ["1", "2", "3", "4"]


def test_demo_compile_progress_reports_every_twenty_and_the_last() -> None:
    out = io.StringIO()
    report = demo._compile_progress(demo._Log(out), started=0.0)
    for i in range(1, 46):
        report(SimpleNamespace(index=i, total=45, program="p", chip="v5p", result=None))  # start
        report(SimpleNamespace(index=i, total=45, program="p", chip="v5p", result="ok"))
    assert re.findall(r"compiled (\d+)/45", out.getvalue()) == ["20", "40", "45"]
