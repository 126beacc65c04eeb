"""Backend discovery: lazy, cached, loud on duplicates, missing names and broken imports."""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from types import MappingProxyType
from typing import Any

import pytest

from coremesh.core import (
    BackendError,
    CoreKind,
    CoremeshWarning,
    KernelSpec,
    backends,
    get_chip,
    kernel,
)


class FakeMesh:
    kind = CoreKind.TENSOR
    chip = get_chip("v5p")
    axes = MappingProxyType({"core": 2})

    def pallas_mesh(self) -> Any:
        return None


class FakeKernel:
    def __init__(self, spec: KernelSpec, by: str) -> None:
        self.spec, self.by = spec, by

    def __call__(self, *args: Any) -> Any:
        return (self.by, args)


class FakeBackend:
    loads = 0

    def __init__(self, name: str, kinds: frozenset[CoreKind], available: bool = True) -> None:
        FakeBackend.loads += 1
        self.name, self.core_kinds, self._ok = name, kinds, available

    def is_available(self) -> bool:
        return self._ok

    def make_kernel(self, spec: KernelSpec) -> FakeKernel:
        return FakeKernel(spec, self.name)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Entry points served from a dict name -> 'module:attr' over a fake module."""
    mod = types.ModuleType("fake_backends")
    mod.tc = FakeBackend("tc", frozenset({CoreKind.TENSOR}))  # type: ignore[attr-defined]
    mod.tc2 = FakeBackend("tc2", frozenset({CoreKind.TENSOR}))  # type: ignore[attr-defined]
    mod.sc = FakeBackend("sc", frozenset({CoreKind.SPARSE_VECTOR}), False)  # type: ignore[attr-defined]
    mod.notabackend = object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_backends", mod)
    eps: dict[str, str] = {}
    extra: list[EntryPoint] = []

    def fake_entry_points(group: str) -> list[EntryPoint]:
        assert group == backends.GROUP
        return [EntryPoint(n, v, group) for n, v in eps.items()] + extra

    monkeypatch.setattr(backends, "entry_points", fake_entry_points)
    backends.refresh()
    eps["_extra"] = ""  # placeholder removed below; keeps the dict typed for callers
    del eps["_extra"]
    yield eps
    backends.refresh()


def test_discovery_is_lazy_and_cached(registry: dict[str, str]) -> None:
    registry["tc"] = "fake_backends:tc"
    assert backends.available_backends() == ("tc",)
    b1 = backends.get_backend("tc")
    assert backends.get_backend("tc") is b1


def test_missing_backend_by_name_is_loud(registry: dict[str, str]) -> None:
    registry["tc"] = "fake_backends:tc"
    with pytest.raises(
        BackendError, match=r"(?s)no coremesh backend named 'nope'.*installed backends: tc"
    ):
        backends.get_backend("nope")


def test_broken_backend_is_named(registry: dict[str, str]) -> None:
    registry["broken"] = "no_such_module_xyz:thing"
    with pytest.raises(BackendError, match=r"backend 'broken' \(no_such_module_xyz:thing\) failed"):
        backends.get_backend("broken")


def test_object_that_is_not_a_backend(registry: dict[str, str]) -> None:
    registry["odd"] = "fake_backends:notabackend"
    with pytest.raises(BackendError, match="is not a coremesh Backend"):
        backends.get_backend("odd")


def test_unavailable_backend_by_name(registry: dict[str, str]) -> None:
    registry["sc"] = "fake_backends:sc"
    with pytest.raises(BackendError, match="cannot run in this process"):
        backends.get_backend("sc")


def test_duplicate_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def dup(group: str) -> list[EntryPoint]:
        return [EntryPoint("tc", "a:b", group), EntryPoint("tc", "c:d", group)]

    monkeypatch.setattr(backends, "entry_points", dup)
    backends.refresh()
    try:
        with pytest.raises(BackendError, match="two backends are registered as 'tc'"):
            backends.available_backends()
    finally:
        backends.refresh()


def test_kernel_dispatches_on_mesh_kind(registry: dict[str, str]) -> None:
    registry["tc"] = "fake_backends:tc"
    registry["sc"] = "fake_backends:sc"
    k = kernel(lambda: None, out_type=(), mesh=FakeMesh(), name="k")
    assert k.spec.name == "k"
    assert k(1) == ("tc", (1,))


def test_discovery_warns_when_several_backends_could_serve(registry: dict[str, str]) -> None:
    registry["tc"] = "fake_backends:tc"
    registry["tc2"] = "fake_backends:tc2"
    with pytest.warns(CoremeshWarning, match=r"several backends serve tensor meshes \(tc, tc2\)"):
        k = kernel(lambda: None, out_type=(), mesh=FakeMesh())
    assert k(0)[0] == "tc"


def test_no_backend_for_kind(registry: dict[str, str]) -> None:
    registry["sc"] = "fake_backends:sc"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(BackendError, match="no installed backend serves tensor meshes"):
            kernel(lambda: None, out_type=(), mesh=FakeMesh())


def test_pallas_kernel_refuses_a_mesh_of_another_kind() -> None:
    from coremesh.core import MeshError
    from coremesh.core.kernel import PallasKernel

    class TensorOnly(PallasKernel):
        backend_name = "tensor-only"
        kinds = frozenset({CoreKind.TENSOR})

    class SparseMesh(FakeMesh):
        kind = CoreKind.SPARSE_VECTOR

    spec = KernelSpec(body=lambda: None, out_type=(), mesh=SparseMesh())
    with pytest.raises(MeshError, match="the tensor-only backend got a sparse_vector mesh") as e:
        TensorOnly(spec)
    assert e.value.chip == "v5p"
