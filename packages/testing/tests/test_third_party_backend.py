"""A third-party backend, installed the way a distribution installs one, serves every op.

``acme`` registers under the ``coremesh.backends`` entry points from a ``.dist-info`` on
``sys.path`` and builds TensorCore kernels on ``coremesh.core.PallasKernel`` (without the
tensorcore backend's HBM pinning), recording each spec. It passes the backend and TensorCore
conformance suites, and the ops (map_blocks, matmul, reduce, gather_blocks, and collectives'
all_gather) run through it with results equal to numpy's.
"""

from __future__ import annotations

import sys
import textwrap
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.core import backends
from coremesh.core.dtypes import mxu_operand
from coremesh.testing.conformance import BackendSuite, TensorCoreKernelSuite

pytestmark = pytest.mark.sim(devices=2)

ACME = '''
"""A TensorCore backend outside coremesh, for the backend contract's tests."""
import importlib.util

from coremesh.core import CoreKind, KernelSpec, PallasKernel, check_operand_dtype

BUILT: list[KernelSpec] = []


class AcmeKernel(PallasKernel):
    backend_name = "acme"
    kinds = frozenset({CoreKind.TENSOR})
    dtype_rule = staticmethod(check_operand_dtype)

    def __init__(self, spec: KernelSpec) -> None:
        super().__init__(spec)
        BUILT.append(self.spec)


class AcmeBackend:
    name = "acme"
    core_kinds = frozenset({CoreKind.TENSOR})

    def is_available(self) -> bool:
        return importlib.util.find_spec("jax.experimental.pallas.tpu") is not None

    def make_kernel(self, spec: KernelSpec) -> AcmeKernel:
        return AcmeKernel(spec)
'''


@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Install ``acme`` for this module: a module and its dist-info with the entry point."""
    root = tmp_path_factory.mktemp("site")
    (root / "acme_backend.py").write_text(textwrap.dedent(ACME))
    info = root / "acme_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[coremesh.backends]\nacme = acme_backend:AcmeBackend\n")
    sys.path.insert(0, str(root))
    backends.refresh()
    try:
        import acme_backend  # type: ignore[import-not-found]  # written above, at run time

        yield acme_backend
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("acme_backend", None)
        backends.refresh()


@pytest.fixture
def built(acme: Any) -> Iterator[list[cc.KernelSpec]]:
    acme.BUILT.clear()
    with cc.using_backend("acme"):
        yield acme.BUILT


def test_it_is_discovered_and_asked_for_by_name(acme: Any) -> None:
    assert "acme" in cc.available_backends()
    assert cc.get_backend("acme").name == "acme"


def test_two_backends_for_one_kind_warn_unless_one_is_chosen(acme: Any, sim: Any) -> None:
    with pytest.warns(cc.CoremeshWarning, match="several backends serve tensor meshes"):
        cc.backend_for(cc.CoreKind.TENSOR)
    with cc.using_backend("acme"), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cc.backend_for(cc.CoreKind.TENSOR).name == "acme"
        assert cc.backend_for(cc.CoreKind.SPARSE_VECTOR).name == "sparsecore"


class TestAcmeContract(BackendSuite):
    @pytest.fixture
    def backend(self, acme: Any) -> cc.Backend:
        return cc.get_backend("acme")

    @pytest.fixture
    def make_mesh(self) -> Any:
        return tc.mesh

    @pytest.fixture
    def target(self, sim: Any) -> Any:
        return sim


@pytest.mark.usefixtures("built")
class TestAcmeKernels(TensorCoreKernelSuite):
    @pytest.fixture
    def target(self, sim: Any) -> Any:
        return sim

    @pytest.fixture
    def make_mesh(self) -> Any:
        return tc.mesh

    @pytest.fixture
    def make_pipeline(self) -> Any:
        return tc.pipeline

    @pytest.fixture
    def supports_inter_core_dma(self) -> bool:
        return True


def _per_device(fn: Any, sim: Any, in_specs: Any, out_specs: Any) -> Any:
    return jax.jit(
        jax.shard_map(
            fn, mesh=sim.device_mesh(), in_specs=in_specs, out_specs=out_specs, check_vma=False
        )
    )


def test_tensorcore_ops_run_through_it(built: list[cc.KernelSpec], sim: Any) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    y = rng.standard_normal((256, 256)).astype(np.float32)

    np.testing.assert_allclose(np.asarray(tc.map_blocks(jnp.tanh, x)), np.tanh(x), rtol=1e-5)
    assert len(built) == 1
    want = mxu_operand(x).astype(np.float64) @ mxu_operand(y)  # the MXU's default precision
    np.testing.assert_allclose(np.asarray(tc.matmul(x, y)), want, rtol=2e-4, atol=2e-3)
    np.testing.assert_allclose(
        np.asarray(tc.reduce(x, axis=0)), x.sum(axis=0), rtol=1e-4, atol=1e-3
    )
    idx = np.array([3, 0, 31, 7], np.int32)
    blocks = np.asarray(tc.gather_blocks(x, idx, block_rows=8))
    np.testing.assert_array_equal(blocks, x.reshape(32, 8, 256)[idx].reshape(-1, 256))
    assert len(built) >= 4 and all(isinstance(s.mesh, tc.TensorCoreMesh) for s in built)


def test_collectives_run_through_it(built: list[cc.KernelSpec], sim: Any) -> None:
    import coremesh.collectives as cl

    x = np.arange(2 * 8 * 128, dtype=np.float32).reshape(16, 128)
    f = _per_device(lambda s: cl.all_gather(s, "device", tiled=True), sim, P("device"), P())
    np.testing.assert_array_equal(np.asarray(f(x)), x)
    assert built, "all_gather built no kernel through the chosen backend"
