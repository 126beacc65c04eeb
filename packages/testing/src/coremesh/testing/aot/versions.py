"""Which jax and libtpu produced a compile verdict or a cycle estimate, and the libtpu needed.

Compile-only checks need libtpu installed (older releases compile, but the error catalogue of
``diagnose``, the expected verdicts and the topologies are libtpu 0.0.52's: 0.0.42.1 refuses
``TPU7x:2x1x1``, the slice of 4 TPU7x devices). Static cycle estimates need libtpu 0.0.52 or
newer: on 0.0.42.1 the static profile aborts the process for TPU7x and reports 0 cycles for
remote-DMA kernels (research/AOT_COMPILE.md), and releases between are untested. Estimates move
between libtpu releases (and with the HLO each jax line emits), so every estimate records both
versions (``CycleEstimate.jax_version``/``libtpu_version``).

=====================  ===========  ==========================================================
what                   libtpu       when it is missing or older
=====================  ===========  ==========================================================
compile-only checks    installed    ``LibtpuError`` (pytest: the ``aot`` fixtures skip); a
                                    topology an older libtpu lacks is one too, per chip
static cycle profile   >= 0.0.52    ``LibtpuError`` from ``profile()`` before any child starts
=====================  ===========  ==========================================================

Mosaic's lowering is part of jax, so a kernel can compile on one jax line and not on another with
the same libtpu. ``COMPILER_CHANGES`` lists the differences the compile checks met on the
supported lines (each has a test on every line); ``has_change(name)`` says whether the installed
jax has the newer behaviour.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from importlib import metadata

from coremesh.core import jax_versions
from coremesh.core.errors import CoremeshError, CoremeshWarning

#: The first libtpu whose static profile estimates v5e, v5p, v6e and TPU7x (and remote DMAs).
STATIC_PROFILE_LIBTPU = "0.0.52"
#: The libtpu the compile verdicts and the diagnose catalogue were taken with.
TESTED_LIBTPU = "0.0.52"
#: Distributions that ship libtpu (a nightly has its own name).
_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")


class LibtpuError(CoremeshError, RuntimeError):
    """libtpu is missing, or too old for what was asked of it."""

    def __init__(
        self,
        what: str,
        *,
        found: str | None,
        needed: str,
        rule: str,
        fix: str,
        chip: str | None = None,
    ) -> None:
        self.found, self.needed = found, needed
        super().__init__(what, rule=rule, fix=fix, chip=chip)


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None when there is none."""
    for dist in _DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def jax_version() -> str:
    return jax_versions.installed()


def parse(version: str) -> tuple[int, ...]:
    """``"0.0.50.1"`` -> ``(0, 0, 50, 1)``; ``.dev``/``+local`` tails are dropped (a nightly
    counts as the release it leads to). Unreadable text gives ``()``, older than any release."""
    m = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def install_fix(needed: str = TESTED_LIBTPU) -> str:
    return (
        f"pip install libtpu=={needed} (it runs without a TPU; coremesh-testing pins "
        f"libtpu>={needed})"
    )


def check_libtpu(found: str | None, *, needed: str | None, purpose: str) -> None:
    """Raise ``LibtpuError`` when ``found`` (a libtpu version; None: not installed) is missing,
    or older than ``needed`` (None: any release will do) for ``purpose``."""
    want = needed or TESTED_LIBTPU
    if found is None:
        need = f"libtpu {needed} or newer" if needed else "libtpu"
        raise LibtpuError(
            f"libtpu is not installed, and {purpose} need {need}",
            found=None,
            needed=want,
            rule="coremesh compiles for TPU generations with libtpu's compiler, which runs on "
            "any Linux machine, without a TPU",
            fix=install_fix(want),
        )
    if needed is not None and parse(found) < parse(needed):
        raise LibtpuError(
            f"libtpu {found} is installed, and {purpose} need libtpu {needed} or newer",
            found=found,
            needed=needed,
            rule=f"coremesh's static estimates are taken and tested with libtpu {needed}, whose "
            "profile covers v5e, v5p, v6e and TPU7x; 0.0.42.1's aborts the compile on TPU7x and "
            "counts remote DMAs as 0 cycles, and the releases between are untested",
            fix=install_fix(needed),
        )


def older_than_tested(found: str | None) -> bool:
    """Is ``found`` a libtpu older than the one coremesh's chip registry was built against?"""
    return found is not None and parse(found) < parse(TESTED_LIBTPU)


#: (jax release, the oldest libtpu its Mosaic lowering is written for): from jax 0.12.1 the
#: lowering asks for libtpu 0.0.53 (lowering.py ``is_libtpu_at_least``, checked only on a TPU)
#: and emits what 0.0.52 refuses, e.g. ``!=`` of floats as the UNE compare ("Unsupported
#: comparison direction: une", measured with libtpu 0.0.52 on every chip).
LOWERING_LIBTPU: tuple[tuple[str, str], ...] = (("0.12.1", "0.0.53"),)


def lowering_libtpu(jax: str | None = None) -> str | None:
    """The oldest libtpu the installed jax's (or ``jax``'s) Mosaic lowering is written for;
    None where every libtpu coremesh tests with will do."""
    need = None
    for since, libtpu in LOWERING_LIBTPU:
        if jax_versions.at_least(since, jax):
            need = libtpu
    return need


@functools.cache
def warn_if_older_than_lowering(found: str, jax: str) -> bool:
    """Warn (once per pair) when libtpu ``found`` is older than jax ``jax``'s lowering expects:
    such a pair refuses some kernels that compile with the libtpu jax asks for, so a
    refusal may be the pair's, not the kernel's. True when it warned."""
    need = lowering_libtpu(jax)
    if need is None or parse(found) >= parse(need):
        return False
    warnings.warn(
        f"jax {jax}'s Mosaic lowering is written for libtpu {need} or newer, and libtpu {found} "
        "is installed: compile checks may refuse kernels that compile on a TPU with "
        f"jax {jax} (e.g. '!=' of floats: 'Unsupported comparison direction: une'). Install "
        f"libtpu>={need}, or jax=={jax_versions.TESTED[-1]} (the newest jax coremesh is tested "
        f"on, with libtpu {TESTED_LIBTPU})",
        CoremeshWarning,
        stacklevel=3,
    )
    return True


def require_compiler() -> str:
    """The installed libtpu's version; ``LibtpuError`` when there is none (and a warning when
    it is older than the installed jax's lowering expects)."""
    found = libtpu_version()
    check_libtpu(found, needed=None, purpose="compile-only checks")
    assert found is not None
    warn_if_older_than_lowering(found, jax_version())
    return found


def require_static_profile() -> str:
    """The installed libtpu's version; ``LibtpuError`` unless it gives static estimates."""
    found = libtpu_version()
    check_libtpu(found, needed=STATIC_PROFILE_LIBTPU, purpose="static cycle estimates")
    assert found is not None
    return found


@dataclasses.dataclass(frozen=True)
class CompilerChange:
    """``kernel`` behaves as ``before`` says up to jax ``since`` and as ``after`` says from it on
    (libtpu 0.0.52 on every line)."""

    since: str
    kernel: str
    before: str
    after: str


#: Kernels whose compile verdict depends on the jax line; measured on 0.10.2, 0.11.2, 0.12.0.1.
COMPILER_CHANGES: dict[str, CompilerChange] = {
    "bool_operand": CompilerChange(
        since="0.11.0",
        kernel="a kernel whose operand or result is a bool array (it moves by DMA)",
        before="refused: jax 0.10's Mosaic lowering refuses every DMA of bool elements "
        "('DMAs with bool dtypes are not supported')",
        after="compiles: jax 0.11 removed the refusal",
    ),
    "x64_pipeline": CompilerChange(
        since="0.12.0",
        kernel="a float32 emit_pipeline traced with jax_enable_x64 on",
        before="refused: the pipeline's loop indices become 64-bit and Mosaic's verifier "
        "refuses 'arith.cmpi' on (i32, i64) operands",
        after="compiles",
    ),
    "traced_attribute": CompilerChange(
        since="0.11.0",
        kernel="a kernel that reads ref.memory_space (or .sharding) while tracing",
        before="compiles: jax 0.10's tracers forward the attribute to their abstract value",
        after="refused: the tracer raises ValueError ('Use `jax.typeof(x).memory_space` "
        "instead'), which getattr with a default does not catch",
    ),
}


def has_change(name: str, found: str | None = None) -> bool:
    """Does the installed jax (or ``found``) behave as ``COMPILER_CHANGES[name].after`` says?"""
    return jax_versions.at_least(COMPILER_CHANGES[name].since, found)
