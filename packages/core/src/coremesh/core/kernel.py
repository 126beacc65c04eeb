"""Kernels: the spec every backend builds from, the checks it applies, and ``kernel()``.

Every kernel in coremesh (a user's, an op's, a collective's) is a ``KernelSpec`` handed to the
backend registered for its mesh kind, so the same checks run on every path. ``PallasKernel`` is
the base the Pallas TPU backends share: it refuses, before anything is traced, what Mosaic would
refuse (operand dtypes, scratch over VMEM/SMEM at the padded sizes the compile check uses), and
allocates barrier-semaphore collective ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from coremesh.core.chips import Chip
from coremesh.core.dtypes import check_array_dtype
from coremesh.core.errors import MeshError
from coremesh.core.mesh import CoreKind, CoreMesh

Body = Callable[..., None]
CollectiveId = int | Literal["auto"] | None


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    """What XLA's scheduler needs to overlap a kernel with other work.

    Kernels without one are opaque to the scheduler (MaxText's ring all-gather notes the same).
    """

    flops: int
    bytes_accessed: int
    transcendentals: int = 0
    remote_bytes: int = 0

    def to_pallas(self) -> Any:
        from jax.experimental import pallas as pl

        return pl.CostEstimate(
            flops=self.flops,
            transcendentals=self.transcendentals,
            bytes_accessed=self.bytes_accessed,
            remote_bytes_transferred=self.remote_bytes,
        )


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A per-core kernel: its body, outputs, scratch and the mesh it runs on.

    MPMD kernels (one program per kind of core, run together) give parallel tuples of bodies
    and meshes, all of one chip and each of a different kind. ``collective_id="auto"`` asks the
    backend for an id from the process-wide allocator (needed by barrier semaphores).
    """

    body: Body | tuple[Body, ...]
    out_type: Any
    mesh: CoreMesh | tuple[CoreMesh, ...]
    scratch: Sequence[Any] = ()
    name: str | None = None
    collective_id: CollectiveId = None
    cost_estimate: CostEstimate | None = None
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        bodies, meshes = self.bodies, self.meshes
        chip = meshes[0].chip.name if meshes else None
        if len(bodies) != len(meshes) or not meshes:
            raise MeshError(
                f"{len(bodies)} bodies for {len(meshes)} meshes",
                rule="an MPMD kernel pairs each body with one mesh",
                chip=chip,
                fix="pass tuples of equal length, or one body and one mesh",
            )
        chips = {m.chip.name for m in meshes}
        if len(chips) != 1:
            raise MeshError(
                f"meshes of several chips: {sorted(chips)}",
                rule="one kernel runs on one chip",
                chip=chip,
                fix="build every mesh for the same target",
            )
        if self.is_mpmd and len({m.kind for m in meshes}) != len(meshes):
            raise MeshError(
                "two meshes of one MPMD kernel are of the same kind",
                rule="an MPMD kernel runs one program per kind of core",
                chip=chip,
                fix="pair meshes of different kinds (e.g. vector- and scalar-subcore meshes)",
            )

    @property
    def bodies(self) -> tuple[Body, ...]:
        return self.body if isinstance(self.body, tuple) else (self.body,)

    @property
    def meshes(self) -> tuple[CoreMesh, ...]:
        return self.mesh if isinstance(self.mesh, tuple) else (self.mesh,)

    @property
    def is_mpmd(self) -> bool:
        return isinstance(self.mesh, tuple) or isinstance(self.body, tuple)

    @property
    def kinds(self) -> frozenset[CoreKind]:
        return frozenset(m.kind for m in self.meshes)

    @property
    def chip(self) -> Chip:
        return self.meshes[0].chip

    @property
    def label(self) -> str:
        """The name errors and collective ids use: ``name``, else the (first) body's name."""
        return self.name or str(getattr(self.bodies[0], "__name__", "kernel"))


@runtime_checkable
class Kernel(Protocol):
    """A callable built from a ``KernelSpec`` by a backend; call it inside ``jax.jit``."""

    @property
    def spec(self) -> KernelSpec: ...

    def __call__(self, *args: Any) -> Any: ...


class PallasKernel:
    """A kernel built with ``pl.kernel`` from a spec: the base of the Pallas TPU backends.

    Subclasses name their backend, the mesh kinds they accept and their operand-dtype rule, and
    may extend ``check``. A spec over another kind, or one that cannot fit,
    is refused here, before anything is traced.
    """

    backend_name: str = "pallas"
    kinds: frozenset[CoreKind] = frozenset()
    #: ``rule(dtype, chip)`` raising for a dtype no operand or result may have.
    dtype_rule: Callable[[Any, Chip], str] = staticmethod(check_array_dtype)

    def __init__(self, spec: KernelSpec) -> None:
        if not spec.kinds <= self.kinds:
            got = ", ".join(sorted(k.value for k in spec.kinds - self.kinds))
            accepted = ", ".join(sorted(k.value for k in self.kinds))
            raise MeshError(
                f"the {self.backend_name} backend got a {got} mesh",
                rule=f"it builds kernels over {accepted} meshes only",
                chip=spec.chip.name,
                fix="use coremesh.core.kernel(...), which picks the backend for the mesh's kind",
            )
        self.check(spec)
        if spec.collective_id == "auto":
            from coremesh.core.collective_ids import default_allocator

            spec = dataclasses.replace(spec, collective_id=default_allocator().id_for(spec.label))
        self._spec = spec
        self._fn = self.build(spec)

    def check(self, spec: KernelSpec) -> None:
        """Refuse result dtypes the backend's rule refuses and scratch that cannot fit."""
        import jax

        for leaf in jax.tree.leaves(spec.out_type):
            self.dtype_rule(leaf.dtype, spec.chip)
        check_scratch(spec)

    def check_operands(self, args: Sequence[Any]) -> None:
        """Refuse operand dtypes by the same rule, from the arguments, before tracing."""
        import jax

        for leaf in jax.tree.leaves(list(args)):
            if hasattr(leaf, "dtype"):
                self.dtype_rule(leaf.dtype, self._spec.chip)

    def build(self, spec: KernelSpec) -> Callable[..., Any]:
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu

        cid = spec.collective_id
        assert cid != "auto"
        params = pltpu.CompilerParams(collective_id=cid, **spec.compiler_options)
        fn: Callable[..., Any] = pl.kernel(
            list(spec.bodies) if spec.is_mpmd else spec.bodies[0],
            out_type=spec.out_type,
            mesh=[m.pallas_mesh() for m in spec.meshes]
            if spec.is_mpmd
            else spec.meshes[0].pallas_mesh(),
            scratch_types=tuple(spec.scratch),
            compiler_params=params,
            cost_estimate=spec.cost_estimate.to_pallas() if spec.cost_estimate else None,
            name=spec.name,
        )
        return fn

    @property
    def spec(self) -> KernelSpec:
        return self._spec

    def __call__(self, *args: Any) -> Any:
        self.check_operands(args)
        return self._fn(*args)


def check_scratch(spec: KernelSpec) -> None:
    """Refuse scratch over the chip's VMEM/SMEM, counted as the compile check counts it.

    TensorCore buffers are padded to the chip's tiles; SparseCore subcore VMEM is checked
    against one subcore's capacity.
    """
    from coremesh.core.capacity import check_fits, scratch_bytes

    tensor = CoreKind.TENSOR in spec.kinds
    used = scratch_bytes(spec.scratch, spec.chip, tiled=tensor)
    what = f"scratch of kernel {spec.label}"
    if tensor:
        limit = spec.compiler_options.get("vmem_limit_bytes")
        check_fits(used["vmem"], spec.chip, "vmem", vmem_limit_bytes=limit, what=what)
    elif used["vmem"]:
        check_fits(used["vmem"], spec.chip, "sparsecore_vmem", what=what)
    check_fits(used["smem"], spec.chip, "smem", what=what)


def kernel(
    body: Body | Sequence[Body],
    *,
    out_type: Any,
    mesh: CoreMesh | Sequence[CoreMesh],
    scratch: Sequence[Any] = (),
    name: str | None = None,
    collective_id: CollectiveId = None,
    cost_estimate: CostEstimate | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> Kernel:
    """Build a kernel with the backend that serves ``mesh``'s kind (found by entry point).

    ``body`` and ``mesh`` are one body and one mesh, or two sequences of equal length (MPMD).
    """
    from coremesh.core.backends import backend_for

    spec = KernelSpec(
        body=tuple(body) if isinstance(body, Sequence) else body,
        out_type=out_type,
        mesh=tuple(mesh) if isinstance(mesh, Sequence) else mesh,
        scratch=tuple(scratch),
        name=name,
        collective_id=collective_id,
        cost_estimate=cost_estimate,
        compiler_options=dict(compiler_options or {}),
    )
    return backend_for(spec.meshes[0].kind).make_kernel(spec)
