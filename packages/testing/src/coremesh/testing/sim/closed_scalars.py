"""Scalars a ``pl.kernel`` / ``core_map`` body closes over, passed as Mosaic passes them.

A kernel body that closes over a traced scalar (``n`` of ``jax.jit(f)(n)``, a dynamic grid size)
gets it as a value input of its jaxpr. Mosaic's lowering rewrites such an input into a ``(1,)``
ref (``pallas_call_registration._rewrite_jaxpr_for_lowering``: SMEM on a TensorCore, HBM copied
into SMEM or VMEM on a SparseCore) and reads the scalar from it. The CPU lowering
(``mpmd._mpmd_map_fallback_lowering``) skips that rewrite, so the interpreter hands the body the
input's int16 *buffer id* in place of the value: ``n * 3`` fails with "lax.mul requires
arguments to have the same dtypes, got int16, int32", or, where the dtypes agree, computes with
the id. :func:`targets` applies Mosaic's own rewrite before the CPU lowering.
"""

from __future__ import annotations

from typing import Any

from jax._src import core as jax_core
from jax._src import source_info_util
from jax._src.lib import xla_client


def _is_scalar(var: Any) -> bool:
    aval = var.aval
    return isinstance(aval, jax_core.ShapedArray) and not aval.shape


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src.interpreters import mlir
    from jax._src.pallas import mpmd
    from jax._src.pallas.mosaic import pallas_call_registration as registration

    from coremesh.testing.sim import operands

    orig = mpmd._mpmd_map_fallback_lowering

    def fallback_lowering(ctx: Any, *in_nodes: Any, **params: Any) -> Any:
        jaxprs, meshes = params["jaxprs"], params["meshes"]
        scalar = [_is_scalar(v) for v in jaxprs[0].invars[: len(in_nodes)]]
        if len(jaxprs) != 1 or not any(scalar):
            return orig(ctx, *in_nodes, **params)
        all_meshes = (*meshes, *params.get("external_meshes", ()))
        # Traced under this frame, not the kernel call's that lowering sets (the kernel's own
        # equations keep theirs): on a vector subcore the rewrite loads a whole VMEM vector of
        # which it wrote lane 0, and the uninitialized-read check knows that load by this
        # frame (shadow._RULES).
        here = xla_client.Traceback.get_traceback()
        with source_info_util.user_context(here, name_stack=source_info_util.current_name_stack()):
            params["jaxprs"] = tuple(
                registration._rewrite_jaxpr_for_lowering(j, m, all_meshes)
                for j, m in zip(jaxprs, meshes, strict=True)
            )
        # The operand as Mosaic gets it: x[None] (pallas_call_registration's
        # _maybe_expand_scalar_input).
        expand = mlir.lower_fun(lambda x: x[None], multiple_results=False)
        nodes = [
            expand(ctx.replace(avals_in=[aval], avals_out=[aval.update(shape=(1,))]), node)[0]
            if is_scalar
            else node
            for is_scalar, node, aval in zip(scalar, in_nodes, ctx.avals_in, strict=True)
        ]
        # In the memory space the rewrite gives the ref (SMEM on a TensorCore, HBM on a
        # SparseCore), which the CPU lowering takes from a ShapedArray operand's memory_space.
        refs = params["jaxprs"][0].invars
        expanded = ctx.replace(
            avals_in=[
                aval.update(shape=(1,), memory_space=ref.aval.memory_space) if is_scalar else aval
                for is_scalar, aval, ref in zip(scalar, ctx.avals_in, refs, strict=False)
            ]
        )
        out = orig(expanded, *nodes, **params)
        if expanded.tokens_out is not None:  # the callbacks' effects, set on the copy
            ctx.set_tokens_out(expanded.tokens_out)
        return out

    return [
        (mpmd, "_mpmd_map_fallback_lowering", fallback_lowering),
        # The SMEM scalars above are copied into each core's SMEM from the BlockSpec, as any
        # SMEM input is.
        operands.stripped_memory_space("SMEM"),
    ]
