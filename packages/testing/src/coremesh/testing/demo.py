"""``coremesh demo``: the core_map guide's programs end to end, on a laptop CPU.

The chip registry; the guide's five programs on a simulated v5p slice (4 devices x 2 TensorCores,
both DMA modes, and 1 device), each checked against numpy; the TensorCore and SparseCore ops and
the collectives on the simulator; every program compiled by libtpu for every TPU generation, with
progress; a kernel that waits for a semaphore nobody signals, turned into an error instead of a
hang. Sections are numbered as they are shown. Exit status 1 if anything does not match its
reference or does not compile where it should.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from typing import Any, Literal, TextIO

from coremesh.core import CHIPS, jax_compat

HOST_DEVICES = 16


class _Log:
    def __init__(self, out: TextIO) -> None:
        self.out, self.failures, self.sections = out, 0, 0

    def section(self, title: str) -> None:
        """A numbered heading: sections are numbered in the order they are shown."""
        self.sections += 1
        self.out.write(f"\n== {self.sections}. {title} ==\n")
        self.out.flush()

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def check(self, label: str, run: Callable[[], float | None]) -> None:
        """Run one check; print OK with its wall time, or FAIL with the reason."""
        t = time.perf_counter()
        try:
            detail = run()
        except Exception as e:  # a demo reports every failure and carries on
            self.failures += 1
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.line(f"  FAIL  {label}: {type(e).__name__}: {first[:200]}")
            return
        took = time.perf_counter() - t
        extra = f", warm call {detail * 1e3:.0f} ms" if detail is not None else ""
        self.line(f"  ok    {label}  ({took:.2f} s{extra})")


def _chips(log: _Log) -> None:
    from coremesh.testing import chip_table
    from coremesh.testing.aot.report import format_table

    log.section("The TPU generations coremesh knows (coremesh.core.CHIPS, as `coremesh info`)")
    for text in format_table(list(chip_table.HEADERS), chip_table.rows(), "plain").splitlines():
        log.line(f"  {text}")
    for note in chip_table.core_notes():
        log.line(f"  {note}")


def _guide(log: _Log) -> None:
    import numpy as np

    from coremesh.testing.guide import PROGRAMS
    from coremesh.testing.sim import simulate

    configs: list[tuple[int, Literal["on_wait", "eager"]]] = [
        (4, "on_wait"),
        (4, "eager"),
        (1, "on_wait"),
    ]
    log.section("The core_map guide's programs on the CPU simulator (chip v5p)")
    for devices, mode in configs:
        with simulate("v5p", devices, dma_execution_mode=mode) as sim:
            where = f"{devices} device(s) x {sim.cores_per_device} TensorCores, DMA {mode}"
            for name, program in PROGRAMS.items():
                if program.uses_sparsecore:
                    sc = sim.chip.sparsecore
                    assert sc is not None
                    where_p = (
                        f"{devices} device(s) x {sc.cores} SparseCores x {sc.subcores} subcores"
                    )
                else:
                    where_p = where

                def run(p: Any = program) -> float:
                    mesh = sim.mesh()
                    fn = p.build(mesh)
                    inputs = p.make_inputs(mesh, seed=1)
                    got = np.asarray(sim.run(fn, *inputs))
                    t = time.perf_counter()
                    sim.run(fn, *inputs)
                    warm = time.perf_counter() - t
                    want = p.expected(
                        *(np.asarray(a) for a in inputs), num_cores=sim.cores_per_device
                    )
                    np.testing.assert_array_equal(got, want)
                    return warm

                log.check(f"{name:16} on {where_p}: equals numpy", run)


def _tensorcore_ops(log: _Log) -> None:
    try:
        import coremesh.tensorcore as tc
    except ImportError:
        log.section("coremesh.tensorcore ops (skipped: coremesh-tensorcore not installed)")
        return
    import jax.numpy as jnp
    import numpy as np

    from coremesh.testing.sim import simulate

    log.section("coremesh.tensorcore ops on the simulator (v5p, 2 devices x 2 TensorCores)")
    rng = np.random.default_rng(0)
    x = (rng.integers(-64, 64, (256, 512)) / 4).astype(np.float32)
    y = (rng.integers(-64, 64, (256, 512)) / 4).astype(np.float32)
    with simulate("v5p", 2):
        checks: list[tuple[str, Callable[[], Any], Any]] = [
            (
                "map_blocks(x * 2 + y)",
                lambda: tc.map_blocks(lambda u, v: u * 2 + v, x, y),
                x * 2 + y,
            ),
            (
                "reduce(x, axis=0, 'sum') (cores combine by inter-core DMA)",
                lambda: tc.reduce(jnp.asarray(x), 0, "sum"),
                x.sum(0),
            ),
            ("reduce(x, axis=1, 'max')", lambda: tc.reduce(jnp.asarray(x), 1, "max"), x.max(1)),
            (
                "matmul(x, y.T) in bf16 -> f32",
                lambda: tc.matmul(
                    jnp.asarray(x, jnp.bfloat16), jnp.asarray(y.T[:, :256], jnp.bfloat16)
                ),
                x @ y.T[:, :256],
            ),
            (
                "gather_blocks(x, [7, 0, 31, 2])",
                lambda: tc.gather_blocks(jnp.asarray(x), jnp.array([7, 0, 31, 2], jnp.int32)),
                x.reshape(32, 8, 512)[[7, 0, 31, 2]].reshape(-1, 512),
            ),
        ]
        for label, fn, want in checks:

            def run(fn: Callable[[], Any] = fn, want: Any = want) -> None:
                np.testing.assert_allclose(np.asarray(fn(), np.float32), want, rtol=1e-5, atol=1e-3)

            log.check(f"{label}: equals numpy", run)


def _sparsecore_ops(log: _Log) -> None:
    try:
        import coremesh.sparsecore as sc
    except ImportError:
        log.section("coremesh.sparsecore ops (skipped: coremesh-sparsecore not installed)")
        return
    import jax.numpy as jnp
    import numpy as np

    from coremesh.testing.sim import simulate

    rng = np.random.default_rng(1)
    table = rng.integers(-99, 99, (512, 128)).astype(np.float32)
    idx = rng.integers(0, 512, 256).astype(np.int32)
    upd = rng.integers(-9, 9, (256, 128)).astype(np.float32)
    seg = np.sort(rng.integers(0, 40, 256)).astype(np.int32)
    scatter_ref = table.copy()
    np.add.at(scatter_ref, idx, upd)
    segment_ref = np.zeros((40, 128), np.float32)
    np.add.at(segment_ref, seg, upd)
    log.section("coremesh.sparsecore ops on the simulator (1 device of v5p, then of TPU7x)")
    for chip in ("v5p", "TPU7x"):
        with simulate(chip, 1) as sim:
            spec = sim.chip.sparsecore
            assert spec is not None
            log.line(
                f"  {chip}: {spec.cores} SparseCores x {spec.subcores} subcores, {spec.lanes} lanes"
            )
            checks: list[tuple[str, Callable[[], Any], Any]] = [
                (
                    "gather(table, 256 indices)",
                    lambda: sc.gather(jnp.asarray(table), idx),
                    table[idx],
                ),
                (
                    "scatter_add with duplicate indices",
                    lambda: sc.scatter_add(jnp.asarray(table), idx, jnp.asarray(upd)),
                    scatter_ref,
                ),
                (
                    "segment_sum(40 segments)",
                    lambda: sc.segment_sum(jnp.asarray(upd), seg, 40),
                    segment_ref,
                ),
            ]
            for label, fn, want in checks:

                def run(fn: Callable[[], Any] = fn, want: Any = want) -> None:
                    np.testing.assert_array_equal(np.asarray(fn()), want)

                log.check(f"{label}: equals numpy", run)


def _collectives(log: _Log) -> None:
    try:
        import coremesh.collectives as cl
    except ImportError:
        log.section("coremesh.collectives (skipped: coremesh-collectives not installed)")
        return
    import numpy as np

    from coremesh.testing.sim import simulate

    log.section("coremesh.collectives on a simulated v5p slice (4 devices x 2 TensorCores)")
    rng = np.random.default_rng(2)
    x = rng.integers(-8, 8, (4 * 256, 256)).astype(np.float32)  # 256 rows per device
    shards = x.reshape(4, 256, 256)
    cores = x.reshape(8, 128, 256)  # every core's share, in (device, core) order
    with simulate("v5p", 4):
        checks: list[tuple[str, Callable[[], Any], Any]] = [
            (
                "psum over 'device' (ring over ICI)",
                lambda: cl.psum(x, "device"),
                np.tile(shards.sum(0), (4, 1)),
            ),
            (
                "psum over ('device', 'core') (hierarchical)",
                lambda: cl.psum(x, ("device", "core"), algorithm="hierarchical"),
                np.tile(cores.sum(0), (8, 1)),
            ),
            (
                "all_gather over 'core' (the two TensorCores of each device)",
                lambda: cl.all_gather(x, "core", tiled=True),
                np.concatenate([np.tile(shards[d], (2, 1)) for d in range(4)]),
            ),
            (
                "reduce_scatter(max) over 'device', bidirectional ring",
                lambda: cl.reduce_scatter(
                    x, "device", op="max", tiled=True, algorithm="bidirectional"
                ),
                shards.max(0),
            ),
        ]
        for label, fn, want in checks:

            def run(fn: Callable[[], Any] = fn, want: Any = want) -> None:
                np.testing.assert_array_equal(np.asarray(fn()), want)

            log.check(f"{label}: equals numpy", run)


def _compile(log: _Log) -> None:
    from coremesh.testing import aot
    from coremesh.testing.guide import PROGRAMS

    programs: list[Any] = list(PROGRAMS.values())
    for package in ("tensorcore", "sparsecore", "collectives"):
        try:
            module = importlib.import_module(f"coremesh.{package}.programs")
        except ImportError:
            continue
        programs += module.programs()
    log.section(f"Compiled by libtpu for every TPU generation, no TPU ({len(programs)} programs)")
    t = time.perf_counter()
    results = aot.compile_matrix(programs, list(CHIPS), progress=_compile_progress(log, t))
    log.line(aot.matrix_table(results, "plain"))
    unexpected = [r for r in results if not r.as_expected]
    log.line(
        f"  {len(results)} compiles in {time.perf_counter() - t:.1f} s; "
        f"{len(unexpected)} not as expected"
    )
    log.failures += len(unexpected)


def _compile_progress(log: _Log, started: float, every: int = 20) -> Callable[[Any], None]:
    """A line every ``every`` compiles (and at the last), so a long matrix shows it is moving."""

    def report(p: Any) -> None:
        if p.result is not None and (p.index % every == 0 or p.index == p.total):
            log.line(
                f"  compiled {p.index}/{p.total} (last: {p.program} on {p.chip}), "
                f"{time.perf_counter() - started:.0f} s"
            )

    return report


def _deadlock(log: _Log) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from coremesh.testing.sim import SimulationDeadlock, simulate

    log.section("A kernel that waits for a signal nobody sends")

    def body(_o_hbm: Any, sem: Any) -> None:
        pl.semaphore_wait(sem, 1)  # no core ever signals it

    with simulate("v5p", 1, deadline=2.0) as sim:
        mesh = jax_compat.tensorcore_mesh("core")
        kernel = pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            mesh=mesh,
            scratch_types=[pltpu.SemaphoreType.REGULAR],
        )
        t = time.perf_counter()
        try:
            sim.run(jax.jit(kernel))
        except SimulationDeadlock as e:
            log.line(f"  ok    raised SimulationDeadlock after {time.perf_counter() - t:.1f} s:")
            for text in str(e).splitlines():
                log.line(f"          {text}")
            return
    log.failures += 1
    log.line("  FAIL  the kernel returned instead of raising SimulationDeadlock")


def main(out: TextIO = sys.stdout) -> int:
    from coremesh.testing.sim.devices import configure_host_devices

    configure_host_devices(HOST_DEVICES)
    log = _Log(out)
    t = time.perf_counter()
    log.line("coremesh demo: core-level Pallas TPU programs on this CPU, with a TPU's semantics")
    for step in (
        _chips,
        _guide,
        _tensorcore_ops,
        _sparsecore_ops,
        _collectives,
        _compile,
        _deadlock,
    ):
        step(log)
    verdict = "all checks passed" if not log.failures else f"{log.failures} check(s) FAILED"
    log.line(f"\ncoremesh demo: {verdict} in {time.perf_counter() - t:.0f} s")
    return 1 if log.failures else 0
