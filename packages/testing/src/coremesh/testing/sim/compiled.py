"""A core-local ``pallas_call`` as compiled XLA: the grid loop over the state-discharged body.

The interpreter runs every load and store of a kernel as a host callback (tens of µs each).
A kernel whose refs are all its own VMEM/SMEM blocks and scratch needs none of that: its body,
with its refs discharged to values (jax's ``discharge_state``, as jax's generic interpreter
does), runs inside one ``while_loop`` over the grid, compiled by XLA. What the chip's pipeline
and the simulator's checks do is kept, in the loop:

* each step's input blocks are sliced from the (padded) operands at the index map's offsets; an
  output block starts fresh when its block index changes or a core starts, and is written back;
  scratch lives across steps and starts fresh on each core. On a 2-core chip the iterations of
  the leading "parallel" dimensions are visited in the interpreter's (seeded, shuffled) order
  and split between the cores as it splits them (core 0 the first half); each core's share is
  its own compiled loop, the shares run at once on host threads (XLA:CPU runs two loops of one
  program one after the other; not when a step's products are large enough for XLA:CPU to
  spread them over the threads itself, :data:`THREADED_PRODUCT_MAX`), and each output element
  is the last write of the last core that wrote it (cores write disjoint blocks unless they
  race, where the interpreter's result is either core's);
* a block index outside the operand, and a load or store outside its ref (dynamic indices are
  checked where they are discharged, :func:`checked_rules`), raise :class:`SimulationFault`;
* with the uninitialized-read check on, fresh blocks, scratch and padding hold shadow's tagged
  NaN, and a result element that still carries it (never written, or computed from unwritten
  memory) raises :class:`UninitializedReadError` when the call returns: the kernel is then run
  again, alone and interpreted, on the same operands, whose error names the first read of
  unwritten memory as the interpreted path does (:func:`explained`); the kernels the taint
  cannot follow (integer or bool scratch, outputs or padding; a zero fill) are not run here
  (:mod:`coremesh.testing.sim.fast_path` decides).
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from coremesh.testing.sim import shadow
from coremesh.testing.sim.chip import current_name
from coremesh.testing.sim.deadlock import WATCHDOG
from coremesh.testing.sim.errors import SimulationFault, UninitializedReadError
from coremesh.testing.sim.jaxprs import largest_product

_tls = threading.local()

_OOB_RULE = (
    "every index of a ref access lies inside the ref's shape; the chip does not check, and "
    "reads or overwrites other memory"
)


def _kernel_label(name: str | None) -> str:
    return f" in kernel {name!r}" if name else ""


# ------------------------------------------------------------------ bounds of ref accesses


def _raise_access(kind: str, name: str | None, where: str | None, shape: Any, *lo_hi: Any) -> None:
    half = len(lo_hi) // 2
    ranges = ", ".join(
        f"{int(a)}..{int(b)}" for a, b in zip(lo_hi[:half], lo_hi[half:], strict=True)
    )
    fault = SimulationFault(
        f"{kind} out of bounds{_kernel_label(name)}"
        + (f" at {where}" if where else "")
        + f": indices {ranges} of a ref of shape {tuple(shape)}",
        device=None,
        core=None,
        kernel=name,
        location=where,
        operation=f"{kind} out of bounds",
        index=ranges,
        rule=_OOB_RULE,
        chip=current_name(),
        fix="keep the pl.ds(start, size) / index within the ref (clamp it, or size the buffer "
        "for the largest index)",
    )
    WATCHDOG.record(fault)
    raise fault


def when(bad: Any, report: Callable[..., None], *values: Any) -> None:
    """Call ``report(*values)`` on the host (where it raises) only if ``bad`` holds: the loop
    pays a comparison, not a callback, per checked access."""

    def call() -> None:
        jax.debug.callback(report, *values)

    lax.cond(bad, call, lambda: None)


def _index_bounds(indexer: Any) -> tuple[list[Any], list[Any], list[int]] | None:
    """(lowest, highest, size) per indexed dimension of an ``NDIndexer``; None if it is empty."""
    from jax._src import indexing as slices

    lows: list[Any] = []
    highs: list[Any] = []
    dims: list[int] = []
    for index, dim in zip(indexer.indices, indexer.shape, strict=True):
        if isinstance(index, slices.Slice):
            if isinstance(index.size, int) and index.size == 0:
                return None
            lows.append(jnp.asarray(index.start, jnp.int32))
            highs.append(jnp.asarray(index.start, jnp.int32) + (index.size - 1) * int(index.stride))
        else:
            value = jnp.asarray(index, jnp.int32)
            if value.size == 0:
                return None
            lows.append(jnp.min(value))
            highs.append(jnp.max(value))
        dims.append(int(dim))
    return lows, highs, dims


def _check_transforms(kind: str, transforms: Any) -> None:
    from jax._src import source_info_util
    from jax._src.state import indexing

    from coremesh.testing.sim.faults import user_location

    where = user_location(source_info_util.current())
    for transform in transforms or ():
        if not isinstance(transform, indexing.NDIndexer):
            continue
        bounds = _index_bounds(transform)
        if bounds is None or not bounds[0]:
            continue
        lows, highs, dims = bounds
        bad = functools.reduce(
            jnp.logical_or,
            [(lo < 0) | (hi >= d) for lo, hi, d in zip(lows, highs, dims, strict=True)],
        )
        report = functools.partial(
            _raise_access, kind, getattr(_tls, "kernel", None), where, transform.shape
        )
        when(bad, report, *lows, *highs)


def checked_rules(rules: dict[Any, Any]) -> dict[Any, Any]:
    """``rules`` (jax's discharge rules) with get/swap/addupdate checking their indices while a
    fast-path kernel is discharged (:func:`run`), and unchanged otherwise."""
    from jax._src import tree_util
    from jax._src.state import primitives as state_primitives

    kinds = {
        state_primitives.get_p: ("a load from a ref", 1),
        state_primitives.swap_p: ("a store to a ref", 2),
        state_primitives.addupdate_p: ("an add-update of a ref", 2),
    }

    def wrap(rule: Callable[..., Any], kind: str, values: int) -> Callable[..., Any]:
        @functools.wraps(rule)
        def checked(*args: Any, tree: Any, **kw: Any) -> Any:
            if getattr(_tls, "checking", False):
                # jax 0.10 passes (in_avals, out_avals, ...), later lines one context.
                lead = 1 if hasattr(args[0], "in_avals") else 2
                idx = args[lead + values :]
                _check_transforms(kind, tree_util.tree_unflatten(tree, idx))
            return rule(*args, tree=tree, **kw)

        return checked

    return _Rules(
        rules,
        {p: wrap(rules[p], kind, values) for p, (kind, values) in kinds.items() if p in rules},
    )


class _Rules(dict):  # type: ignore[type-arg]
    """jax's discharge rule table with some rules wrapped; new registrations reach the
    original table too, so nothing registered while the simulator is open is lost."""

    def __init__(self, original: dict[Any, Any], wrapped: dict[Any, Any]) -> None:
        super().__init__(original)
        self.update(wrapped)
        self._original = original

    def __setitem__(self, key: Any, value: Any) -> None:
        self._original[key] = value
        super().__setitem__(key, value)


# ------------------------------------------------------------------ fill values and the taint


def fill(shape: Sequence[int], dtype: Any, *, taint: bool, mode: str) -> Any:
    """A fresh buffer: the tagged NaN (``taint``), else the interpreter's fill."""
    dtype = np.dtype(dtype)
    layout = shadow.taint_layout(dtype) if taint else None
    if layout is not None:
        bits = jnp.full(tuple(shape), shadow.tainted_nan(layout), layout[0])
        return lax.bitcast_convert_type(bits, dtype)
    # The interpreter's own value, read through its module so the simulator's patches to it
    # (Mosaic's poison under ``jax_pallas_poison_buffers``) hold on this path too.
    from jax._src.pallas.mosaic.interpret import utils

    return jnp.full(tuple(shape), utils.get_uninitialized_value(dtype, mode), dtype)


def _tainted(values: Any) -> Any:
    layout = shadow.taint_layout(np.dtype(values.dtype))
    assert layout is not None  # the caller checked
    return shadow.tagged(lax.bitcast_convert_type(values, layout[0]), layout)


#: Attribute of a compiled path's result error: (re-run the kernel interpreted, its operands).
RERUN = "_coremesh_rerun"


def _report_result(
    name: str | None,
    output: int,
    shape: Any,
    rerun: Callable[..., Any] | None,
    count: Any,
    first: Any,
    *operands: Any,
) -> None:
    index = tuple(int(i) for i in np.unravel_index(int(first), tuple(shape)))
    err = UninitializedReadError(
        f"a kernel's result holds unwritten memory{_kernel_label(name)}: {int(count)} of "
        f"{math.prod(shape)} element(s) of output {output} were never written or were computed "
        f"from unwritten memory, the first at {index}; the compiled fast path does not record "
        "which read was first (simulate(fast_path=False) names it)",
        device=None,
        core=None,
        kernel=name,
        location=None,
        operation="the kernel's result",
        buffer=f"output {output}",
        index=f"{index}",
        rule=shadow.RULE,
        chip=current_name(),
        fix="write every element of the output, and memory before reading it" + shadow.TURN_OFF,
    )
    if rerun is not None:
        setattr(err, RERUN, (rerun, [np.array(a, copy=True) for a in operands]))
    shadow.report_result_error(err)


# ------------------------------------------------------------------ the grid loop


def _block_kinds(bm: Any) -> tuple[bool, ...]:
    """Which block dimensions are squeezed (``None`` / ``pl.Squeezed()``)."""
    return tuple(type(bd).__name__ == "Squeezed" or bd is None for bd in bm.block_shape)


Squeeze = tuple[bool, ...]


def _slice(value: Any, starts: Sequence[Any], shape: tuple[int, ...], squeeze: Squeeze) -> Any:
    out = lax.dynamic_slice(value, [jnp.asarray(s, jnp.int32) for s in starts], shape)
    dims = tuple(i for i, s in enumerate(squeeze) if s)
    return lax.squeeze(out, dims) if dims else out


def _update(
    value: Any, block: Any, starts: Sequence[Any], shape: tuple[int, ...], squeeze: Squeeze
) -> Any:
    kept = tuple(i for i, s in enumerate(squeeze) if not s)
    block = lax.broadcast_in_dim(block, shape, kept)
    return lax.dynamic_update_slice(value, block, [jnp.asarray(s, jnp.int32) for s in starts])


def _fresh_if(pred: Any, value: Any, filler: Callable[..., Any]) -> Any:
    """A fresh buffer where ``pred`` holds, else ``value``: a branch, not an elementwise select
    (which reads and writes the whole buffer at every grid step)."""
    return lax.cond(pred, lambda v: filler(v.shape, v.dtype), lambda v: v, value)


def _padded(shape: Sequence[int], block: Sequence[int]) -> tuple[int, ...]:
    """``shape`` rounded up to whole blocks."""
    return tuple(-(-d // b) * b for d, b in zip(shape, block, strict=True))


def _pad(value: Any, shape: tuple[int, ...], filler: Callable[..., Any]) -> Any:
    padded = _padded(value.shape, shape)
    if padded == tuple(value.shape):
        return value
    base = filler(padded, value.dtype)
    return lax.dynamic_update_slice(base, value, (0,) * value.ndim)


def _first_outside(
    blocks: list[Any], shapes: list[Any], flat: tuple[Any, ...]
) -> tuple[int, tuple[int, ...], Any] | None:
    """(which block, its start, its operand's shape) of the first block outside its operand."""
    at = 0
    for k, (block, shape) in enumerate(zip(blocks, shapes, strict=True)):
        index = tuple(int(s) for s in flat[at : at + len(block)])
        at += len(block)
        if any(s < 0 or s + b > d for s, b, d in zip(index, block, shape, strict=True)):
            return k, index, shape
    return None


def _raise_block(name: str | None, blocks: list[Any], shapes: list[Any], *flat: Any) -> None:
    """Raise for the first block of a step that lies outside its (padded) operand."""
    found = _first_outside(blocks, shapes, flat)
    if found is None:
        return
    operand, index, shape = found
    fault = SimulationFault(
        f"a block index out of bounds{_kernel_label(name)}: block {operand} (inputs, then "
        f"outputs) starts at element {index}, outside its (padded) shape {tuple(shape)}",
        device=None,
        core=None,
        kernel=name,
        location=None,
        operation="a pipeline block copy out of bounds",
        index=f"{index}",
        rule="an index map returns block indices inside the array (the last block may be partial)",
        chip=current_name(),
        fix="clamp the index map's result to the number of blocks (pl.cdiv(size, block) - 1)",
    )
    WATCHDOG.record(fault)
    raise fault


def megacore_split(grid: tuple[int, ...], compiler_params: Any, cores: int) -> int:
    """Grid steps per core, as the interpreter splits a grid between a chip's cores: the
    points of the leading "parallel" dimensions, rounded up to a whole share each."""
    n = math.prod(grid)
    semantics = getattr(compiler_params, "dimension_semantics", None) or ()
    parallel = 1
    for size, sem in zip(grid, semantics, strict=False):
        if str(sem).lower().rsplit(".", 1)[-1] != "parallel":  # as the interpreter splits
            break
        parallel *= size
    return -(-parallel // cores) * (n // parallel) if n else 1


def grid_order(grid: tuple[int, ...], compiler_params: Any, seed: int | None) -> Any:
    """The interpreter's order of the parallel grid points (seeded, the same permutation)."""
    from jax._src.pallas.mosaic import core as mosaic_core
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return ipc._get_randomized_grid_coordinates(
        grid, compiler_params or mosaic_core.CompilerParams(), seed
    )


def run(
    *args: Any,
    jaxpr: Any,
    grid_mapping: Any,
    compiler_params: Any,
    name: str | None,
    rerun: Callable[..., Any] | None,
    taint: bool,
    mode: str,
    cores: int,
    seed: int | None,
) -> list[Any]:
    """The outputs of the kernel ``jaxpr`` over its grid (traced inside the call's lowering)."""
    from jax._src.pallas import hlo_interpreter

    _tls.kernel, _tls.checking = name, True
    try:
        body, body_consts, scratch_avals = hlo_interpreter.kernel_to_hlo_jaxpr(
            jaxpr, (), grid_mapping
        )
    finally:
        _tls.checking = False
    grid = tuple(int(g) for g in grid_mapping.grid)
    n = math.prod(grid)
    per_core = megacore_split(grid, compiler_params, cores)
    filler = functools.partial(fill, taint=taint, mode=mode)
    loop = GridLoop(
        step=_Discharged(body, scratch_avals, filler, grid_mapping),
        grid_mapping=grid_mapping,
        n_scalars=grid_mapping.num_index_operands,
        per_core=per_core,
        coords=grid_order(grid, compiler_params, seed),
        name=name,
        filler=filler,
    )
    shares = [(c * per_core, min((c + 1) * per_core, n)) for c in range(cores)]
    shares = [(a, b) for a, b in shares if a < b]
    if len(shares) > 1 and largest_product(body) <= THREADED_PRODUCT_MAX:
        outs = _on_threads(loop, shares, body_consts, args)
    else:
        outs, _, _ = loop(0, n, body_consts, *args)
    results = []
    for k, (padded_out, bm) in enumerate(zip(outs, loop.outputs, strict=True)):
        value = lax.slice(padded_out, (0,) * padded_out.ndim, bm.array_aval.shape)
        if taint and shadow.taint_layout(np.dtype(value.dtype)) is not None:
            mask = _tainted(value).reshape(-1)
            count = jnp.sum(mask, dtype=jnp.int32)
            first_hit = jnp.argmax(mask)
            report = functools.partial(_report_result, name, k, bm.array_aval.shape, rerun)
            when(count > 0, report, count, first_hit, *args)
        results.append(value)
    return results


class _Discharged:
    """A grid step of a kernel whose refs are all blocks and scratch: its state-discharged
    body, with the scratch values as the carry (fresh on each core)."""

    def __init__(
        self, body: Any, scratch_avals: Sequence[Any], filler: Callable[..., Any], gm: Any
    ) -> None:
        self.body, self.scratch_avals, self.filler = body, scratch_avals, filler
        self.n_out = gm.num_outputs
        self.n_in = len(gm.block_mappings) - self.n_out
        self.whole = (False,) * len(gm.block_mappings)

    def init(self, consts: Sequence[Any], scalars: Sequence[Any], whole: Sequence[Any]) -> Any:
        del consts, scalars, whole
        return [self.filler(a.shape, a.dtype) for a in self.scratch_avals]

    def begin(self, first: Any, carry: Any) -> Any:
        return [_fresh_if(first, v, self.filler) for v in carry]

    def __call__(
        self,
        consts: Sequence[Any],
        carry: Any,
        scalars: Sequence[Any],
        in_blocks: Sequence[Any],
        out_blocks: Sequence[Any],
        point: tuple[Any, ...],
    ) -> tuple[list[Any], Any]:
        from jax._src import core as jax_core

        del point  # program ids read the grid environment
        results = jax_core.eval_jaxpr(self.body, consts, *scalars, *in_blocks, *out_blocks, *carry)[
            len(scalars) :
        ]
        n_in, n_out = self.n_in, self.n_out
        return list(results[n_in : n_in + n_out]), list(results[n_in + n_out :])


class GridLoop:
    """The steps ``[start, stop)`` of a kernel's grid as one ``while_loop``: a whole single-core
    grid, or one core's share of it. The loop slices each step's input blocks, keeps its output
    blocks and writes them back; ``step`` (:class:`_Discharged`, or the DMA kernels' step of
    :mod:`coremesh.testing.sim.compiled_grid_dma`) runs the body on them and carries the rest
    (scratch, refs reached by DMA) from step to step, restarting it where a core starts. A
    share also returns, per output block, which elements it wrote back. Operands the step
    marks ``whole`` (HBM refs the kernel reaches by DMA) are its own, not sliced here."""

    def __init__(
        self,
        *,
        step: Any,
        grid_mapping: Any,
        n_scalars: int,
        per_core: int,
        coords: Any,
        name: str | None,
        filler: Callable[..., Any],
    ) -> None:
        from jax._src.pallas import core as pallas_core

        self.step, self.name, self.filler = step, name, filler
        self.grid = tuple(int(g) for g in grid_mapping.grid)
        self.n_scalars, self.per_core, self.coords = n_scalars, per_core, coords
        mappings = grid_mapping.block_mappings
        n_in = len(mappings) - grid_mapping.num_outputs
        whole = tuple(step.whole)
        self.blocked = [k for k in range(len(mappings)) if not whole[k]]
        self.whole_inputs = [k for k in range(n_in) if whole[k]]
        self.mappings = [mappings[k] for k in self.blocked]
        self.n_in = sum(1 for k in self.blocked if k < n_in)
        self.outputs = self.mappings[self.n_in :]
        self.shapes = [tuple(pallas_core._get_block_shape(bm.block_shape)) for bm in self.mappings]
        self.squeezes = [_block_kinds(bm) for bm in self.mappings]
        self.out_shapes = [
            _padded(bm.array_aval.shape, s)
            for bm, s in zip(self.outputs, self.shapes[self.n_in :], strict=True)
        ]

    def __call__(
        self,
        start: Any,
        stop: Any,
        consts: Sequence[Any],
        *args: Any,
        track: bool = False,
        coords: Sequence[Any] | None = None,
    ) -> tuple[list[Any], list[Any], Any]:
        """(padded output blocks, written masks: empty unless ``track``, the step's carry)
        after steps start..stop."""
        from jax._src.pallas import core as pallas_core

        filler, grid, shapes, squeezes = self.filler, self.grid, self.shapes, self.squeezes
        n, per_core, n_in = math.prod(grid), self.per_core, self.n_in
        scalars = args[: self.n_scalars]
        operands = args[self.n_scalars :]
        ins = [
            _pad(operands[k], s, filler)
            for k, s in zip(self.blocked[:n_in], shapes[:n_in], strict=True)
        ]
        outs = [
            filler(s, bm.array_aval.dtype)
            for s, bm in zip(self.out_shapes, self.outputs, strict=True)
        ]
        state = self.step.init(consts, scalars, [operands[k] for k in self.whole_inputs])
        masks = [jnp.zeros(s, jnp.bool_) for s in self.out_shapes] if track else []
        padded = [x.shape for x in ins] + [o.shape for o in outs]
        step_fn, name = self.step, self.name
        coords = self.coords if coords is None else coords

        def step(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            i, loop_idx, prev, out_vals, state, mask_vals = carry
            first = (i % per_core) == 0 if per_core < n else i == 0
            point = tuple(
                li if c.size == 0 else c[li] for li, c in zip(loop_idx, coords, strict=True)
            )
            env = tuple(pallas_core.GridAxis(idx, b) for idx, b in zip(point, grid, strict=True))
            with pallas_core.grid_env(env):
                starts = [
                    tuple(bm.compute_start_indices_interpret(point, *scalars))
                    for bm in self.mappings
                ]
            bad = [
                (s < 0) | (s + b > f)
                for start, shape, full in zip(starts, shapes, padded, strict=True)
                for s, b, f in zip(start, shape, full, strict=True)
            ]
            if bad:  # one check per step for every block
                flat = [s for start in starts for s in start]
                report = functools.partial(_raise_block, name, shapes, padded)
                when(functools.reduce(jnp.logical_or, bad), report, *flat)
            if per_core < n:
                state = step_fn.begin(first, state)
            in_blocks = [
                _slice(x, s, b, q)
                for x, s, b, q in zip(ins, starts, shapes, squeezes, strict=False)
            ]
            out_blocks = []
            for k, value in enumerate(out_vals):
                start = starts[n_in + k]
                changed = functools.reduce(
                    jnp.logical_or,
                    [jnp.asarray(a, jnp.int32) != b for a, b in zip(start, prev[k], strict=True)],
                    first,
                )
                block = _slice(value, start, shapes[n_in + k], squeezes[n_in + k])
                out_blocks.append(_fresh_if(changed, block, filler))
            with pallas_core.grid_env(env):
                written, state = step_fn(consts, state, scalars, in_blocks, out_blocks, point)
            new_outs = [
                _update(value, block, starts[n_in + k], shapes[n_in + k], squeezes[n_in + k])
                for k, (value, block) in enumerate(zip(out_vals, written, strict=True))
            ]
            mask_vals = [
                _update(
                    m,
                    jnp.ones(b.shape, jnp.bool_),
                    starts[n_in + k],
                    shapes[n_in + k],
                    squeezes[n_in + k],
                )
                for k, (m, b) in enumerate(zip(mask_vals, written, strict=False))
            ]
            nxt = []
            carry_on = jnp.bool_(True)
            for size, index in reversed(list(zip(grid, loop_idx, strict=True))):
                bumped = jnp.where(carry_on, index + 1, index)
                carry_on = bumped == size
                nxt.append(jnp.where(carry_on, 0, bumped))
            prev_new = tuple(
                tuple(jnp.asarray(s, jnp.int32) for s in starts[n_in + k]) for k in range(len(outs))
            )
            return i + 1, tuple(reversed(nxt)), prev_new, new_outs, state, mask_vals

        start = jnp.asarray(start, jnp.int32)
        index, rest = [], start
        for size in reversed(grid):  # the multi-index of the share's first step
            index.append(rest % size)
            rest = rest // size
        prev0 = tuple(tuple(jnp.int32(-1) for _ in shapes[k]) for k in range(n_in, len(shapes)))
        carry0 = (start, tuple(reversed(index)), prev0, outs, state, masks)
        carry = lax.while_loop(lambda c: c[0] < stop, step, carry0)
        return list(carry[3]), list(carry[5]), carry[4]


#: The cores' shares of a grid run on host threads only when no product in a step has more
#: multiply-adds than this: XLA:CPU spreads a larger one over the host's threads by itself, and
#: two shares of those contend. Measured on 2 CPUs (jax 0.11.2 / 0.12.0.1): JAX's
#: flash_attention (128x128x128 products, 2.1M) took 27 ms in one program, 16-22 ms on threads;
#: its matmul (512x512x256 blocks, 67M) 113-125 ms in one program, 115-180 ms on threads.
THREADED_PRODUCT_MAX = 128 * 128 * 256

#: Host threads that run the shares of a multi-core chip's grid (the caller's thread waits).
_POOL: list[concurrent.futures.ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    with _POOL_LOCK:
        if not _POOL:
            workers = max(2, os.cpu_count() or 2)
            _POOL.append(concurrent.futures.ThreadPoolExecutor(workers, "coremesh-core"))
        return _POOL[0]


def _on_threads(
    loop: GridLoop, shares: list[tuple[int, int]], consts: Sequence[Any], args: Sequence[Any]
) -> list[Any]:
    """The padded outputs of a grid split between cores, each core's share run at once on its
    own host thread as one compiled loop (XLA:CPU runs two loops of one program one after the
    other), merged as the interpreter's cores leave them: each element holds the last write of
    the last core that wrote it (cores write disjoint blocks unless they race)."""
    from jax._src import mesh as mesh_lib

    compiled: list[Any] = []
    lock = threading.Lock()
    traced_in = mesh_lib.get_abstract_mesh()

    n_consts, n_coords = len(consts), len(loop.coords)

    def share(start: Any, stop: Any, *flat: Any) -> Any:
        consts, coords = flat[:n_consts], flat[n_consts : n_consts + n_coords]
        outs, masks, _ = loop(
            start, stop, consts, *flat[n_consts + n_coords :], track=True, coords=coords
        )
        return outs, masks

    def host(*flat: Any) -> Any:
        with lock:  # compiled once per lowering, on the caller's thread (inside simulate())
            if not compiled:
                bounds = (np.int32(0), np.int32(0))
                # Traced in the mesh the kernel's values were (under shard_map, its manual
                # axes), not the caller's at run time.
                with mesh_lib.use_abstract_mesh(traced_in):
                    compiled.append(jax.jit(share).lower(*bounds, *flat).compile())
        fn = compiled[0]
        flat = jax.device_put(flat)  # once, for every share
        # Every share on a pool thread: a program the simulator runs in the user's thread
        # raises its fault there (patches.py, execute), and these must reach the caller's call.
        runs = [_pool().submit(fn, np.int32(a), np.int32(b), *flat) for a, b in shares]
        done = [r.result() for r in runs]
        return [[*outs, *masks] for outs, masks in done]

    specs = [
        jax.ShapeDtypeStruct(s, bm.array_aval.dtype)
        for s, bm in zip(loop.out_shapes, loop.outputs, strict=True)
    ]
    specs += [jax.ShapeDtypeStruct(s, np.bool_) for s in loop.out_shapes]
    # The operands, the body's constants and the grid order are values of the caller's trace.
    per_core = jax.pure_callback(host, [specs] * len(shares), *consts, *loop.coords, *args)
    count = len(loop.outputs)
    merged = list(per_core[0][:count])
    for later in per_core[1:]:
        merged = [
            jnp.where(mask, value, base)
            for base, value, mask in zip(merged, later[:count], later[count:], strict=True)
        ]
    return merged


def explained(err: Exception) -> Exception | None:
    """The interpreter's verdict on a compiled kernel's result that holds the fill, by running
    the kernel again interpreted on the same operands (after the call, when nothing else runs):
    its error when some value was computed from unwritten memory, None when the re-run finds
    none (elements the kernel never wrote are not an error), ``err`` itself when it cannot
    re-run."""
    rerun = getattr(err, RERUN, None)
    if rerun is None:
        return err
    fn, operands = rerun
    try:
        fn(*operands)
    except UninitializedReadError as exact:
        return exact
    except Exception:  # the re-run must never hide the compiled path's own finding
        return err
    return None
