"""Compile-only tests use pytest's own ``pytester`` for the plugin tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")
