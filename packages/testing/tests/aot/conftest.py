"""Compile-only tests: libtpu in this process, cycle profiles in child processes."""

from __future__ import annotations

import os

import pytest

# Another process may load libtpu at the same moment (a parallel test run, a profile child).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

PLUGINS = ("coremesh.testing.aot.pytest_support", "pytester")


def pytest_configure(config: pytest.Config) -> None:
    # The coremesh pytest plugin may already load the aot support; load it here otherwise.
    for name in PLUGINS:
        if not config.pluginmanager.has_plugin(name):
            config.pluginmanager.import_plugin(name)
