"""Which interpreter core's buffer a ``VMEM_SHARED`` access reaches.

On the chip a SparseCore's ``VMEM_SHARED`` is one memory that its subcores, and an MPMD
kernel's bodies on that SparseCore, share. Pallas' interpreter keys it per interpreter core, as
it keys VMEM (``_local_core_id_or_zero_if_hbm`` shares HBM only), so where the simulator runs
a SparseCore's subcores or bodies on threads of their own, each thread would see its own.

Such a kernel carries a table in its interpret parameters (``SimParams.shared_vmem_cores``: for
each interpreter core, the core whose buffer it uses). The table rides to the kernel's shared
memory when that is set up, and every ``VMEM_SHARED`` access of the kernel, allocation and
freeing included, is keyed through it. :mod:`.subcore_barrier` sends every thread to core 0
(where it allocates the buffer once, reference-counted over the threads); :mod:`.mpmd` sends
each thread to the first thread of its SparseCore (every thread allocates the kernel's scratch,
so buffer ids stay in step, and the others' copies go unused).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: The attribute on the interpreter's SharedMemory holding the running kernel's table (empty:
#: the interpreter's own keying).
_TABLE = "_coremesh_shared_vmem_cores"


def table_for(params: Any, cores: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """The ``dataclasses.replace`` change that gives a kernel the table ``cores``; none for an
    empty table or for interpret parameters without the field (a call's own
    ``InterpretParams``)."""
    return (
        {"shared_vmem_cores": tuple(cores)}
        if cores and hasattr(params, "shared_vmem_cores")
        else {}
    )


def targets(initialize: Callable[..., Any] | None = None) -> list[tuple[Any, str, Any]]:
    """The interpreter's shared-memory set-up (takes the table) and its core of a buffer key
    (reads it). Both of the patches that run subcores or bodies on threads list these; a
    patch with a set-up of its own passes it as ``initialize``, which this one then wraps (two
    entries for one name in a patch would not chain)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig_init = initialize or ipc._initialize_shared_memory
    orig_core = ipc._local_core_id_or_zero_if_hbm

    def initialize_shared_memory(*args: Any, interpret_params: Any, **kw: Any) -> Any:
        out = orig_init(*args, interpret_params=interpret_params, **kw)
        table = tuple(getattr(interpret_params, "shared_vmem_cores", ()))
        ipc._get_shared_memory().__dict__[_TABLE] = table
        return out

    def local_core_id_or_zero(local_core_id: int, memory_space: str) -> int:
        if memory_space == "vmem_shared" and ipc._shared_memory is not None:
            table = ipc._shared_memory.__dict__.get(_TABLE)
            if table:
                return int(table[int(local_core_id)])
        return int(orig_core(local_core_id, memory_space))

    return [
        (ipc, "_initialize_shared_memory", initialize_shared_memory),
        (ipc, "_local_core_id_or_zero_if_hbm", local_core_id_or_zero),
    ]


__all__: Sequence[str] = ("table_for", "targets")
