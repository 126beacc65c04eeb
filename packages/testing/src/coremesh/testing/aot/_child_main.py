"""The profiling child's entry: ``python -m coremesh.testing.aot._child_main < job.json``.

A module of its own because the package imports ``profile_child`` (the parent reads its ``MARK``),
and ``python -m`` on a module its package has already imported runs a second copy of it.
"""

from __future__ import annotations

import json
import sys

from coremesh.testing.aot.profile_child import run_job


def main() -> int:
    run_job(json.load(sys.stdin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
