"""The jax releases coremesh supports, and the one check every package runs against them.

coremesh is tested on one release per jax line (``TESTED``). Anything from ``MINIMUM`` up to the
newest tested release is supported; a newer jax is allowed with a warning that names the tested
range (its internals may have moved), an older one is refused. Version-dependent spellings of
jax's API live in one small compatibility module per package, which asks :func:`at_least`.
"""

from __future__ import annotations

import re
import warnings
from functools import cache

from coremesh.core.errors import CoremeshError, CoremeshWarning

#: The release of each supported jax line that the suites run on, oldest first.
TESTED: tuple[str, ...] = ("0.10.2", "0.11.2", "0.12.0.1")
#: The oldest jax coremesh runs on.
MINIMUM = TESTED[0]
#: The Python each line needs at least (jax 0.11 and later need Python 3.12).
PYTHON_FOR_LINE: dict[str, tuple[int, int]] = {
    "0.10.2": (3, 11),
    "0.11.2": (3, 12),
    "0.12.0.1": (3, 12),
}

Version = tuple[int, ...]


def parse(version: str) -> Version:
    """``"0.12.0.1"`` -> ``(0, 12, 0, 1)``; pre-release and local tails (``.dev``, ``+cuda``) are
    dropped, so a nightly counts as the release it leads to."""
    match = re.match(r"\d+(\.\d+)*", version.strip())
    if match is None:
        raise CoremeshError(
            f"cannot read the jax version {version!r}",
            rule="jax versions are dotted numbers such as 0.12.0.1",
            fix="reinstall jax from the package index",
        )
    parts = [int(p) for p in match.group(0).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()  # 0.12.0 == 0.12
    return tuple(parts)


def installed() -> str:
    import jax

    return str(jax.__version__)


def at_least(version: str, found: str | None = None) -> bool:
    """Is the installed jax (or ``found``) ``version`` or newer?"""
    return parse(installed() if found is None else found) >= parse(version)


def supported_range() -> str:
    return f"jax {MINIMUM} to {TESTED[-1]}"


@cache
def _warned(found: str) -> bool:
    warnings.warn(
        f"jax {found} is newer than any release coremesh is tested on ({supported_range()}); "
        "the simulator patches jax internals, which may have moved. If something fails, install "
        f"jax=={TESTED[-1]} jaxlib=={TESTED[-1]} or report it.",
        CoremeshWarning,
        stacklevel=4,
    )
    return True


def check(found: str | None = None) -> None:
    """Refuse a jax older than :data:`MINIMUM`; warn (once per version) about one newer than the
    newest tested release."""
    version = installed() if found is None else found
    if parse(version) < parse(MINIMUM):
        raise CoremeshError(
            f"jax {version} is installed, and coremesh needs at least jax {MINIMUM}",
            rule=f"coremesh supports {supported_range()}",
            fix=f'pip install "jax>={MINIMUM}" (jax 0.11 and later need Python 3.12 or newer)',
        )
    if parse(version) > parse(TESTED[-1]):
        _warned(version)


def line_of(found: str | None = None) -> str:
    """The tested release of the line ``found`` belongs to (its major.minor), else the nearest
    tested release below it."""
    version = parse(installed() if found is None else found)
    same = [t for t in TESTED if parse(t)[:2] == version[:2]]
    if same:
        return same[-1]
    older = [t for t in TESTED if parse(t) <= version]
    return older[-1] if older else TESTED[0]
