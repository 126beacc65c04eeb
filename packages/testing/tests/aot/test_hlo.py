"""Cross-program prefetches read from compiled HLO: what libtpu's static profile leaves out."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from coremesh.testing.aot import Arg, compile_program, jitted_program
from coremesh.testing.aot.cycles import CycleEstimate, OpCycles
from coremesh.testing.aot.hlo import cross_program_prefetch_bytes
from coremesh.testing.aot.roofline import Work, cycles_to_seconds, roofline_for

HLO = """
  %param = bf16[2048,2048]{1,0:T(8,128)(2,1)} parameter(0), metadata={op_name="a"}
  %copy-start = (bf16[2048,2048]{1,0:T(8,128)(2,1)S(1)}, bf16[2048,2048]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%param), cross_program_prefetch_index=0, backend_config={"dma_priority":1}
  %copy-start.1 = (f32[64,128]{1,0:S(1)}, f32[64,128]{1,0}, u32[]{:S(2)}) copy-start(%param.2), backend_config={}
  %copy-start.2 = (s32[3,5]{1,0:S(1)}, s32[3,5]{1,0}, u32[]{:S(2)}) copy-start(%param.3), cross_program_prefetch_index=1
"""  # noqa: E501


def test_only_cross_program_prefetches_count() -> None:
    # The plain copy-start in the middle is an ordinary prefetch the profile does charge.
    assert cross_program_prefetch_bytes(HLO) == 2048 * 2048 * 2 + 3 * 5 * 4
    assert cross_program_prefetch_bytes("ROOT %add = f32[8] add(%a, %b)") == 0


@pytest.mark.aot
def test_xlas_row_max_prefetches_its_whole_input_on_v5e() -> None:
    # XLA's x.max(1) of a 16 MiB per-device array copies all of it into VMEM first: the read
    # its static estimate (below the HBM roofline) does not charge.
    prog = jitted_program(
        lambda x: x.max(1), lambda n: [Arg((4096 * n, 1024), jnp.float32, P("device", None))]
    )
    (r,) = compile_program(prog, ["v5e"], keep_executable=True)
    assert r.ok
    assert cross_program_prefetch_bytes(r.compiled.as_text()) == 4096 * 1024 * 4


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
