"""The upstream tests' device gates, answering for the simulated chip.

JAX's TPU tests decide whether to run from ``jax._src.test_util``: ``device_under_test()``
(``"tpu"``, ``"cpu"``), and from the device kind of ``jax.devices()[0]`` in ``get_tpu_version()``
and ``is_device_tpu(version, variant)``. On a CPU host those say ``"cpu"``. The shim replaces
``device_under_test`` with the test's :class:`~coremesh.testing.upstream.needs.Needs` and runs jax's
own ``get_tpu_version`` and ``is_device_tpu`` against the simulated chip's device kind (so their
matching rules stay jax's). ``test_device_matches`` and ``is_device_tpu_at_least`` call these
through the module, so they follow. Nothing else of ``test_util`` changes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from coremesh.core.chips import get_chip
from coremesh.testing.upstream.needs import DEFAULT, Needs

#: The gates replaced, by name in ``jax._src.test_util``.
GATES = ("device_under_test", "get_tpu_version", "is_device_tpu")

#: The module ``get_tpu_version`` and ``is_device_tpu`` read the device kind through.
_BRIDGE = "xla_bridge"

_current: list[Needs] = [DEFAULT]


def set_needs(needs: Needs) -> None:
    """What the gates answer from now on (the shim sets it before each test)."""
    _current[0] = needs


def current_needs() -> Needs:
    return _current[0]


@dataclasses.dataclass(frozen=True)
class _Device:
    device_kind: str


class _XlaBridgeView:
    """``xla_bridge`` as the gates read it: ``devices()`` is one device of the simulated kind."""

    def __init__(self, real: ModuleType, device_kind: str) -> None:
        self._real = real
        self._kind = device_kind

    def devices(self, *args: Any, **kwargs: Any) -> list[_Device]:
        del args, kwargs  # one device, whatever backend is asked for
        return [_Device(self._kind)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _on_simulated_kind(jtu: ModuleType, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def gate(*args: Any, **kwargs: Any) -> Any:
        real = getattr(jtu, _BRIDGE)
        setattr(jtu, _BRIDGE, _XlaBridgeView(real, get_chip(current_needs().chip).device_kind))
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(jtu, _BRIDGE, real)

    return gate


def _test_util(jtu: ModuleType | None) -> ModuleType:
    return jtu if jtu is not None else importlib.import_module("jax._src.test_util")


def install(jtu: ModuleType | None = None) -> dict[str, Any]:
    """Replace the gates in ``jtu`` (``jax._src.test_util``); returns the originals."""
    module = _test_util(jtu)
    originals = {name: getattr(module, name) for name in GATES}

    def device_under_test() -> str:
        return current_needs().device_under_test

    replacements = {
        "device_under_test": device_under_test,
        "get_tpu_version": _on_simulated_kind(module, originals["get_tpu_version"]),
        "is_device_tpu": _on_simulated_kind(module, originals["is_device_tpu"]),
    }
    for name, fn in replacements.items():
        setattr(module, name, fn)
    return originals


def uninstall(originals: dict[str, Any], jtu: ModuleType | None = None) -> None:
    module = _test_util(jtu)
    for name, fn in originals.items():
        setattr(module, name, fn)
