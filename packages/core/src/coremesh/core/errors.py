"""One error hierarchy for every coremesh package.

Each error is raised before anything reaches jax or libtpu and says four things: what was wrong,
the rule or limit it broke, the chip it applies to (where there is one), and how to fix it. The
parts are kept as attributes so tools (the CLI, the compile matrix) can show them in tables.
"""

from __future__ import annotations


class CoremeshWarning(UserWarning):
    """Something worked but probably not as the user meant (e.g. a backend found by discovery)."""


class CoremeshError(Exception):
    """Base of every coremesh error."""

    def __init__(
        self,
        what: str,
        *,
        rule: str | None = None,
        chip: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.what = what
        self.rule = rule
        self.chip = chip
        self.fix = fix
        super().__init__(self._format())

    def _format(self) -> str:
        parts = [self.what if self.chip is None else f"[{self.chip}] {self.what}"]
        if self.rule:
            parts.append(f"Rule: {self.rule}")
        if self.fix:
            parts.append(f"Fix: {self.fix}")
        return "\n".join(parts)


class ChipError(CoremeshError, KeyError):
    """An unknown chip, or a chip asked for something it does not have (e.g. core count)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return self._format()


class MeshError(CoremeshError, ValueError):
    """A mesh or axis that does not fit the chip or the program (unknown axis, bad core count)."""


class LayoutError(CoremeshError, ValueError):
    """A shape, block or split that breaks tiling or cannot be divided as asked."""


class CapacityError(CoremeshError, ValueError):
    """A buffer larger than the memory that must hold it (VMEM, SMEM, SparseCore subcore VMEM)."""


class UnsupportedOnChipError(CoremeshError, NotImplementedError):
    """A feature or dtype the chip does not have (SparseCore on v5e, int8 matmul on v4...)."""


class CollectiveIdError(CoremeshError, ValueError):
    """A collective id that is taken, out of range, or exhausted."""


class BackendError(CoremeshError, LookupError):
    """A backend that is missing, duplicated, or failed to load."""


class DeadlockError(CoremeshError, RuntimeError):
    """A program waits for something that can never arrive (a semaphore nobody signals)."""


class CompileError(CoremeshError, RuntimeError):
    """The TPU compiler rejected a program; keeps the compiler's own text."""

    def __init__(
        self,
        what: str,
        *,
        compiler_message: str,
        rule: str | None = None,
        chip: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.compiler_message = compiler_message
        super().__init__(what, rule=rule, chip=chip, fix=fix)

    def _format(self) -> str:
        return f"{super()._format()}\nCompiler said: {self.compiler_message}"
