"""The SparseCore backend keeps the backend contract; its ops build kernels through it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

import coremesh.core as cc
import coremesh.sparsecore as sc
from coremesh.testing.conformance import BackendSuite

pytestmark = [pytest.mark.sim(devices=1)]


class _SparseCore(BackendSuite):
    @pytest.fixture
    def backend(self) -> cc.Backend:
        return cc.get_backend("sparsecore")

    @pytest.fixture
    def target(self, sim: Any) -> Any:
        return sim


class TestVectorSubcores(_SparseCore):
    @pytest.fixture
    def make_mesh(self) -> Any:
        return sc.mesh


class TestScalarSubcores(_SparseCore):
    @pytest.fixture
    def make_mesh(self) -> Any:
        return lambda: sc.mesh(cc.CoreKind.SPARSE_SCALAR)


def test_scratch_over_a_subcores_vmem_is_refused_on_every_path(sim: Any) -> None:
    # Before this contract sc.kernel checked no scratch at all.
    cap = sim.chip.sparsecore.vmem_bytes_per_subcore
    scratch = [pltpu.VMEM((cap // 4 + 1,), jnp.int32)]
    out = jax.ShapeDtypeStruct((16,), jnp.int32)
    for make in (sc.kernel, lambda b, **kw: cc.kernel(b, mesh=sc.mesh(), **kw)):
        with pytest.raises(cc.CapacityError, match="SparseCore VMEM"):
            make(lambda *refs: None, out_type=out, scratch=scratch)


def test_sparsecore_kernels_are_specs_with_their_backend(sim: Any) -> None:
    out = jax.ShapeDtypeStruct((16,), jnp.int32)
    k = sc.kernel(lambda *refs: None, out_type=out, name="sc_spec")
    assert type(k) is sc.SparseCoreKernel
    assert k.spec.mesh == sc.mesh() and k.spec.name == "sc_spec"
    mpmd = sc.kernel(
        [lambda *refs: None] * 2, out_type=out, mesh=[sc.mesh(), sc.mesh(cc.CoreKind.SPARSE_SCALAR)]
    )
    assert mpmd.spec.is_mpmd and len(mpmd.spec.meshes) == 2
