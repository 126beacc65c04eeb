"""Grid kernels that reach operands in HBM (``memory_space=pl.ANY``) with local DMAs on the
compiled fast path: pages fetched into double buffers by DMAs that cross grid steps, scalar
prefetch, a megacore parallel dimension. Where the order of DMAs could show, the interpreter's
result or error is the call's, in the same program."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.testing.sim import Simulator, simulate

pytestmark = pytest.mark.sim

STEPS = 3  # blocks per core
CORES = 2  # the parallel dimension (v5p has two TensorCores)
PAGES = 16
PER_BLOCK = 2  # pages a block gathers
ROWS, LANES = 8, 128
RNG = np.random.default_rng(7)
X = RNG.standard_normal((CORES * STEPS * ROWS, LANES)).astype(np.float32)
POOL = RNG.standard_normal((PAGES, ROWS, LANES)).astype(np.float32)
TABLE = RNG.permutation(PAGES)[: CORES * STEPS * PER_BLOCK].astype(np.int32)
THEN_INTERPRETED = "compiled, then interpreted: "


def expected() -> np.ndarray:
    pages = POOL[TABLE].reshape(CORES * STEPS, PER_BLOCK, ROWS, LANES).sum(axis=1)
    out: np.ndarray = X + pages.reshape(-1, LANES)
    return out


def fetch(table: Any, pool: Any, buf: Any, sems: Any, block: Any, slot: Any) -> list[Any]:
    """The DMAs of one block's pages into ``buf[slot]``, all on ``sems[slot]``."""
    return [
        pltpu.make_async_copy(
            pool.at[table[block * PER_BLOCK + p]], buf.at[slot].at[p], sems.at[slot]
        )
        for p in range(PER_BLOCK)
    ]


def paged(
    *,
    read_early: bool = False,
    leave_one: bool = False,
    stray_wait: bool = False,
) -> Callable[..., None]:
    """A paged-attention-like body: at each step, the next block's pages are started into the
    other buffer, and the current block's (started the step before) waited at once."""

    def body(table: Any, x: Any, pool: Any, o: Any, buf: Any, sems: Any) -> None:
        core, i = pl.program_id(0), pl.program_id(1)
        block = core * STEPS + i
        slot = i % 2

        @pl.when(i == 0)
        def first_block() -> None:
            for copy in fetch(table, pool, buf, sems, block, slot):
                copy.start()

        @pl.when(i + 1 < STEPS)
        def next_block() -> None:
            for copy in fetch(table, pool, buf, sems, block + 1, 1 - slot):
                copy.start()

        early = buf[slot].sum(axis=0)  # read before its wait when read_early
        pltpu.make_async_copy(buf.at[slot], buf.at[slot], sems.at[slot]).wait()
        pages = early if read_early else buf[slot].sum(axis=0)
        o[...] = x[...] + pages
        if leave_one:

            @pl.when(i + 1 == STEPS)
            def leave_one_started() -> None:
                fetch(table, pool, buf, sems, block, slot)[0].start()

        if stray_wait:

            @pl.when(i + 1 == STEPS)
            def wait_once_more() -> None:
                pltpu.make_async_copy(buf.at[slot], buf.at[slot], sems.at[slot]).wait()

    return body


def call(body: Callable[..., None]) -> Any:
    spec = pl.BlockSpec((ROWS, LANES), lambda c, i, table: (c * STEPS + i, 0))
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(X.shape, jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(CORES, STEPS),
            in_specs=[spec, pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=spec,
            scratch_shapes=[
                pltpu.VMEM((2, PER_BLOCK, ROWS, LANES), jnp.float32),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )


def only_path(sim: Simulator) -> str:
    paths = set(sim.paths.values())
    assert len(paths) == 1, sim.paths
    return paths.pop()


def run(body: Callable[..., None], fast: bool) -> tuple[Any, str]:
    with simulate("v5p", 1, fast_path=fast, deadline=1.0) as sim:
        out = np.asarray(sim.run(call(body), TABLE, X, POOL))
    return out, only_path(sim)


def test_pages_fetched_across_steps_run_compiled_and_match_numpy() -> None:
    fast, path = run(paged(), True)
    assert path == "compiled"
    np.testing.assert_allclose(fast, expected(), rtol=1e-6, atol=1e-6)
    slow, path = run(paged(), False)
    assert path.startswith("interpreted")
    np.testing.assert_array_equal(fast, slow)


def outcome(body: Callable[..., None], fast: bool) -> tuple[Any, str]:
    """(the error's type and first line, or the result; the path taken)."""
    with simulate("v5p", 1, fast_path=fast, deadline=1.0) as sim:
        try:
            got: Any = np.asarray(sim.run(call(body), TABLE, X, POOL))
        except Exception as err:  # the interpreter's verdict, whatever it is
            first = str(err).splitlines()[0] if str(err) else ""
            # The interpreter's cores are threads: which one reports first varies.
            got = (type(err), re.sub(r"core \d|#\d+|id \d+", "N", first))
    return got, only_path(sim)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"read_early": True}, "a DMA in flight overlapped an access"),
        ({"leave_one": True}, "a DMA or semaphore count left when its scope ended"),
        ({"stray_wait": True}, "a wait no DMA in flight on its semaphore matched"),
    ],
)
def test_a_hazard_gives_the_interpreters_outcome(options: dict[str, bool], reason: str) -> None:
    fast, path = outcome(paged(**options), True)
    slow, _ = outcome(paged(**options), False)
    assert path.startswith(THEN_INTERPRETED) and reason in path, path
    if isinstance(slow, np.ndarray):
        np.testing.assert_array_equal(fast, slow)
    else:
        assert fast == slow


def reference_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths: np.ndarray, table: np.ndarray
) -> np.ndarray:
    batch, heads, dim = q.shape
    kv_heads = k.shape[0]
    keys = k[:, table].reshape(kv_heads, batch, -1, dim).transpose(1, 0, 2, 3)
    values = v[:, table].reshape(kv_heads, batch, -1, dim).transpose(1, 0, 2, 3)
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, dim)
    logits = np.einsum("bhgd,bhtd->bhgt", grouped, keys)
    seen = np.arange(keys.shape[2])[None, None, None, :] < lengths[:, None, None, None]
    logits = np.where(seen, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum("bhgt,bhtd->bhgd", weights, values)
    return np.asarray(out, np.float32).reshape(batch, heads, dim)


@pytest.mark.parametrize("megacore_mode", [None, "batch"])
def test_jax_paged_attention_runs_compiled_and_matches_a_reference(
    megacore_mode: str | None,
) -> None:
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    rng = np.random.default_rng(3)
    batch, kv_heads, heads, dim, page, per_seq = 2, 1, 8, 128, 8, 4

    def quarters(*shape: int) -> np.ndarray:  # exact in bfloat16: the chip's matmul passes
        return (rng.integers(-4, 5, shape) / 8).astype(np.float32)

    q = quarters(batch, heads, dim)
    k = quarters(kv_heads, batch * per_seq, page, dim)
    v = quarters(kv_heads, batch * per_seq, page, dim)
    lengths = np.array([11, 32], np.int32)
    table = rng.permutation(batch * per_seq).astype(np.int32).reshape(batch, per_seq)

    def attend(*args: Any) -> Any:
        return paged_attention(*args, pages_per_compute_block=2, megacore_mode=megacore_mode)

    results = {}
    for fast in (True, False):
        with simulate("v5p", 1, fast_path=fast) as sim:
            results[fast] = np.asarray(sim.run(jax.jit(attend), q, k, v, lengths, table))
            assert only_path(sim) == (
                "compiled" if fast else "interpreted: simulate(fast_path=False)"
            )
    want = reference_attention(q, k, v, lengths, table)
    np.testing.assert_allclose(results[True], want, atol=1e-2, rtol=1e-2)
    np.testing.assert_allclose(results[True], results[False], atol=1e-6, rtol=1e-6)


def test_auto_weighs_each_dma_start_and_says_so() -> None:
    """Under ``fast_path="auto"`` each DMA start as written weighs as ``AUTO_WRITTEN_PER_DMA``
    accesses (XLA compiles its copy and bookkeeping); this kernel's 4 starts over 6 steps keep
    it interpreted, and the reason counts them. The result is the same."""
    from coremesh.testing.sim import fast_path

    with simulate("v5p", 1, deadline=1.0) as sim:
        out = np.asarray(sim.run(call(paged()), TABLE, X, POOL))
    weight = fast_path.AUTO_WRITTEN_PER_DMA
    assert re.fullmatch(
        rf"interpreted: a small kernel \(\d+ memory accesses as run, \d+ as written, each of "
        rf"its 4 DMA starts counted as {weight}\): .*",
        only_path(sim),
    ), only_path(sim)
    np.testing.assert_allclose(out, expected(), rtol=1e-6)
