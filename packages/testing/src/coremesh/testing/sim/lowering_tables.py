"""jax's lowering tables as patch targets: an entry per primitive (or abstract value) that the
simulator's patches swap and restore as they do any attribute."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: A table entry that was not there (restoring it removes the entry).
_ABSENT = object()


class TableEntry:
    """One entry of a jax table (a lowering rule per primitive, an IR type per abstract value),
    as the attribute ``entry``, so the simulator's patches swap and restore it as they do any
    attribute."""

    __slots__ = ("_key", "_table")

    def __init__(self, table: dict[Any, Any], key: Any) -> None:
        object.__setattr__(self, "_table", table)
        object.__setattr__(self, "_key", key)

    def __getattr__(self, name: str) -> Any:
        if name != "entry":
            raise AttributeError(name)
        return self._table.get(self._key, _ABSENT)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "entry":
            raise AttributeError(name)
        if value is _ABSENT:
            self._table.pop(self._key, None)
        else:
            self._table[self._key] = value


_ENTRIES: dict[tuple[int, Any], TableEntry] = {}


def table_entry(table: dict[Any, Any], key: Any) -> TableEntry:
    """The one :class:`TableEntry` for ``key`` of ``table``: a patch's targets are the same
    objects each time they are listed, as module attributes are."""
    return _ENTRIES.setdefault((id(table), key), TableEntry(table, key))


def cpu_rule(primitive: Any, wrap: Callable[[Any], Any]) -> tuple[Any, str, Any]:
    """A patch target: ``primitive``'s CPU lowering rule replaced by ``wrap(rule)``, ``rule``
    being the one in force (the CPU's own, else the generic one)."""
    from jax._src.interpreters import mlir

    cpu = mlir._platform_specific_lowerings["cpu"]
    entry = cpu.get(primitive) or mlir._lowerings[primitive]
    return (
        table_entry(cpu, primitive),
        "entry",
        mlir.LoweringRuleEntry(wrap(entry.rule), entry.inline),
    )
