"""Child process for static cycle estimates: ``python -m coremesh.testing.aot._worker < job.json``.

Started by ``coremesh.testing.aot.cycles.profile`` with ``LIBTPU_INIT_ARGS`` already set; prints one
marked JSON line when it starts each program and one with the result.
"""

from __future__ import annotations

import json
import sys

from coremesh.testing.aot.cycles import run_job


def main() -> int:
    run_job(json.load(sys.stdin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
