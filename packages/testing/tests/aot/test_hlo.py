"""Copies into VMEM read from compiled HLO: what libtpu's static profile leaves out."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from coremesh.core.sharding import on_devices
from coremesh.testing.aot import Arg, compile_program, jitted_program
from coremesh.testing.aot.cycles import CycleEstimate
from coremesh.testing.aot.hlo import vmem_copy_bytes
from coremesh.testing.aot.profile_dump import OpCycles
from coremesh.testing.aot.roofline import Work, cycles_to_seconds, roofline_for

HLO = """
  %param = bf16[2048,2048]{1,0:T(8,128)(2,1)} parameter(0), metadata={op_name="a"}
  %copy-start = (bf16[2048,2048]{1,0:T(8,128)(2,1)S(1)}, bf16[2048,2048]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%param), cross_program_prefetch_index=0, backend_config={"dma_priority":1}
  %copy-start.1 = (f32[64,128]{1,0:S(1)}, f32[64,128]{1,0}, u32[]{:S(2)}) copy-start(%param.2), backend_config={}
  %copy-start.2 = (s32[3,5]{1,0:S(1)}, s32[3,5]{1,0}, u32[]{:S(2)}) copy-start(%param.3), cross_program_prefetch_index=1
  %copy-start.3 = (f32[32,128]{1,0}, f32[32,128]{1,0:S(1)}, u32[]{:S(2)}) copy-start(%fusion.1)
"""  # noqa: E501


def test_copies_into_vmem_count() -> None:
    # Cross-program prefetches and the plain copy into VMEM count; the copy out of VMEM
    # (copy-start.3: its destination has no S(1)) does not.
    assert vmem_copy_bytes(HLO) == 2048 * 2048 * 2 + 64 * 128 * 4 + 3 * 5 * 4
    assert vmem_copy_bytes("ROOT %add = f32[8] add(%a, %b)") == 0


@pytest.mark.aot
def test_xlas_row_max_prefetches_its_whole_input_on_v5e() -> None:
    # XLA's x.max(1) of a 16 MiB per-device array copies all of it into VMEM first: the read
    # its static estimate (below the HBM roofline) does not charge.
    prog = jitted_program(
        lambda x: x.max(1), lambda n: [Arg((4096 * n, 1024), jnp.float32, P("device", None))]
    )
    (r,) = compile_program(prog, ["v5e"], keep_executable=True)
    assert r.ok
    assert vmem_copy_bytes(r.compiled.as_text()) == 4096 * 1024 * 4
    assert "cross_program_prefetch_index" in r.compiled.as_text()


def _max_of_rows_in_vmem(x: jax.Array) -> jax.Array:
    """A Pallas kernel taking its whole operand in VMEM (memory_space=VMEM, no grid)."""

    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jnp.max(x_ref[...], axis=1).reshape(1, -1)

    def per_device(x: jax.Array) -> jax.Array:
        vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
        out = jax.ShapeDtypeStruct((1, x.shape[0]), x.dtype)
        call = pl.pallas_call(body, out_shape=out, in_specs=[vmem], out_specs=vmem)
        result: jax.Array = call(x)
        return result

    rows = on_devices(per_device, in_specs=(P("device", None),), out_specs=P(None, "device"))
    out: jax.Array = rows(x)
    return out


@pytest.mark.aot
def test_a_kernels_vmem_operand_is_copied_in_inside_the_program_on_tpu7x() -> None:
    # XLA brings the 4 MiB operand in with an ordinary copy-start before the kernel, which the
    # static profile does not charge either.
    prog = jitted_program(
        _max_of_rows_in_vmem,
        lambda n: [Arg((1024 * n, 1024), jnp.float32, P("device", None))],
        name="max_of_rows_in_vmem",
    )
    (r,) = compile_program(prog, ["TPU7x"], keep_executable=True)
    assert r.ok
    text = r.compiled.as_text()
    assert vmem_copy_bytes(text) == 1024 * 1024 * 4
    assert "cross_program_prefetch_index" not in text


def test_charged_seconds_add_the_prefetch_at_hbm_bandwidth() -> None:
    roof = roofline_for(Work(2**24), "v5e")
    e = CycleEstimate(
        program="p", variant="xla", chip="v5e", topology="v5e:2x2", mode="single",
        num_devices=4, cores_per_device=1, status="ok", roofline=roof,
        prefetch_bytes=2**24,
    )  # fmt: skip
    assert e.charged_seconds() is None  # no cycles, nothing to charge on top of
    e = dataclasses.replace(e, ops=(OpCycles("fusion", "xla", 1500, None),))
    expected = cycles_to_seconds(1500, "v5e") + 2**24 / roof.hbm_bytes_per_s
    assert e.charged_seconds() == pytest.approx(expected)
    assert e.charged_seconds(kernels_only=True) is None  # XLA's program has no Pallas kernel
