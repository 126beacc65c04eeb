"""``plsc.fetch_and_add(smem_ref.at[i], value, subcore_id=s)``: an atomic add to the SMEM
of another vector subcore.

On the chip a vector subcore adds ``value`` to an int32 scalar in the SMEM of subcore ``s`` of
its own SparseCore and gets the old value back, atomically. Pallas' TPU interpreter (jax 0.10.2
to 0.12.0.1) has no rule for ``sc_fetch_and_add``: its fallback binds it with the ref's buffer
id (an int16) where the ref belongs, and the abstract eval refuses that. Each subcore's SMEM
must exist on its own for the add to mean anything, so a kernel with ``fetch_and_add`` runs as
one with ``plsc.subcore_barrier`` does (:mod:`.subcore_barrier`): one interpreter core (thread)
per subcore, each with its own SMEM.

Simulated so: at each jaxpr level, each ``fetch_and_add`` becomes ``coremesh_fetch_and_add``,
answered by one host callback on the subcore's token where it stands (:mod:`.host_primitives`),
ordered after the subcore's loads, stores and barriers before it. The callback, under the
interpreter's shared-memory lock (which its loads and stores take too), reads the scalar at the
indices in the SMEM buffer with the same id on the interpreter core that runs subcore ``s`` (the
cores allocate buffers in the same order, so the ids agree, as the addresses do on the chip),
adds with int32 wrap-around, writes it back and returns the old value. A ``subcore_id`` outside
the SparseCore, an index outside the ref, and a target buffer that subcore has not allocated
(yet, or any more) raise :class:`SimulationFault` naming the user's line; an element nobody
wrote raises :class:`UninitializedReadError`. The interpreter's race detection does not see the
add (atomic on the chip; a load of the counter is ordered by the barrier a kernel needs anyway).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from coremesh.testing.sim import host_primitives


@dataclasses.dataclass(frozen=True, eq=False)
class _Site:
    """What the host side of one ``fetch_and_add`` needs from its equation (compared by
    identity: it rides in the equation's params)."""

    shape: tuple[int, ...]
    source_info: Any


@functools.cache
def _primitive() -> Any:
    """``coremesh_fetch_and_add``: ``fetch_and_add`` as the interpreter's loop sees it.
    Registered as an interpreter impl, whose traced jaxpr the loop hands back to
    ``_interpret_jaxpr`` with the token as it stands there; the patch's wrapper answers it."""
    import jax.numpy as jnp
    from jax._src import core as jax_core

    prim = jax_core.Primitive("coremesh_fetch_and_add")
    prim.def_abstract_eval(lambda *args, site: jax_core.ShapedArray((), jnp.int32))
    return prim


def _fault(what: str, rule: str, fix: str, source_info: Any, position: dict[str, int]) -> Any:
    from coremesh.testing.sim.faults import fault_at

    return fault_at(
        f"plsc.fetch_and_add: {what}",
        source_info,
        position,
        operation="plsc.fetch_and_add",
        rule=rule,
        fix=fix,
    )


def _uninitialized(what: str, source_info: Any, position: dict[str, int], buffer: str) -> Any:
    from coremesh.testing.sim import shadow
    from coremesh.testing.sim.errors import UninitializedReadError
    from coremesh.testing.sim.faults import fault_at

    return fault_at(
        f"plsc.fetch_and_add reads unwritten memory: {what}",
        source_info,
        position,
        operation="plsc.fetch_and_add of unwritten memory",
        buffer=buffer,
        rule=shadow.RULE,
        fix="store the counter on its subcore (smem_ref[i] = 0) and meet at a "
        "plsc.subcore_barrier() before any subcore adds to it" + shadow.TURN_OFF,
        cls=UninitializedReadError,
    )


def _add(
    token: Any,
    device: Any,
    core: Any,
    buffer_id: Any,
    value: Any,
    *rest: Any,
    site: _Site,
    layout: tuple[int, ...],
) -> tuple[Any, Any]:
    """The host side of one ``fetch_and_add`` by interpreter core ``core``: ``rest`` is
    ``(*indices, subcore_id)``."""
    from jax._src.pallas.mosaic import core as mosaic_core
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim import shadow
    from coremesh.testing.sim.faults import buffer_key, buffer_text

    indices = tuple(int(i) for i in rest[:-1])
    subcore = int(rest[-1])
    position = {"device": int(device), "subcore": layout[int(core)]}
    if not 0 <= subcore < len(layout):
        raise _fault(
            f"subcore_id {subcore} is outside the SparseCore's {len(layout)} vector subcores",
            rule=f"subcore_id names a vector subcore of the same SparseCore: 0 to "
            f"{len(layout) - 1}",
            fix="compute subcore_id modulo the subcore count (lax.axis_index(subcore axis) "
            "ranges over it)",
            source_info=site.source_info,
            position=position,
        )
    if any(not 0 <= i < d for i, d in zip(indices, site.shape, strict=True)):
        raise _fault(
            f"index {indices} is outside the ref of shape {site.shape}",
            rule="the index of fetch_and_add lies inside the ref; the chip does not check, and "
            "adds to other memory",
            fix="index the SMEM ref inside its shape",
            source_info=site.source_info,
            position=position,
        )
    sm = ipc._shared_memory
    smem = ipc.TPU_MEMORY_SPACE_IDXS[mosaic_core.MemorySpace.SMEM]
    key = buffer_key(smem, int(buffer_id), int(device), layout.index(subcore))
    with sm.lock:
        buf = sm.mem.get(key)
        if buf is None:
            raise _fault(
                f"subcore {subcore} has no SMEM buffer {key[1]} now (it has not reached the "
                "scope that allocates it yet, or has left it)",
                rule="fetch_and_add adds to the target subcore's own copy of the ref, which "
                "exists while that subcore runs the scope that allocates it",
                fix="meet at a plsc.subcore_barrier() after every subcore has set up its "
                "counter and before any subcore adds to it, and again before leaving the scope",
                source_info=site.source_info,
                position=position,
            )
        written = sm.__dict__.get(shadow._ATTR, {}).get(key)
        if written is not None and written[indices] != shadow.WRITTEN:
            raise _uninitialized(
                f"element {indices} of subcore {subcore}'s SMEM buffer",
                site.source_info,
                position,
                buffer_text(key[0], key[1], buf),
            )
        old = int(np.asarray(buf[indices]))
        new = (old + int(value) + 2**31) % 2**32 - 2**31  # int32 wrap-around
        buf[indices] = np.asarray(new, np.int32)
    return token, np.int32(old)


def _params(eqn: Any) -> dict[str, Any]:
    return {"site": _Site(tuple(eqn.invars[0].aval.shape), eqn.source_info)}


def _answer(jaxpr: Any, args: Sequence[Any], ctx: Any, token: Any) -> Any:
    """Run the impl's jaxpr (one ``coremesh_fetch_and_add``) as a host callback on ``token``,
    the interpreter's token where the equation stands: ordered after the subcore's loads,
    stores and barriers before it, and before those after it."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import io_callback

    from coremesh.testing.sim import subcore_barrier

    (eqn,) = jaxpr.eqns
    host = functools.partial(
        _add,
        site=eqn.params["site"],
        layout=subcore_barrier.layout(int(ctx.grid_mapping.grid[0])),
    )
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    token, old = io_callback(
        host,
        (scalar, scalar),
        token,
        ctx.device_id,
        ctx.local_core_id,
        *host_primitives.operands(jaxpr, args),
    )
    return token, [old]


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation (kernels run on subcore threads only: the
    others keep fetch_and_add, which patch sparsecore_primitives refuses), and its table of
    impls."""
    from jax._src.pallas.mosaic import sc_primitives as scp

    from coremesh.testing.sim import subcore_barrier

    def on_subcore_threads(ctx: Any) -> bool:
        return bool(getattr(ctx.interpret_params, "fast_path_off", "") == subcore_barrier.REASON)

    return host_primitives.targets(
        scp.fetch_and_add_p, _primitive(), _params, _answer, on_subcore_threads
    )


__all__: Sequence[str] = ("targets",)
