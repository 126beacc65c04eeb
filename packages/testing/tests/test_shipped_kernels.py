"""JAX's shipped Pallas TPU kernels (coremesh.testing.shipped) on the simulator, against their
jax.numpy references, in both DMA modes; and each compiles for v5p as a registered program."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from coremesh.testing.plugin import SliceFactory
from coremesh.testing.shipped import KERNELS, programs
from coremesh.testing.sim import UninitializedReadError, simulate

MODES = ("on_wait", "eager")

#: all_gather's kernel waits on its DMA semaphores in an order that only a chip finishing DMAs
#: in issue order satisfies; under "on_wait" the simulator names the DMA that reads a buffer the
#: DMA before it has not filled (below), so its result is checked under "eager".
EAGER_ONLY = {"all_gather"}

CASES = [
    pytest.param(name, mode, id=f"{name}-{mode}")
    for name in KERNELS
    for mode in MODES
    if not (name in EAGER_ONLY and mode == "on_wait")
]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_shipped_kernel_matches_its_reference(
    name: str, mode: str, slice_target: SliceFactory
) -> None:
    kernel = KERNELS[name]
    inputs = kernel.inputs(kernel.devices)
    expected = np.asarray(kernel.reference(*inputs))
    with slice_target("v5p", kernel.devices, dma_execution_mode=mode) as s:
        out: Any = s.run(kernel.kernel(s.device_mesh()), *inputs)
    np.testing.assert_allclose(np.asarray(out), expected, atol=kernel.atol, rtol=kernel.rtol)


def test_all_gather_on_wait_names_the_dma_that_reads_an_unfilled_buffer() -> None:
    kernel = KERNELS["all_gather"]
    inputs = kernel.inputs(kernel.devices)
    with (
        pytest.raises(UninitializedReadError, match=r"a DMA whose source a DMA in flight") as err,
        simulate("v5p", kernel.devices, dma_execution_mode="on_wait") as s,
    ):
        s.run(kernel.kernel(s.device_mesh()), *inputs)
    assert "all_gather.py" in str(err.value.location)


def test_every_kernel_family_is_in_the_corpus() -> None:
    assert set(KERNELS) == {
        "matmul",
        "flash_attention",
        "splash_attention",
        "paged_attention",
        "ragged_paged_attention",
        "megablox_gmm",
        "all_gather",
    }


def test_programs_are_registered_for_the_cli() -> None:
    from coremesh.testing.cli import shipped_references

    assert "coremesh.testing.shipped:programs" in shipped_references()


@pytest.mark.aot(chips=("v5p",))
@pytest.mark.parametrize("program", programs(), ids=lambda p: p.name)
def test_shipped_program_and_its_xla_reference_compile(program: Any, aot_compile: Any) -> None:
    assert aot_compile(program).status == "ok"
    assert aot_compile(program.xla_reference).status == "ok"
