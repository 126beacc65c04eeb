"""The shipped kernels as compile-matrix programs, each beside its ``jax.numpy`` reference.

``coremesh aot-all`` compiles every program registered under ``coremesh.programs`` for every
chip, and ``coremesh profile`` sets each beside its ``xla_reference``. A kernel that runs on one
device gets replicated arguments; all_gather gets its input split over the mesh axis
``"device"`` and is built over the chip's device mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coremesh.testing.aot import Arg, FunctionProgram
from coremesh.testing.shipped.entry import ShippedKernel


def _args(kernel: ShippedKernel) -> Callable[[int], list[Arg]]:
    def args(num_devices: int) -> list[Arg]:
        inputs = kernel.inputs(num_devices)
        specs = kernel.partition_specs(len(inputs))
        return [Arg(tuple(x.shape), x.dtype, spec) for x, spec in zip(inputs, specs, strict=True)]

    return args


def program(kernel: ShippedKernel) -> FunctionProgram:
    """``kernel`` as a program named ``jax-ops.<name>``, its reference as the XLA program."""
    import jax

    def build(mesh: Any) -> Callable[..., Any]:
        return jax.jit(kernel.kernel(mesh))  # type: ignore[no-any-return]

    def build_reference(_mesh: Any) -> Callable[..., Any]:
        return jax.jit(kernel.reference)  # type: ignore[no-any-return]

    args = _args(kernel)
    name = f"jax-ops.{kernel.name}"
    xla = FunctionProgram(name=f"{name}[xla]", builder=build_reference, args=args)
    return FunctionProgram(name=name, builder=build, args=args, xla_reference=xla)


def programs() -> list[FunctionProgram]:
    """Every shipped kernel of the corpus as a program."""
    from coremesh.testing.shipped import KERNELS

    return [program(k) for k in KERNELS.values()]
