"""The TensorCore backend keeps the backend contract, and every path applies its checks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.testing.conformance import BackendSuite

pytestmark = pytest.mark.sim


class TestTensorCoreBackend(BackendSuite):
    @pytest.fixture
    def backend(self) -> cc.Backend:
        return cc.get_backend("tensorcore")

    @pytest.fixture
    def make_mesh(self) -> Any:
        return tc.mesh

    @pytest.fixture
    def target(self, sim: Any) -> Any:
        return sim


def _body(o_ref: Any, buf: Any) -> None:
    pass


@pytest.mark.parametrize("build", ["tc.kernel", "coremesh.core.kernel"])
def test_both_entry_points_refuse_float16_results_and_padded_scratch(sim: Any, build: str) -> None:
    # Before this contract coremesh.core.kernel skipped tc.kernel's checks.
    def make(out_type: Any, scratch: Any = ()) -> Any:
        if build == "tc.kernel":
            return tc.kernel(_body, out_type=out_type, scratch=scratch)
        return cc.kernel(_body, out_type=out_type, scratch=scratch, mesh=tc.mesh())

    with pytest.raises(cc.UnsupportedOnChipError, match="float16"):
        make(jax.ShapeDtypeStruct((8, 128), jnp.float16))
    # (70000, 1) float32 is 273 KiB of data but 70000 / 8 tiles of (8, 128): 34 MiB > 16 MiB.
    with pytest.raises(cc.CapacityError, match=r"34\.18 MiB of VMEM"):
        make(jax.ShapeDtypeStruct((8, 128), jnp.float32), [pltpu.VMEM((70000, 1), jnp.float32)])


def test_padded_scratch_is_what_the_compile_check_counts() -> None:
    # A hand count: (9, 130) float32 pads to (16, 256) on every chip's 32-bit tile.
    assert cc.padded_nbytes((9, 130), jnp.float32, "v5p") == 16 * 256 * 4
    assert cc.padded_nbytes((9, 130), jnp.bfloat16, "v5p") == 16 * 256 * 2
    assert cc.padded_nbytes((1000,), jnp.float32, "v5p") == 4000  # 1-D: no tile padding
    scratch = [pltpu.VMEM((9, 130), jnp.float32), pltpu.SMEM((3,), jnp.int32)]
    assert cc.scratch_bytes(scratch, "v5p") == {"vmem": 16 * 256 * 4, "smem": 12}
    assert cc.scratch_bytes(scratch, "v5p", tiled=False) == {"vmem": 9 * 130 * 4, "smem": 12}


def test_float16_operand_is_refused_before_tracing(sim: Any) -> None:
    traced = []

    def body(x_ref: Any, o_ref: Any) -> None:
        traced.append(True)

    k = tc.kernel(body, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    with pytest.raises(cc.UnsupportedOnChipError, match="float16"):
        k(np.zeros((8, 128), np.float16))
    assert not traced


def test_auto_collective_id_through_either_entry_point_is_the_same_id(sim: Any) -> None:
    out = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    a = tc.kernel(_body, out_type=out, name="shared_cid", collective_id="auto")
    b = cc.kernel(_body, out_type=out, mesh=tc.mesh(), name="shared_cid", collective_id="auto")
    assert isinstance(a.spec.collective_id, int) and a.spec.collective_id == b.spec.collective_id
    assert type(a) is type(b) is tc.TensorCoreKernel
