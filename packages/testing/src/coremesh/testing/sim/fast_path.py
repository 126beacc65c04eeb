"""Which path a kernel takes: compiled XLA (:mod:`coremesh.testing.sim.compiled`) or the
interpreter, and the record of which path each kernel took.

A ``pallas_call`` runs compiled when nothing in it needs the interpreter's exact model: no DMA,
semaphore, barrier, remote or device-id operation, core mesh, SparseCore primitive or callback;
only blocks the pipeline copies into VMEM/SMEM, VMEM/SMEM scratch, pure compute and plain ref
loads, stores and add-updates. A kernel over a core mesh (TensorCore, or SparseCore as a
named grid) runs compiled when its cores keep to local DMAs they wait for (:mod:`compiled_mesh`),
and so does a grid kernel with operands in HBM it reaches by such DMAs (:mod:`compiled_grid_dma`).
Everything else, and every kernel while the simulator runs a check only the interpreter does
(the race detector, a DMA schedule, a random grid order, a call's own ``InterpretParams``), takes
the interpreter, and the reason is recorded. So does a
kernel whose unwritten memory the compiled path cannot follow while the uninitialized-read check
is on (integer or bool scratch, outputs or partial blocks, where there is no NaN to carry the
taint, and a zero fill). The trace-time refusals (VMEM/SMEM capacity, operand dtypes, meshes)
run on both paths, before this choice.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from coremesh.testing.sim import compiled, compiled_grid_dma, compiled_mesh
from coremesh.testing.sim.grid_blocks import MEMORY_SPACES, blocks_refusal, carries_taint
from coremesh.testing.sim.jaxprs import accesses, all_eqns, is_semaphore, memory_space

COMPILED = "compiled"

#: Pallas primitives the compiled path runs (program ids, hints, scoped VMEM/SMEM scratch).
_ALLOWED_PALLAS = ("program_id", "num_programs", "multiple_of", "run_scoped")
#: Other primitives that need the interpreter: collectives across cores or devices, callbacks.
_NEEDS_INTERPRETER = frozenset(
    {
        "axis_index",
        "psum",
        "pmax",
        "pmin",
        "ppermute",
        "pbroadcast",
        "all_gather",
        "all_to_all",
        "reduce_scatter",
        "psum_scatter",
        "io_callback",
        "debug_callback",
        "pure_callback",
    }
)

#: Under ``fast_path="auto"`` a kernel runs compiled when it makes at least this many memory
#: accesses as run (each an interpreter callback of about 0.1 ms: a tenth of a second)...
AUTO_MIN_ACCESSES = 1024
#: ...and this many per access as written (what the compiled path traces and compiles: about
#: 0.1 s each for a core-mesh kernel, on top of half a second for any XLA program). Measured on
#: 2 CPUs, jax 0.12.0.1: the guide's add_one makes 6,148 accesses of 8 as written per device
#: (compiled: 1.5 s cold, 2 ms warm; interpreted: 1.5 s cold, 0.4 s warm); coremesh's column
#: reduce of 16 MiB makes 109 of 59 (compiled: 7 s cold; interpreted: 1.5 s).
AUTO_ACCESSES_PER_WRITTEN = 16
#: ...counting each DMA a grid kernel starts (:mod:`compiled_grid_dma`) as this many accesses as
#: written: its copy and the bookkeeping that vouches for it cost XLA about a fifth of a
#: second each to trace and compile. Measured on 2 CPUs, jax 0.12.0.1, JAX's paged attention
#: (8 KV heads, 32 query heads, head dim 128, 6 sequences of up to 2,048 tokens, pages of 16):
#: 2 pages a block (8 DMA starts as written): 2 s to trace, 2 s to compile, 0.1 s to run,
#: against 8 s interpreted; 8 pages (32 starts): 3 s and 4 s; 32 pages (128 starts, as JAX's
#: own test): 6 s and 22 s, then 0.1 s to run, against 4-5 s interpreted.
AUTO_WRITTEN_PER_DMA = 100


@functools.cache
def _pallas_primitives() -> frozenset[Any]:
    """Every primitive Pallas (and its TPU backend) defines, but those the compiled path runs."""
    import importlib

    from jax._src import core as jax_core

    found: set[Any] = set()
    for module in (
        "jax._src.pallas.primitives",
        "jax._src.pallas.core",
        "jax._src.pallas.mosaic.primitives",
        "jax._src.pallas.mosaic.core",
        "jax._src.pallas.mosaic.sc_primitives",
        "jax._src.pallas.mosaic.random",
    ):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found |= {v for v in vars(mod).values() if isinstance(v, jax_core.Primitive)}
    return frozenset(p for p in found if p.name not in _ALLOWED_PALLAS)


def _dtype(aval: Any) -> Any:
    return getattr(getattr(aval, "inner_aval", aval), "dtype", None)


def why_interpreted(kw: dict[str, Any], params: Any) -> str | None:
    """None when the kernel described by ``kw`` (``interpret_pallas_call``'s keywords) runs
    compiled under ``params``; else why it takes the interpreter."""
    off = getattr(params, "fast_path_off", "the call's own InterpretParams")
    if off:
        return str(off)
    own: frozenset[str] = getattr(params, "own_fields", frozenset())
    if own:
        return f"the call's own InterpretParams set {', '.join(sorted(own))}"
    checked = "uninitialized_reads" not in getattr(params, "patches_off", frozenset())
    zero_fill = getattr(params, "uninitialized_memory", "nan") == "zero"
    reason = _cannot(kw, checked, zero_fill)
    if reason is None and getattr(params, "fast_path_auto", False):
        return _small(kw)
    return reason


def _cannot(kw: dict[str, Any], checked: bool, zero_fill: bool) -> str | None:
    """Why the kernel of ``kw`` cannot run compiled (None: it can)."""
    gm, jaxpr = kw["grid_mapping"], kw["jaxpr"]
    if kw.get("mesh") is not None or getattr(gm, "grid_names", None):
        return compiled_mesh.why_interpreted(kw, checked, zero_fill)
    if gm.num_dynamic_grid_bounds:
        return "a grid whose size is known only at run time"
    if gm.vmapped_dims or gm.local_grid_env is not None:
        return "a vmapped grid"
    if kw.get("input_output_aliases"):
        return "input_output_aliases (an output that is an input)"
    if getattr(jaxpr, "constvars", ()):
        return "a kernel that closes over constants"
    if compiled_grid_dma.applies(kw):
        return compiled_grid_dma.why_interpreted(kw, checked, zero_fill)
    reason = blocks_refusal(gm, checked)
    if reason:
        return reason
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    n_in = len(gm.block_mappings) - gm.num_outputs
    first_in = gm.num_index_operands
    inputs = inner.invars[: first_in + n_in]  # scalar prefetch and the input blocks
    scratch = inner.invars[first_in + len(gm.block_mappings) :]
    fresh = [v.aval for v in inner.invars[first_in + n_in :]]
    for aval in (v.aval for v in scratch):
        if memory_space(aval) not in MEMORY_SPACES or is_semaphore(aval):
            return f"scratch of kind {aval} (semaphores and HBM scratch need the interpreter)"
    reason = _body(inner, inputs)
    if reason:
        return reason
    fresh += [v.aval for eqn in _scoped(inner) for v in eqn.params["jaxpr"].invars]
    if checked:
        if zero_fill and fresh:
            return (
                "uninitialized_memory='zero' with the uninitialized-read check on (a zero fill "
                "carries no taint)"
            )
        for aval in fresh:
            if not carries_taint(_dtype(aval)):
                return (
                    f"a {_dtype(aval)} output or scratch buffer with the uninitialized-read check "
                    "on (only float elements carry the taint compiled)"
                )
    return None


def _small(kw: dict[str, Any]) -> str | None:
    """Why compiling the kernel of ``kw`` would cost more than interpreting it (None: it would
    not): few memory accesses as run, or few for each one as written."""
    gm = kw["grid_mapping"]
    written, run = accesses(kw["jaxpr"])
    steps = int(np.prod([g if isinstance(g, int) else 1 for g in gm.grid]))
    if kw.get("mesh") is None:  # the pipeline copies each block in or out at every grid step
        written += len(gm.block_mappings)
        run += len(gm.block_mappings)
    dmas = ""
    if compiled_grid_dma.applies(kw):
        starts = sum(1 for e in all_eqns(kw["jaxpr"]) if e.primitive.name == "dma_start")
        written += (AUTO_WRITTEN_PER_DMA - 1) * starts
        if starts:
            dmas = f", each of its {starts} DMA starts counted as {AUTO_WRITTEN_PER_DMA}"
    run *= steps  # grid points, or the mesh's cores
    if run >= max(AUTO_MIN_ACCESSES, AUTO_ACCESSES_PER_WRITTEN * written):
        return None
    return (
        f"a small kernel ({run} memory accesses as run, {written} as written{dmas}): "
        "interpreting it costs less than compiling it (simulate(fast_path=True) compiles it "
        "anyway)"
    )


def _scoped(jaxpr: Any) -> Iterable[Any]:
    return (e for e in all_eqns(jaxpr) if e.primitive.name == "run_scoped")


def _body(jaxpr: Any, inputs: list[Any]) -> str | None:
    from jax._src import state, tree_util
    from jax._src.state import indexing

    pallas = _pallas_primitives()
    for eqn in all_eqns(jaxpr):
        prim = eqn.primitive
        if prim in pallas:
            return f"{prim.name} (DMAs, semaphores, barriers and TPU-specific operations)"
        if prim.name in _NEEDS_INTERPRETER:
            return f"{prim.name} (collectives and callbacks)"
        if prim.name in ("get", "swap", "addupdate") and "tree" in eqn.params:
            values = 1 if prim.name == "get" else 2
            transforms = tree_util.tree_unflatten(eqn.params["tree"], eqn.invars[values:])
            for t in transforms or ():
                if not isinstance(t, indexing.NDIndexer):
                    return f"a ref transform ({type(t).__name__})"
        if prim.name == "run_scoped":
            for v in eqn.params["jaxpr"].invars:
                if memory_space(v.aval) not in MEMORY_SPACES or is_semaphore(v.aval):
                    return f"run_scoped of {v.aval} (semaphores and HBM scratch)"
    written = {
        e.input
        for e in getattr(jaxpr, "effects", ())
        if isinstance(e, state.WriteEffect | state.AccumEffect)
    }
    for k, v in enumerate(inputs):
        if k in written or v in written:
            return f"a store to input {k} (the pipeline may not fetch its block again)"
    return None


# ---------------------------------------------------------------------------- which path each


class PathLog:
    """Kernel -> the path its last call took ("compiled" or "interpreted: <reason>")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, str] = {}

    def note(self, kernel: str, path: str) -> None:
        with self._lock:
            self._seen.pop(kernel, None)
            self._seen[kernel] = path

    def drain(self) -> dict[str, str]:
        with self._lock:
            seen, self._seen = self._seen, {}
            return seen


PATHS = PathLog()


def kernel_label(kw: dict[str, Any]) -> str:
    """The kernel's name (``name=``, else its body function's) for the path report."""
    debug = getattr(kw["jaxpr"], "debug_info", None)
    name = str(kw.get("name") or getattr(debug, "func_name", None) or "kernel")
    where = str(getattr(debug, "func_src_info", None) or "").rpartition(" at ")[2]
    return f"{name} ({where.rpartition('/')[2]})" if where else name


def _note(kernel: str, path: str) -> None:
    PATHS.note(kernel, path)


def _note_fallback(kernel: str, flag: Any) -> None:
    PATHS.note(kernel, f"compiled, then interpreted: {compiled_mesh.reasons(flag)}")


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's kernel entry, choosing the path; the checked discharge rules."""
    import jax
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.state import discharge as state_discharge

    orig_call = ipc.interpret_pallas_call

    def interpret_pallas_call(*args: Any, interpret_params: Any, **kw: Any) -> Any:
        reason = why_interpreted(kw, interpret_params)
        label = kernel_label(kw)
        path = COMPILED if reason is None else f"interpreted: {reason}"
        if reason != RERUN_REASON:  # the path report keeps the call's own path
            jax.debug.callback(functools.partial(_note, label, path))
        if reason is not None:
            return orig_call(*args, interpret_params=interpret_params, **kw)
        taint = "uninitialized_reads" not in interpret_params.patches_off
        vouched: dict[str, Any] = {
            "fill": functools.partial(
                compiled.fill, taint=taint, mode=interpret_params.uninitialized_memory
            ),
            "taint": taint,
            "interpreted": functools.partial(orig_call, interpret_params=interpret_params, **kw),
            "note": functools.partial(_note_fallback, label),
        }
        if kw.get("mesh") is not None or getattr(kw["grid_mapping"], "grid_names", None):
            return compiled_mesh.run(*args, kw=kw, **vouched)
        if compiled_grid_dma.applies(kw):
            return compiled_grid_dma.run(
                *args,
                kw=kw,
                cores=int(interpret_params.num_cores_or_threads),
                seed=interpret_params.random_seed,
                name=label,
                **vouched,
            )
        return compiled.run(
            *args,
            jaxpr=kw["jaxpr"],
            grid_mapping=kw["grid_mapping"],
            compiler_params=kw.get("compiler_params"),
            name=label,
            rerun=functools.partial(_rerun, kw, interpret_params),
            taint=taint,
            mode=interpret_params.uninitialized_memory,
            cores=int(interpret_params.num_cores_or_threads),
            seed=interpret_params.random_seed,
        )

    return [
        (ipc, "interpret_pallas_call", interpret_pallas_call),
        (
            state_discharge,
            "_discharge_rules",
            compiled.checked_rules(state_discharge._discharge_rules),
        ),
    ]


def _rerun(kw: dict[str, Any], params: Any, *operands: Any) -> Any:
    """Run the kernel of ``kw`` once more on the interpreter (to name an unwritten read)."""
    import dataclasses

    import jax
    from jax._src.pallas import pallas_call as pallas_call_module

    slow = dataclasses.replace(params, fast_path_off=RERUN_REASON)

    def call(*args: Any) -> Any:
        return pallas_call_module.pallas_call_p.bind(*args, interpret=slow, **kw)

    return jax.block_until_ready(jax.jit(call)(*operands))


#: The path a kernel re-run to explain its compiled result takes.
RERUN_REASON = "a re-run of a compiled kernel whose result holds unwritten memory"


def off_reason(
    *, fast_path: bool, races: bool, schedule: Any, disabled: frozenset[str] = frozenset()
) -> str:
    """Why the simulator runs every kernel interpreted ("" when it does not).

    A left-out fix (``disable_patches``, which regression tests use to show upstream's own
    behaviour) asks for the interpreter as it stands, so the fast path steps aside for it too;
    ``uninitialized_reads`` is ``check_uninitialized=False`` and ``chip_matmul`` is
    ``matmul="host"``, which the fast path honours (its products lower as the interpreter's).
    """
    if not fast_path:
        return "simulate(fast_path=False)"
    if races:
        return "races=True (the race detector watches every access)"
    if schedule is not None:
        return f"schedule={schedule} (the DMA order is the interpreter's)"
    left_out = sorted(disabled - {"uninitialized_reads", "chip_matmul"})
    if left_out:
        return f"disable_patches={left_out} (the interpreter without those fixes is asked for)"
    return ""
