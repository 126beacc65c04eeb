"""Backend conformance: what every coremesh backend does with a ``KernelSpec``.

A backend's tests subclass ``BackendSuite`` and override ``backend`` (the object its entry point
registers), ``make_mesh`` (a mesh of one kind it serves, for the active target) and ``target``.
The suite checks the contract ops rely on when they hand a spec to whichever backend serves its
kind: the spec is kept, a foreign kind is refused, the chip's memory and dtype limits are
checked before anything is traced, ``collective_id="auto"`` is resolved, and the kernel runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import coremesh.core as cc

_OVERRIDE = "a backend's conformance test class must override this fixture"


class _ForeignMesh:
    """A mesh of a kind the backend under test does not serve (its body is never traced)."""

    def __init__(self, kind: cc.CoreKind, chip: cc.Chip) -> None:
        self.kind, self.chip, self.axes = kind, chip, {"core": 1}

    def pallas_mesh(self) -> Any:
        raise AssertionError("a refused spec must not reach pl.kernel")


def _never_traced(*_refs: Any) -> None:
    raise AssertionError("a refused spec must not be traced")


class BackendSuite:
    pytestmark = pytest.mark.usefixtures("target")  # every check runs inside the target

    @pytest.fixture
    def backend(self) -> cc.Backend:
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def make_mesh(self) -> Callable[[], cc.CoreMesh]:
        raise NotImplementedError(_OVERRIDE)

    @pytest.fixture
    def target(self) -> Any:
        """An active coremesh target that runs kernels (``with simulate(...) as sim``)."""
        raise NotImplementedError(_OVERRIDE)

    def _spec(self, mesh: cc.CoreMesh, **kw: Any) -> cc.KernelSpec:
        out = kw.pop("out_type", jax.ShapeDtypeStruct((8, 128), jnp.float32))
        return cc.KernelSpec(body=_never_traced, out_type=out, mesh=mesh, **kw)

    def test_is_a_backend_that_serves_the_mesh(self, backend: cc.Backend, make_mesh: Any) -> None:
        assert isinstance(backend, cc.Backend)
        assert backend.name
        assert backend.is_available()
        assert make_mesh().kind in backend.core_kinds

    def test_keeps_the_spec(self, backend: cc.Backend, make_mesh: Any) -> None:
        spec = self._spec(make_mesh(), name="conformance_spec", collective_id=3)
        k = backend.make_kernel(spec)
        assert isinstance(k, cc.Kernel)
        assert k.spec == spec

    def test_refuses_a_kind_it_does_not_serve(self, backend: cc.Backend, make_mesh: Any) -> None:
        foreign = next(k for k in cc.CoreKind if k not in backend.core_kinds)
        mesh = _ForeignMesh(foreign, make_mesh().chip)
        with pytest.raises(cc.MeshError, match=foreign.value) as e:
            backend.make_kernel(self._spec(mesh))
        assert e.value.chip == mesh.chip.name

    def test_refuses_scratch_the_chip_cannot_hold(
        self, backend: cc.Backend, make_mesh: Any
    ) -> None:
        mesh = make_mesh()
        chip = mesh.chip
        if mesh.kind is cc.CoreKind.TENSOR:
            # 256 KiB of (n, 1) float32 is n tiles of (8, 128) once padded: over the limit.
            rows = chip.scoped_vmem_default_bytes // (128 * 4) + 8
            scratch = [pltpu.VMEM((rows, 1), jnp.float32)]
            assert rows * 4 < chip.scoped_vmem_default_bytes
        else:
            assert chip.sparsecore is not None
            words = chip.sparsecore.vmem_bytes_per_subcore // 4 + 1
            scratch = [pltpu.VMEM((words,), jnp.int32)]
        with pytest.raises(cc.CapacityError, match="scratch of kernel too_big") as e:
            backend.make_kernel(self._spec(mesh, scratch=scratch, name="too_big"))
        assert e.value.chip == chip.name

    def test_refuses_a_result_dtype_no_tpu_holds(self, backend: cc.Backend, make_mesh: Any) -> None:
        out = jax.ShapeDtypeStruct((8, 128), np.dtype("float64"))
        with pytest.raises(cc.UnsupportedOnChipError, match="float64"):
            backend.make_kernel(self._spec(make_mesh(), out_type=out))

    def test_allocates_an_auto_collective_id(self, backend: cc.Backend, make_mesh: Any) -> None:
        first = backend.make_kernel(self._spec(make_mesh(), collective_id="auto", name="cid"))
        again = backend.make_kernel(self._spec(make_mesh(), collective_id="auto", name="cid"))
        assert isinstance(first.spec.collective_id, int)
        assert first.spec.collective_id == again.spec.collective_id

    def test_runs_a_kernel(self, backend: cc.Backend, make_mesh: Any, target: Any) -> None:
        """The first core of each device copies its input shard to the output through VMEM.

        Outputs start as garbage on the simulator (NaN, max int), so a kernel that did not run
        cannot pass."""
        mesh = make_mesh()

        def body(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
            first = jnp.bool_(True)
            for axis in mesh.axes:
                first = first & (jax.lax.axis_index(axis) == 0)

            @pl.when(first)
            def _() -> None:
                pltpu.sync_copy(x_hbm, buf)
                pltpu.sync_copy(buf, o_hbm)

        def local(x: jax.Array) -> jax.Array:
            spec = cc.KernelSpec(
                body=body,
                out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                mesh=make_mesh(),
                scratch=(pltpu.VMEM(x.shape, x.dtype),),
            )
            return backend.make_kernel(spec)(x)

        rows = 8 * target.num_devices
        f = jax.jit(
            jax.shard_map(
                local,
                mesh=target.device_mesh(),
                in_specs=P("device"),
                out_specs=P("device"),
                check_vma=False,
            )
        )
        x = np.arange(rows * 16, dtype=np.int32).reshape(rows, 16)
        np.testing.assert_array_equal(np.asarray(f(x)), x)
