"""TensorCore kernels: ``pl.kernel`` over the target's TensorCore mesh, checked first.

Scratch is checked against the chip's VMEM/SMEM before tracing; a collective id is allocated
from the process-wide allocator when the body needs a barrier semaphore (``collective_id="auto"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax

from coremesh.core import (
    CostEstimate,
    KernelSpec,
    check_fits,
    check_operand_dtype,
    default_allocator,
)
from coremesh.core.capacity import nbytes
from coremesh.tensorcore.backend import TensorCoreKernel
from coremesh.tensorcore.mesh import TensorCoreMesh
from coremesh.tensorcore.mesh import mesh as target_mesh


def scratch_bytes(scratch: Sequence[Any]) -> dict[str, int]:
    """VMEM and SMEM bytes of a list of ``pltpu.VMEM(...)``/``pltpu.SMEM(...)``/semaphores."""
    totals = {"vmem": 0, "smem": 0}
    for s in jax.tree.leaves(list(scratch), is_leaf=lambda x: hasattr(x, "shape")):
        space = str(getattr(s, "memory_space", "")).lower()
        shape, dtype = getattr(s, "shape", None), getattr(s, "dtype", None)
        if shape is None or dtype is None:
            continue  # semaphores
        key = "smem" if "smem" in space else "vmem" if "vmem" in space else None
        if key:
            totals[key] += nbytes(shape, dtype)
    return totals


def kernel(
    body: Callable[..., None],
    *,
    out_type: Any,
    scratch: Sequence[Any] = (),
    mesh: TensorCoreMesh | None = None,
    name: str | None = None,
    collective_id: int | Literal["auto"] | None = None,
    cost_estimate: CostEstimate | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> TensorCoreKernel:
    """A kernel running ``body`` on every TensorCore of the device (SPMD over ``mesh``)."""
    m = mesh if mesh is not None else target_mesh()
    opts = dict(compiler_options or {})
    for leaf in jax.tree.leaves(out_type):
        check_operand_dtype(leaf.dtype, m.chip)
    used = scratch_bytes(scratch)
    label = name or str(getattr(body, "__name__", "kernel"))
    what = f"scratch of kernel {label}"
    check_fits(
        used["vmem"], m.chip, "vmem", vmem_limit_bytes=opts.get("vmem_limit_bytes"), what=what
    )
    check_fits(used["smem"], m.chip, "smem", what=what)
    cid: int | None
    cid = default_allocator().id_for(label) if collective_id == "auto" else collective_id
    spec = KernelSpec(
        body=body,
        out_type=out_type,
        mesh=m,
        scratch=tuple(scratch),
        name=name,
        collective_id=cid,
        cost_estimate=cost_estimate,
        compiler_options=opts,
    )
    return TensorCoreKernel(spec)
