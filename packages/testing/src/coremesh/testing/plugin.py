"""pytest plugin (entry point ``pytest11``): coremesh markers, fixtures and hang protection."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sim: runs on the CPU simulator")
    config.addinivalue_line("markers", "aot: compiles for real TPU generations with libtpu")
    config.addinivalue_line("markers", "tpu: needs real TPU hardware")
