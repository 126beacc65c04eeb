"""TensorCore kernels: ``coremesh.core.kernel`` over the target's TensorCore mesh by default.

The spec goes to the backend registered for TensorCore meshes (``TensorCoreKernel`` unless
``coremesh.core.using_backend`` chose another), which checks operand dtypes and scratch against
the chip, allocates ``collective_id="auto"`` and pins large operands to HBM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coremesh.core import CostEstimate, Kernel
from coremesh.core import kernel as core_kernel
from coremesh.core.kernel import CollectiveId
from coremesh.tensorcore.mesh import TensorCoreMesh
from coremesh.tensorcore.mesh import mesh as target_mesh


def kernel(
    body: Callable[..., None],
    *,
    out_type: Any,
    scratch: Sequence[Any] = (),
    mesh: TensorCoreMesh | None = None,
    name: str | None = None,
    collective_id: CollectiveId = None,
    cost_estimate: CostEstimate | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> Kernel:
    """A kernel running ``body`` on every TensorCore of the device (SPMD over ``mesh``)."""
    return core_kernel(
        body,
        out_type=out_type,
        mesh=mesh if mesh is not None else target_mesh(),
        scratch=scratch,
        name=name,
        collective_id=collective_id,
        cost_estimate=cost_estimate,
        compiler_options=compiler_options,
    )
