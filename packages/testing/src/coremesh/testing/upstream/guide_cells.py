"""The code cells of a JAX guide written in Markdown, as a notebook would run them.

Two layouts occur in JAX's TPU guides. A MyST notebook (jupytext ``format_name: myst``) runs its
`` ```{code-cell} ipython3 `` blocks; its `` ```python `` blocks are prose (signatures and
fragments that name refs no cell defines) and stay unrun. A notebook exported to Markdown
(no ``{code-cell}`` at all) runs its `` ```python `` blocks, and records each cell's output right
after it, as a plain `` ``` `` block or a block indented by four spaces.

IPython syntax is not Python: a cell of shell lines (``!pip install ...``) or a cell magic
(``%%...``) is skipped, and line magics (``%timeit stmt``, a timing of the real TPU) are left
out of the cell they sit in, each with the reason.
"""

from __future__ import annotations

import dataclasses
import re

_FENCE = re.compile(r"^(`{3,})(.*)$")
_CODE_CELL = re.compile(r"^\{code-cell\}\s*(ipython3|python3?)?\s*$")
_INDENT = "    "


@dataclasses.dataclass(frozen=True)
class Cell:
    """One code cell: its number among the guide's cells (from 1) and the line its code starts."""

    index: int
    line: int
    source: str
    #: The output the guide records after the cell, or None.
    recorded: str | None = None
    #: Why the cell is not run, or None.
    skip: str | None = None
    #: What was left out of the cell, and why (IPython line magics).
    dropped: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Block:
    info: str  # the fence's info string: "python", "{code-cell} ipython3", ""
    start: int  # 1-based line of the first line inside the fence
    end: int  # 0-based index of the line after the closing fence
    body: list[str]


def _blocks(lines: list[str]) -> list[_Block]:
    out: list[_Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        ticks, info = m.group(1), m.group(2).strip()
        j = i + 1
        close = re.compile(rf"`{{{len(ticks)},}}\s*")
        while j < len(lines) and not close.fullmatch(lines[j]):
            j += 1
        out.append(_Block(info, i + 2, j + 1, lines[i + 1 : j]))
        i = j + 1
    return out


def _strip_options(body: list[str]) -> tuple[list[str], int]:
    """A code cell's body without its YAML options (``---`` ... ``---``); lines removed."""
    if body and body[0].strip() == "---":
        for k in range(1, len(body)):
            if body[k].strip() == "---":
                return body[k + 1 :], k + 1
    return body, 0


def _indented_output(lines: list[str], after: int) -> str | None:
    """An nbconvert output: lines indented by four spaces after blank lines."""
    k = after
    while k < len(lines) and not lines[k].strip():
        k += 1
    if k == after or k >= len(lines) or not lines[k].startswith(_INDENT):
        return None
    got: list[str] = []
    while k < len(lines) and (lines[k].startswith(_INDENT) or not lines[k].strip()):
        got.append(lines[k][len(_INDENT) :])
        k += 1
    return "\n".join(got).strip("\n")


def _ipython(source: str) -> tuple[str, str | None, tuple[str, ...]]:
    """(Python source, why the cell is skipped, what was dropped) of a cell's IPython text."""
    lines = source.splitlines()
    code = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if code and code[0].lstrip().startswith("%%"):
        return source, f"an IPython cell magic ({code[0].split()[0]}), not Python", ()
    shell = [ln for ln in code if ln.lstrip().startswith("!")]
    if code and len(shell) == len(code):
        return source, f"shell commands ({shell[0].strip()}): the environment is set up already", ()
    kept: list[str] = []
    dropped: list[str] = []
    for ln in lines:
        s = ln.lstrip()
        if s.startswith("%timeit"):
            dropped.append(f"{s.strip()}: a timing of the real chip")
        elif s.startswith(("%", "!")):
            dropped.append(f"{s.strip()}: IPython, not Python")
        else:
            kept.append(ln)
            continue
        kept.append("")  # keep line numbers
    rest = [ln for ln in kept if ln.strip() and not ln.lstrip().startswith("#")]
    if dropped and not rest:
        return source, "only IPython line magics: " + "; ".join(dropped), ()
    return "\n".join(kept) + "\n", None, tuple(dropped)


def extract(text: str) -> list[Cell]:
    """The code cells of a guide, in order, with recorded outputs and skips."""
    lines = text.splitlines()
    blocks = _blocks(lines)
    myst = any(_CODE_CELL.match(b.info) for b in blocks)
    cells: list[Cell] = []
    for n, b in enumerate(blocks):
        if myst:
            if not _CODE_CELL.match(b.info):
                continue
            body, removed = _strip_options(b.body)
            start, recorded = b.start + removed, None
        else:
            if b.info != "python":
                continue
            body, start = b.body, b.start
            nxt = blocks[n + 1] if n + 1 < len(blocks) else None
            gap = lines[b.end : nxt.start - 2] if nxt is not None else []
            if nxt is not None and nxt.info == "" and not any(ln.strip() for ln in gap):
                recorded = "\n".join(nxt.body).strip("\n")
            else:
                recorded = _indented_output(lines, b.end)
        source, skip, dropped = _ipython("\n".join(body) + "\n")
        cells.append(Cell(len(cells) + 1, start, source, recorded, skip, dropped))
    return cells
