"""coremesh's own checks refuse what cannot compile before jax traces it or libtpu sees it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from coremesh.core.errors import (
    CapacityError,
    CompileError,
    LayoutError,
    MeshError,
    UnsupportedOnChipError,
)
from coremesh.testing.aot import Arg, CompileResult, FunctionProgram, compile_on
from coremesh.testing.aot import samples as kp
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.aot.validate import (
    BlockUse,
    Declared,
    Scratch,
    argument_structs,
    kernel_memory,
)

MIB = 1024 * 1024


class BuildSpy:
    """Wraps a program and records whether it was ever built (traced)."""

    def __init__(self, program: Any, **overrides: Callable[..., Any]) -> None:
        self.program = program
        self.overrides = overrides
        self.built = 0

    def __getattr__(self, name: str) -> Any:
        if name in self.overrides:
            return self.overrides[name]
        return getattr(self.program, name)

    def build(self, mesh: Any) -> Any:
        self.built += 1
        return self.program.build(mesh)


def target(chip: str, **kw: Any) -> CompileTarget:
    return CompileTarget.for_chip(chip, **kw)


def error_of(r: CompileResult) -> Any:
    assert r.error is not None
    return r.error


@pytest.mark.timeout(120)
def test_float64_is_refused_before_tracing_even_with_x64_on() -> None:
    # With x64 on, jax 0.10.2 would loop forever tiling this float64 pipeline.
    spy = BuildSpy(kp.add_one(dtype=jnp.float64))
    with jax.enable_x64(True):
        r = compile_on(spy, target("v5p"))
    assert spy.built == 0
    assert r.status == "unsupported"
    assert isinstance(r.error, UnsupportedOnChipError)
    assert not isinstance(r.error, CompileError)
    assert "float64" in error_of(r).what and "float32" in error_of(r).fix
    assert error_of(r).chip == "v5p"


@pytest.mark.parametrize("chip", ["v4", "v5e"])
@pytest.mark.parametrize("prevalidate", [True, False])
def test_sparsecore_program_on_a_chip_without_sparsecores(chip: str, prevalidate: bool) -> None:
    spy = BuildSpy(kp.SC_ADD_ONE)
    r = compile_on(spy, target(chip), prevalidate=prevalidate)
    assert spy.built == 0
    assert (r.status, r.expected, r.as_expected) == ("unsupported", "unsupported", True)
    assert isinstance(r.error, UnsupportedOnChipError)
    assert "SparseCore" in error_of(r).what and "v5p, v6e or TPU7x" in error_of(r).fix


def test_rows_that_do_not_split_over_the_devices() -> None:
    spy = BuildSpy(kp.ADD_ONE, arg_specs=lambda n: (jax.ShapeDtypeStruct((1002, 1024), "f4"),))
    r = compile_on(spy, target("v6e"))
    assert spy.built == 0 and r.status == "invalid"
    assert isinstance(r.error, LayoutError)
    assert "1002" in error_of(r).what and "pad dim 0 to 1004" in error_of(r).fix


def test_a_spec_over_an_unknown_axis() -> None:
    spy = BuildSpy(kp.ADD_ONE, in_specs=lambda: (jax.P("x", None),))
    r = compile_on(spy, target("v5e"))
    assert spy.built == 0
    assert isinstance(r.error, MeshError) and "'x'" in error_of(r).what


def _declared(decl: Declared) -> FunctionProgram:
    return FunctionProgram(
        name="declared",
        builder=kp.ADD_ONE.builder,
        args=kp.ADD_ONE.args,
        declared_fn=lambda n: decl,
    )


def test_declared_block_that_breaks_the_tile() -> None:
    decl = Declared(blocks=[BlockUse((4, 100), (1024, 1000), jnp.float32)])
    spy = BuildSpy(_declared(decl))
    r = compile_on(spy, target("v5p"))
    assert spy.built == 0 and r.status == "invalid"
    assert isinstance(r.error, LayoutError)
    assert "(8, 128)" in error_of(r).what


def test_declared_scratch_over_the_scoped_limit_and_under_a_raised_one() -> None:
    over = BuildSpy(_declared(Declared(scratch=[Scratch((12288, 1024), jnp.float32)])))
    r = compile_on(over, target("v5e"))
    assert over.built == 0 and isinstance(r.error, CapacityError)
    assert "48.00 MiB" in error_of(r).what and "vmem_limit_bytes" in error_of(r).fix
    raised = Declared(scratch=[Scratch((12288, 1024), jnp.float32)], vmem_limit_bytes=64 * MIB)
    assert compile_on(_declared(raised), target("v5e")).status == "ok"


def test_traced_scratch_over_the_scoped_limit_never_reaches_libtpu() -> None:
    spy = BuildSpy(kp.vmem_scratch(48))
    r = compile_on(spy, target("v5e"))
    assert spy.built == 1  # traced, then refused before lowering
    assert r.status == "invalid" and r.compile_seconds == 0
    assert isinstance(r.error, CapacityError) and not isinstance(r.error, CompileError)
    assert "48.00 MiB" in error_of(r).what and "16.00 MiB" in error_of(r).what
    assert "vmem_limit_bytes" in error_of(r).fix


def test_traced_check_follows_the_kernels_vmem_limit() -> None:
    assert compile_on(kp.vmem_scratch(48, vmem_limit_mib=64), target("v5e")).status == "ok"
    # libtpu 0.0.52 takes a limit above the physical 64 MiB of a v5p core and uses the physical.
    assert compile_on(kp.vmem_scratch(48, vmem_limit_mib=120), target("v5p")).status == "ok"
    r = compile_on(kp.vmem_scratch(100, vmem_limit_mib=120), target("v5p"))
    assert isinstance(r.error, CapacityError) and "physical 64.00 MiB" in error_of(r).fix


@pytest.mark.parametrize(
    ("rows", "chip", "status"),
    [(2048, "v5p", "invalid"), (768, "v6e", "invalid"), (768, "v5p", "ok")],
)
def test_traced_sparsecore_scratch_against_the_subcore_vmem(
    rows: int, chip: str, status: str
) -> None:
    r = compile_on(kp.sc_scratch(rows), target(chip))
    assert r.status == status
    if status == "invalid":
        assert isinstance(r.error, CapacityError)
        assert "SparseCore VMEM" in error_of(r).what


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "TPU7x"])
@pytest.mark.parametrize(
    "program",
    [kp.ADD_ONE, kp.ADD_ONE_BIG_BLOCKS, kp.vmem_scratch(16)],
    ids=lambda p: str(p.name),
)
def test_measured_vmem_equals_libtpus_scoped_allocation(chip: str, program: Any) -> None:
    # Independent reference: the scoped VMEM libtpu allocated for the kernel, from its HLO.
    t = target(chip)
    with t.activate():
        fn = program.build(t.mesh)
        args = [
            jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=t.sharding(p))
            for s, p in argument_structs(program, t.num_devices)
        ]
        traced = fn.trace(*args)
        (kernel,) = kernel_memory(traced.jaxpr, t.chip)
        hlo = traced.lower().compile().as_text()
    used = [
        int(s) for s in re.findall(r'"used_scoped_memory_configs":\[\{[^]]*"size":"(\d+)"', hlo)
    ]
    assert used == [kernel.vmem_bytes]
    assert kernel.smem_bytes == 0 and not kernel.sparsecore


def test_arguments_and_specs_must_pair_up() -> None:
    spy = BuildSpy(kp.ADD_ONE, in_specs=lambda: ())
    r = compile_on(spy, target("v5e"))
    assert spy.built == 0 and isinstance(r.error, MeshError)


def test_function_program_args_may_depend_on_the_device_count() -> None:
    p = FunctionProgram("p", kp.ADD_ONE.builder, lambda n: [Arg((8 * n, 128), jnp.float32)])
    structs = argument_structs(p, 4)
    assert [tuple(s.shape) for s, _ in structs] == [(32, 128)]
    assert structs[0][1] == jax.P()


def test_tensorcore_scratch_is_counted_padded_and_sparsecore_scratch_raw() -> None:
    # The kernel check and this check count scratch alike (core.capacity). (2, 130) float32 is
    # one (8, 256) tile block on a TensorCore; SparseCore subcore memory has no such tiles.
    from coremesh.core.chips import get_chip
    from coremesh.testing.aot.validate import check_declared

    v5p = get_chip("v5p")
    cap = v5p.sparsecore.vmem_bytes_per_subcore if v5p.sparsecore else 0
    # Raw, a (2, cap / 8) int32 buffer fills a subcore's VMEM exactly: accepted.
    fits = Declared(scratch=[Scratch((2, cap // 8), jnp.int32, "sparsecore_vmem")])
    check_declared(fits, v5p)
    over = Declared(scratch=[Scratch((2, cap // 8 + 1), jnp.int32, "sparsecore_vmem")])
    with pytest.raises(CapacityError, match="SparseCore VMEM"):
        check_declared(over, v5p)
    # On a TensorCore 2 rows pad to 8: a quarter of the scoped limit, plus one lane tile, raw
    # (4 MiB) is just over the limit padded.
    cols = v5p.scoped_vmem_default_bytes // 32 + 128
    rows2 = Declared(scratch=[Scratch((2, cols), jnp.float32)])
    with pytest.raises(CapacityError, match="VMEM"):
        check_declared(rows2, v5p)
