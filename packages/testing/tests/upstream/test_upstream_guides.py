"""The TPU guide runner: cells found as a notebook runs them, outcomes per cell, a real guide."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from coremesh.core import jax_versions
from coremesh.testing import cli
from coremesh.testing.upstream import guide_checks
from coremesh.testing.upstream.guide_cells import extract
from coremesh.testing.upstream.guide_run import run_guide
from coremesh.testing.upstream.guides import GUIDES_DIR, Change, Guide, apply_changes, get_guide
from coremesh.testing.upstream.tree import default_corpus, find_trees, read_tree, resolve

REPO = Path(__file__).resolve().parents[4]

# A MyST notebook: code-cell blocks run; the python block is prose.
MYST = """\
---
jupytext:
  text_representation:
    format_name: myst
---

Some text.

```{code-cell} ipython3
---
id: abc
---
x = 1
```

A signature, not run:

```python
def make_async_remote_copy(src_ref, dst_ref): ...
```

```{code-cell} ipython3
!pip install jax
```

```{code-cell} ipython3
%%bash
echo hi
```

```{code-cell} ipython3
%timeit f(x)
y = x + 1
```
"""

# A notebook exported to Markdown: python blocks run; outputs follow them.
EXPORTED = """\
# Title

```python
print("a")
```

    a


```python
print(2.5)
```

```
2.5
```

```python
%timeit g()
```

```
1 ms per loop
```
"""


def test_a_myst_notebook_runs_its_code_cells_only() -> None:
    cells = extract(MYST)
    assert [c.index for c in cells] == [1, 2, 3, 4]
    assert cells[0].source == "x = 1\n"
    assert cells[0].line == MYST.splitlines().index("x = 1") + 1  # the options are not code
    assert cells[0].skip is None and cells[0].recorded is None
    assert cells[1].skip is not None and cells[1].skip.startswith("shell commands (!pip install")
    assert cells[2].skip == "an IPython cell magic (%%bash), not Python"
    assert cells[3].skip is None
    assert cells[3].source.splitlines() == ["", "y = x + 1"]  # line numbers kept
    assert cells[3].dropped == ("%timeit f(x): a timing of the real chip",)


def test_an_exported_notebook_runs_its_python_blocks_with_their_outputs() -> None:
    cells = extract(EXPORTED)
    assert [(c.source, c.recorded) for c in cells[:2]] == [
        ('print("a")\n', "a"),
        ("print(2.5)\n", "2.5"),
    ]
    assert cells[2].skip == "only IPython line magics: %timeit g(): a timing of the real chip"


def test_the_real_guides_cells() -> None:
    """The guides as stored: which blocks are cells, and which are skipped."""
    corpus = default_corpus(REPO)
    if not find_trees(corpus):
        pytest.skip(f"no JAX test tree at {corpus}")
    tree = resolve(corpus, jax_versions.installed())
    text = {
        n: (tree.root / GUIDES_DIR / f"{n}.md").read_text() for n in ("core_map", "distributed")
    }
    assert len(extract(text["distributed"])) == text["distributed"].count("```{code-cell}") == 8
    core_map = extract(text["core_map"])
    assert len(core_map) == text["core_map"].count("```python") == 9
    assert core_map[0].recorded == "Running on 4 TPU v5p devices."


def test_printed_differences_are_checked_numerically() -> None:
    out = "Input: [1. 2.]\nDifference |Pallas - lax.psum|: 2.3841858e-07\n"
    assert guide_checks.printed_differences(out) == [
        ("Difference |Pallas - lax.psum|: 2.3841858e-07", 2.3841858e-07)
    ]
    assert guide_checks.difference_failure(out) is None
    ((_, value),) = guide_checks.printed_differences("Difference |Pallas - X| =  nan")
    assert math.isnan(value)
    assert guide_checks.difference_failure("Difference |a - b| = 0.5") == (
        "printed 'Difference |a - b| = 0.5': not within 0.001 of XLA's result"
    )


def test_recorded_outputs_compare_numbers_within_a_tolerance() -> None:
    assert guide_checks.compare_output("x = 0.1000000", "x = 0.1") == "matches the recorded output"
    assert guide_checks.compare_output("on 4 TPU v5p", "on 2 TPU v5p") == (
        "differs from the recorded output at line 1: 'on 2 TPU v5p', recorded 'on 4 TPU v5p'"
    )


def test_changes_apply_only_where_their_text_is() -> None:
    renamed = Change("a.b", "c({device_kind!r})", "rename: why")
    later = Change("x = ", "z = ", "later: why", since="0.11")
    guide = Guide("g", "v5p", 1, "", (renamed, later))
    assert apply_changes("x = a.b\n", guide, "TPU v5", "0.10.2") == (
        "x = c('TPU v5')\n",
        ("rename: why",),
    )
    assert apply_changes("x = a.b\n", guide, "TPU v5", "0.12.0.1") == (
        "z = c('TPU v5')\n",
        ("rename: why", "later: why"),
    )
    assert apply_changes("y = 1\n", guide, "TPU v5", "0.12.0.1") == ("y = 1\n", ())


SYNTHETIC = """\
```python
import time
import numpy as np
import jax
from jax.experimental.pallas import tpu as pltpu
value = 41
print(jax.device_count(), pltpu.get_tpu_info().chip_version)
```

    2 v5p

```python
assert value == 42, "the guide's own check"
```

```python
time.sleep(600)
```

```python
value += 1
np.testing.assert_array_equal(value, 42)
print("Difference |Pallas - lax.psum| = ", float("nan"))
```

```python
!pip install nothing
```
"""


def _synthetic_tree(root: Path) -> Path:
    tree = root / "jax-0.10.2"
    (tree / "tests" / "pallas").mkdir(parents=True)
    (tree / GUIDES_DIR).mkdir(parents=True)
    (tree / "COMMIT").write_text("jax-v0.10.2\n")
    (tree / GUIDES_DIR / "synthetic.md").write_text(SYNTHETIC)
    return tree


def test_each_cell_gets_its_outcome_and_a_hang_costs_only_its_cell(tmp_path: Path) -> None:
    tree = read_tree(_synthetic_tree(tmp_path))
    guide = Guide("synthetic", "v5p", 2, "a test")
    run = run_guide(tree, guide, tmp_path / "out", timeout=15)
    got = [(c.index, c.status, c.message) for c in run.cells]
    assert got == [
        (1, "pass", ""),
        (2, "fail", "AssertionError: the guide's own check (cell line 1)"),
        (3, "hang", "still running after 15 s"),
        # Run by a second child, after cells 1 and 2 ran again for their names: the guide's
        # own assert passed, and the printed difference from XLA is NaN.
        (4, "fail", "printed 'Difference |Pallas - lax.psum| =  nan': not within 0.001 of "
                    "XLA's result"),
        (5, "skip", "shell commands (!pip install nothing): the environment is set up already"),
    ]  # fmt: skip
    assert run.cells[0].output == "matches the recorded output"  # 2 simulated v5p devices
    assert run.processes == 2
    log = (tmp_path / "out" / "logs" / "guides" / "synthetic.log").read_text()
    assert 'File "<guide synthetic cell 3>", line 1' in log  # the hung cell's stack was dumped


def test_the_command_writes_a_table_of_a_real_guide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole core_map guide (the fastest: about 25 s) on 4 simulated v5p devices, through
    ``coremesh upstream --guides``: its own asserts hold in every cell."""
    corpus = default_corpus(REPO)
    if not find_trees(corpus):
        pytest.skip(f"no JAX test tree at {corpus}")
    argv = ["upstream", "--jax-tests", str(corpus), "--guides", "core_map"]
    assert cli.main([*argv, "--timeout", "300", "--out", str(tmp_path), "-q"]) == 0
    version = jax_versions.installed()
    doc = json.loads((tmp_path / f"guides-jax-{version}.json").read_text())
    (run,) = doc["guides"]
    assert (run["guide"], run["chip"], run["devices"]) == ("core_map", "v5p", 4)
    assert [c["status"] for c in run["cells"]] == ["pass"] * 9, run["cells"]
    assert run["cells"][0]["output"] == "matches the recorded output"
    table = (tmp_path / f"guides-jax-{version}.md").read_text()
    assert "| core_map | 4 x v5p | 9 | 9/0/0/0 |" in table
    assert get_guide("core_map.md").name == "core_map"
    assert "guides-jax" not in capsys.readouterr().err


def test_first_runs_only_the_first_cells(tmp_path: Path) -> None:
    tree = read_tree(_synthetic_tree(tmp_path))
    run = run_guide(tree, Guide("synthetic", "v5p", 2, "a test"), tmp_path / "out", first=1)
    assert [(c.index, c.status) for c in run.cells] == [(1, "pass")]
    assert run.processes == 1
