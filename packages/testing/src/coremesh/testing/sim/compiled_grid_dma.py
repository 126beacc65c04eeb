"""A grid ``pallas_call`` whose kernel reaches operands in HBM (``memory_space=pl.ANY``) with
local DMAs, as compiled XLA: JAX's paged attention and its kind (scalar prefetch, VMEM blocks,
pages copied into double buffers by DMAs started at one grid step and waited at the next).

It is the two compiled paths put together: the grid loop of :mod:`compiled`
(:class:`compiled.GridLoop`: blocks sliced by the index maps, fresh output blocks, the
interpreter's megacore split and order) runs, at each step, the kernel's jaxpr through the
evaluator of :mod:`compiled_mesh`, whose state (refs as values, DMA semaphores with the DMAs in
flight on them, the flag of hazards) is the loop's carry, so a DMA may cross steps. HBM operands
are refs bound once (and shared by the cores); scalar prefetch operands are SMEM refs, scratch
and semaphores are allocated once per core and start fresh on each; a core's semaphores must be
idle when it ends. Each step's blocks are refs for that step only: a DMA still reading or
writing one when the step ends (the pipeline copies it then) raises the flag. As for a mesh
kernel, the compiled result is returned only when the flag stays down; else the interpreter's,
computed in the same program.

The index maps see the scalar prefetch operands as passed: a kernel that stores to them while
an index map reads them (the interpreter computes the next step's blocks before the step
runs) takes the interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from jax import lax

from coremesh.testing.sim import compiled, compiled_mesh
from coremesh.testing.sim.grid_blocks import blocks_refusal, carries_taint
from coremesh.testing.sim.jaxprs import all_eqns, is_semaphore, memory_space

_HBM = ("any", "hbm")


def applies(kw: dict[str, Any]) -> bool:
    """Is the kernel of ``kw`` a grid kernel with an operand in HBM (this module's to run)?"""
    gm = kw["grid_mapping"]
    if kw.get("mesh") is not None or getattr(gm, "grid_names", None):
        return False
    return any(memory_space(bm.block_aval) in _HBM for bm in gm.block_mappings)


def why_interpreted(kw: dict[str, Any], checked: bool, zero_fill: bool) -> str | None:
    """None when the grid kernel of ``kw`` (:func:`applies`) runs here; else why it takes the
    interpreter. ``checked``: the uninitialized-read check is on."""
    gm, jaxpr = kw["grid_mapping"], kw["jaxpr"]
    reason = blocks_refusal(gm, checked, hbm=True)
    if reason:
        return reason
    n_scalars, n_io = gm.num_index_operands, len(gm.block_mappings)
    n_in = n_io - gm.num_outputs
    for bm in gm.block_mappings[n_in:]:
        if checked and not carries_taint(bm.array_aval.dtype):
            return (
                f"a {bm.array_aval.dtype} output with the uninitialized-read check on (only "
                "float elements carry the taint compiled)"
            )
    for k, bm in enumerate(gm.block_mappings):
        if memory_space(bm.block_aval) in _HBM and tuple(bm.block_aval.shape) != tuple(
            bm.array_aval.shape
        ):
            return f"operand {k} in HBM with a block smaller than the array"
    for v in jaxpr.invars:
        reason = compiled_mesh._ref_reason(v.aval)
        if reason:
            return reason
    fresh = [v.aval for v in jaxpr.invars[n_scalars + n_io :]]
    for eqn in all_eqns(jaxpr):
        reason = compiled_mesh._eqn_reason(eqn, (), named_grid=True)
        if reason:
            return reason
        if eqn.primitive.name == "run_scoped":
            fresh += [v.aval for v in eqn.params["jaxpr"].invars]
    written = _written(jaxpr)
    blocked_in = [
        n_scalars + k
        for k in range(n_in)
        if memory_space(gm.block_mappings[k].block_aval) not in _HBM
    ]
    if any(k in written for k in blocked_in):
        return "a store to an input block (the pipeline may not fetch it again)"
    if any(k in written for k in range(n_scalars)) and _maps_read_scalars(gm):
        return "a store to a scalar prefetch operand an index map reads"
    if checked and zero_fill and any(not is_semaphore(a) for a in fresh):
        return "uninitialized_memory='zero' with the uninitialized-read check on"
    return None


def _written(jaxpr: Any) -> set[int]:
    """The kernel's arguments it stores to, adds to, or copies into by DMA (by position)."""
    from jax._src import state

    found: set[int] = set()
    position = {v: k for k, v in enumerate(jaxpr.invars)}
    for effect in getattr(jaxpr, "effects", ()):
        if isinstance(effect, state.WriteEffect | state.AccumEffect):
            target = effect.input
            found.add(target if isinstance(target, int) else position.get(target, -1))
    for eqn in all_eqns(jaxpr):  # DMAs name their destination, not an effect, on some lines
        if eqn.primitive.name == "dma_start":
            dst = eqn.params["tree"].unflatten(eqn.invars)[1]
            found.add(position.get(getattr(dst, "ref", dst), -1))
    return found


def _maps_read_scalars(gm: Any) -> bool:
    """Does an index map read a scalar prefetch operand?"""
    from jax._src import core as jax_core

    for bm in gm.block_mappings:
        closed = bm.index_map_jaxpr
        inner = getattr(closed, "jaxpr", closed)
        scalars = set(inner.invars[len(gm.grid) :])
        used = [v for e in all_eqns(inner) for v in e.invars] + list(inner.outvars)
        if any(isinstance(v, jax_core.Var) and v in scalars for v in used):
            return True
    return False


class _DmaStep:
    """A grid step of a DMA kernel for :class:`compiled.GridLoop`: the kernel's jaxpr run by
    the evaluator of :mod:`compiled_mesh` on a state that is the loop's carry."""

    def __init__(self, kw: dict[str, Any], state: compiled_mesh._State) -> None:
        gm, jaxpr = kw["grid_mapping"], kw["jaxpr"]
        self.jaxpr, self.st = jaxpr, state
        self.grid = tuple(int(g) for g in gm.grid)
        self.n_scalars = gm.num_index_operands
        n_io = len(gm.block_mappings)
        self.n_in = n_io - gm.num_outputs
        self.whole = tuple(memory_space(bm.block_aval) in _HBM for bm in gm.block_mappings)
        invars = jaxpr.invars
        self.touched = compiled_mesh.dma_refs(jaxpr)
        self.scalar_vars = invars[: self.n_scalars]
        self.block_vars = invars[self.n_scalars : self.n_scalars + n_io]
        self.scratch_vars = invars[self.n_scalars + n_io :]
        self.scratch_avals = [v.aval for v in self.scratch_vars]
        self.refs: list[compiled_mesh._Ref | None] = []  # the whole operands' refs, by position
        self.scalars: list[compiled_mesh._Ref] = []
        self.scratch: list[compiled_mesh._Ref] = []
        self.scalar_values: list[Any] = []

    def init(self, consts: Sequence[Any], scalars: Sequence[Any], whole: Sequence[Any]) -> Any:
        """The state before the first step: HBM inputs bound, HBM outputs fresh (both shared
        by the cores), scalar prefetch and scratch as a core starts."""
        del consts  # the kernel closes over none (why_interpreted)
        st, given = self.st, iter(whole)
        self.refs = []
        for k, (v, hbm) in enumerate(zip(self.block_vars, self.whole, strict=True)):
            dma = self._dma(v)
            if not hbm:
                self.refs.append(None)
            elif k < self.n_in:
                self.refs.append(st.bind(v.aval, next(given), dma))
            else:
                self.refs.append(st.allocate(v.aval, dma))
        self.scalar_values = list(scalars)
        self.scalars = [
            st.bind(v.aval, x, self._dma(v)) for v, x in zip(self.scalar_vars, scalars, strict=True)
        ]
        self.scratch = [st.allocate(v.aval, self._dma(v), v) for v in self.scratch_vars]
        return st.carry()

    def _dma(self, var: Any) -> compiled_mesh.Dma:
        return compiled_mesh.dma_of(self.touched, var)

    def begin(self, first: Any, carry: Any) -> Any:
        """At a core's first step: the last core's semaphores idle, then its own fresh."""
        st = self.st

        def restart(carry: Any) -> Any:
            st.load(carry)
            st.check_idle(self.scratch)
            for ref, value in zip(self.scalars, self.scalar_values, strict=True):
                st.refs[ref.key] = value
            for ref, aval in zip(self.scratch, self.scratch_avals, strict=True):
                st.refill(ref, aval)
            return st.carry()

        out = lax.cond(first, restart, lambda c: c, carry)
        st.load(out)
        return out

    def __call__(
        self,
        consts: Sequence[Any],
        carry: Any,
        scalars: Sequence[Any],
        in_blocks: Sequence[Any],
        out_blocks: Sequence[Any],
        point: tuple[Any, ...],
    ) -> tuple[list[Any], Any]:
        del consts, scalars  # the kernel reads its own (SMEM) scalar refs
        st = self.st
        st.load(carry)
        blocks = iter([*in_blocks, *out_blocks])
        refs: list[compiled_mesh._Ref] = []
        step_refs: list[compiled_mesh._Ref] = []
        for whole, v in zip(self.refs, self.block_vars, strict=True):
            if whole is None:
                block = st.bind(v.aval, next(blocks), self._dma(v))
                step_refs.append(block)
            refs.append(whole or block)
        coords = {str(d): p for d, p in enumerate(point)}
        sizes = {str(d): s for d, s in enumerate(self.grid)}
        evaluator = compiled_mesh._Evaluator(st, coords, sizes, self.touched)
        evaluator.eval(self.jaxpr, (), [*self.scalars, *refs, *self.scratch])
        n_in_blocks = len(in_blocks)
        written = [st.refs[r.key] for r in step_refs[n_in_blocks:]]
        for ref in step_refs:  # the pipeline copies the blocks now: no DMA may touch them
            if ref.dst or ref.src:
                st.raise_flag(st.in_flight(ref), compiled_mesh._HAZARD)
            st.refs.pop(ref.key)
        return written, st.carry()

    def finish(self, carry: Any) -> list[Any]:
        """The HBM outputs after the last step, the last core's semaphores idle."""
        st = self.st
        st.load(carry)
        st.check_idle(self.scratch)
        return [st.refs[r.key] for r in self.refs[self.n_in :] if r is not None]


def run(
    *args: Any,
    kw: dict[str, Any],
    fill: Callable[..., Any],
    taint: bool,
    cores: int,
    seed: int | None,
    name: str | None,
    interpreted: Callable[..., list[Any]],
    note: Callable[[Any], None],
) -> list[Any]:
    """The outputs of the grid kernel of ``kw`` on ``args``, compiled; the interpreter's
    (``interpreted(*args)``, in the same program) when the compiled run cannot vouch for them;
    ``note(flag)`` records which path the call took."""
    args = compiled_mesh.plain(args)
    gm, jaxpr = kw["grid_mapping"], kw["jaxpr"]
    compiler_params = kw.get("compiler_params")
    st = compiled_mesh._State(compiled_mesh.ref_rank(jaxpr), fill, taint)
    step = _DmaStep(kw, st)
    grid = step.grid
    loop = compiled.GridLoop(
        step=step,
        grid_mapping=gm,
        n_scalars=step.n_scalars,
        per_core=compiled.megacore_split(grid, compiler_params, cores),
        coords=compiled.grid_order(grid, compiler_params, seed),
        name=name,
        filler=fill,
    )
    blocked, _, carry = loop(0, math.prod(grid), (), *args)
    hbm = step.finish(carry)
    padded = iter(blocked)
    results = []
    for k, bm in enumerate(gm.block_mappings[step.n_in :]):
        if step.whole[step.n_in + k]:
            results.append(hbm.pop(0))
        else:
            value = next(padded)
            results.append(lax.slice(value, (0,) * value.ndim, bm.array_aval.shape))
    return compiled_mesh.vouched(st, results, args, interpreted, note)
