"""The core_map guide's programs, each paired with the same computation in plain ``jax.numpy``.

``PROGRAMS["add_one"]`` compiles exactly as ``coremesh.testing.guide.PROGRAMS["add_one"]`` does; its
``xla_reference`` is what XLA makes of ``x + 1`` over the same device mesh and shapes, so a cycle
estimate can put the Pallas kernel next to XLA's own code on one cost model. Reference:
``coremesh.testing.aot.guide:PROGRAMS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from coremesh.testing.aot.program import Arg, FunctionProgram


@dataclasses.dataclass(frozen=True)
class WithXla:
    """A program plus its plain-XLA counterpart; everything else is the program's own."""

    program: Any
    xla_reference: FunctionProgram

    @property
    def name(self) -> str:
        return str(self.program.name)

    @property
    def uses_sparsecore(self) -> bool:
        return bool(getattr(self.program, "uses_sparsecore", False))

    def build(self, mesh: Any) -> Any:
        return self.program.build(mesh)

    def arg_specs(self, num_devices: int) -> Any:
        return self.program.arg_specs(num_devices)

    def in_specs(self) -> Any:
        return self.program.in_specs()


def _xla(program: Any, per_device: Callable[..., Any], out_spec: Any = None) -> FunctionProgram:
    """``per_device`` under ``shard_map`` with the program's argument specs."""

    def build(mesh: Any) -> Any:
        import jax

        in_specs = tuple(program.in_specs())
        out = out_spec if out_spec is not None else in_specs[0]
        return jax.jit(
            jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out, check_vma=False)
        )

    def args(num_devices: int) -> list[Arg]:
        return [
            Arg(tuple(s.shape), s.dtype, p)
            for s, p in zip(program.arg_specs(num_devices), program.in_specs(), strict=True)
        ]

    return FunctionProgram(name=f"{program.name}_xla", builder=build, args=args)


def _swap(x: Any) -> Any:
    """Core c's column block goes to core c + 1, doubled (the guide's swap, for any core count)."""
    import jax.numpy as jnp

    from coremesh.core.targets import current_target

    cores = current_target().cores_per_device
    rows, cols = x.shape
    blocks = x.reshape(rows, cores, cols // cores)
    return (jnp.roll(blocks, 1, axis=1) * 2).reshape(rows, cols)


def _add_one(x: Any) -> Any:
    return x + 1


def _indexed_add_one(output_cols: int) -> Callable[[Any, Any], Any]:
    def f(x: Any, index: Any) -> Any:
        import jax

        return jax.lax.dynamic_slice_in_dim(x, index[0], output_cols, axis=1) + 1

    return f


def _build() -> Mapping[str, WithXla]:
    from coremesh.testing.guide import PROGRAMS as GUIDE

    per_device: dict[str, Callable[..., Any]] = {
        "swap_core_map": _swap,
        "swap_kernel": _swap,
        "add_one": _add_one,
        "sc_add_one": _add_one,
    }
    out = {}
    for name, program in GUIDE.items():
        fn = per_device.get(name)
        if fn is None and name == "indexed_add_one":
            fn = _indexed_add_one(int(getattr(program, "output_cols", 512)))
        if fn is None:
            continue
        out[name] = WithXla(program, _xla(program, fn))
    return MappingProxyType(out)


PROGRAMS: Mapping[str, WithXla] = _build()
