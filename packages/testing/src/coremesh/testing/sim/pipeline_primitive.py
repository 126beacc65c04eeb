"""The ``emit_pipeline`` primitive (``jax_use_emit_pipeline_primitive``) in the interpreter of
jax 0.10.x, as jax 0.11 runs it.

With the flag on, ``pltpu.emit_pipeline`` binds one ``emit_pipeline`` equation holding the body
as a jaxpr; Mosaic expands it while lowering (``pipeline.py`` ``_emit_pipeline_lowering_rule``,
0.10.2 line 2113). jax 0.10.2's interpreter has no rule for it (``interpret_pallas_call.py``
``_interpret_jaxpr``, line 1688): it binds the equation on the refs' int16 buffer ids, whose
effects then name no input, and the kernel fails ("`JaxprInputEffect` Read<...> does not have
a corresponding jaxpr input", or a ``CpuCallback error``: "Cannot lower jaxpr with effects").
jax 0.11.0 added the rule: the interpreter expands the equation as the lowering does
(``emit_pipeline_to_jaxpr``) and runs each step's body with the pipeline's indices as
``pl.program_id`` and its buffers as the body's refs.

:func:`expand` is that expansion for 0.10.2, traced on the equation's ref types and spliced in
its place. Each step's body is evaluated into the trace directly (not bound as 0.10.2's
``pipeline_body`` equation, which its interpreter cannot run either): the body was traced on
plain refs, and gets views (``buffer.at[slot]``), whose transforms :mod:`.ref_views_eval` puts
in front of each access's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from coremesh.testing.sim import inline, ref_views_eval


def _pipeline() -> Any:
    from jax._src.pallas.mosaic import pipeline

    return pipeline


def has_pipeline(jaxpr: Any) -> bool:
    """Does this jaxpr level bind the emit_pipeline primitive?"""
    prim = _pipeline().emit_pipeline_p
    return any(e.primitive is prim for e in jaxpr.eqns)


def expand(ctx: Any) -> Any:
    """The rule (see :mod:`.inline`) that runs an emit_pipeline equation inside the kernel whose
    interpreter context is ``ctx``: 0.10.2's lowering of it, with the body evaluated per step."""
    from jax._src import core as jax_core
    from jax._src import tree_util, util
    from jax._src.pallas import core as pallas_core

    pipeline = _pipeline()
    names = ctx.grid_mapping.grid_names
    sizes = ctx.grid_mapping.grid
    outer_env = pallas_core.current_grid_env() or ()

    def nested_pipeline(eqn: Any, invals: list[Any]) -> list[Any]:
        """An emit_pipeline in a step's body, expanded in line: its steps see this step's
        indices as the grid axes after their own (0.10.2's lowering does so)."""
        return list(expand(ctx)(*invals, **eqn.params))

    nested: dict[str, ref_views_eval.Rule] = {_pipeline().emit_pipeline_p.name: nested_pipeline}

    def rule(
        *args: Any,
        grid_mapping: Any,
        _num_extra_dynamic: int,
        _static_grid_offsets: tuple[Any, ...],
        args_tree: Any,
        body_jaxpr: Any,
        body_consts_len: int,
        **params: Any,
    ) -> list[Any]:
        counts = tuple(len(bm.index_map_jaxpr.consts) for bm in grid_mapping.block_mappings)
        num_dynamic = grid_mapping.num_dynamic_grid_bounds + _num_extra_dynamic
        map_consts, dynamic, body_consts, flat_refs = util.split_list(
            list(args), [sum(counts), num_dynamic, body_consts_len]
        )
        closed = getattr(jax_core, "ClosedJaxpr")  # noqa: B009  (gone from jax 0.12)
        maps = util.split_list(map_consts, list(counts))
        grid_mapping = dataclasses.replace(
            grid_mapping,
            block_mappings=[
                bm.replace(index_map_jaxpr=closed(bm.index_map_jaxpr.jaxpr, c))
                for bm, c in zip(grid_mapping.block_mappings, maps, strict=False)
            ],
        )
        # A nested pipeline's refs may be the outer step's views: one view each.
        refs, _ = tree_util.tracing_registry.flatten(
            args_tree.unflatten(flat_refs), pipeline.is_transformed_ref
        )
        refs = [ref_views_eval.fold(r) for r in refs]
        dims = iter(dynamic)
        grid = tuple(next(dims) if pallas_core.is_dynamic_dim(d) else d for d in grid_mapping.grid)
        offsets = tuple(
            next(dims) if pallas_core.is_dynamic_dim(d) else d for d in _static_grid_offsets
        )
        n_in = grid_mapping.num_inputs
        specs = [bm.to_block_spec() for bm in grid_mapping.block_mappings]
        kept = [i for i in range(len(grid)) if i not in grid_mapping.vmapped_dims]

        def body(indices: tuple[Any, ...], *step_refs: Any) -> None:
            env = tuple(pallas_core.GridAxis(indices[i], grid[i]) for i in kept)
            with pallas_core.grid_env(env + tuple(outer_env[len(env) :])):
                ref_views_eval.eval_jaxpr(body_jaxpr, body_consts, step_refs, nested)

        axes = [(n, s) for n, s in zip(names or (), sizes, strict=False) if n is not None]
        logical = tuple(d for i, d in enumerate(grid_mapping.grid) if i in kept)
        with (
            jax_core.extend_axis_env_nd([(n, s) for n, s in axes if isinstance(s, int)]),
            pallas_core.tracing_grid_env(logical, ()),
        ):
            pipeline._emit_pipeline(
                body,
                grid=grid,
                in_specs=specs[:n_in],
                out_specs=specs[n_in:],
                _grid_offsets=offsets,
                _explicit_indices=True,
                **params,
            )(*refs)
        return []

    return rule


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation: a level that binds emit_pipeline is run
    with each such equation expanded (traced again each time: the expansion reads the grid
    position the interpreter is tracing)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc._interpret_jaxpr
    prim = _pipeline().emit_pipeline_p
    seen = _remembered()

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        if seen(jaxpr):
            rule = expand(ctx)
            done = inline.inline(jaxpr, lambda e: rule if e.primitive is prim else None)
            jaxpr, args = inline.spliced(jaxpr, args, done)
        return orig(jaxpr, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr)]


def _remembered() -> Any:
    """``has_pipeline``, remembered per jaxpr."""
    from coremesh.testing.sim.jaxprs import PerJaxpr

    return PerJaxpr(lambda j: True if has_pipeline(j) else None)
