"""profile(): children that hang, abort or outgrow their memory cost only their own program."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from coremesh.core.chips import CHIPS
from coremesh.testing.aot import ProgramError, profile
from coremesh.testing.aot import samples as kp
from coremesh.testing.aot.child_memory import MEMORY_CAP_ENV

SLOW_MODULE = textwrap.dedent(
    """
    import dataclasses
    import time
    from coremesh.testing.aot import Work, samples

    class Slow:
        name = "slow"
        timeout_s = 1.0  # its own bound; the real compiles keep the generous one
        def build(self, mesh):
            time.sleep(3600)  # never returns: only the timeout ends it
        def arg_specs(self, n):
            return samples.ADD_ONE.arg_specs(n)
        def in_specs(self):
            return samples.ADD_ONE.in_specs()

    # The same kernel with the work it declares for the roofline: 1 GB per device.
    DECLARED = dataclasses.replace(
        samples.ADD_ONE, name="declared_work", work_fn=lambda n: Work(bytes_accessed=10**9)
    )
    PROGRAMS = [Slow(), samples.ADD_ONE, DECLARED]
    """
)


def test_a_hung_compile_times_out_and_the_rest_still_runs(tmp_path: Any) -> None:
    module = tmp_path / "slow_programs.py"
    module.write_text(SLOW_MODULE)
    # No race with the clock: the hung program never returns (its own 1 s bound ends it), and
    # the real compiles after it in a fresh child have ten minutes, which only a hang misses.
    results = profile([f"{module}:PROGRAMS"], ["v6e"], include_xla=False, timeout_s=600)
    by_name = {r.program: r for r in results}
    assert by_name["slow"].status == "timeout"
    assert by_name["slow"].note == "no result within 1 s; the child was killed"
    assert by_name[kp.ADD_ONE.name].status == "ok"
    declared = by_name["declared_work"]
    assert declared.cycles == by_name[kp.ADD_ONE.name].cycles
    assert declared.roofline is not None
    assert declared.roofline.bound_s == pytest.approx(10**9 / CHIPS["v6e"].hbm_bytes_per_s)


GATHER_MODULE = textwrap.dedent(
    """
    import dataclasses
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    from coremesh.testing.aot import Arg, FunctionProgram, samples

    def _args(n):
        return [Arg((256, 128), jnp.float32), Arg((8 * n,), jnp.int32, P("device"))]

    def _gather(name):
        take = lambda x, i: jnp.take(x, i, axis=0)
        return FunctionProgram(name=name, builder=lambda _m: jax.jit(take), args=_args)

    AFTER = dataclasses.replace(samples.ADD_ONE, name="add_one_after")
    PROGRAMS = [_gather("gather_a"), samples.ADD_ONE, _gather("gather_b"), AFTER]
    """
)


def test_profile_aborts_with_profiles_between_keep_the_static_profile(tmp_path: Any) -> None:
    # libtpu 0.0.52's static profiler aborts on XLA's own gather on v5e ("Unsupported DMA
    # direction"). Two such aborts with a program profiled between them are the programs'
    # fault, not the chip's: the program after them still gets its estimate.
    module = tmp_path / "gather_programs.py"
    module.write_text(GATHER_MODULE)
    results = profile([f"{module}:PROGRAMS"], ["v5e"], include_xla=False)
    by_name = {r.program: r for r in results}
    for name in ("gather_a", "gather_b"):
        assert by_name[name].status == "no_estimate"
        assert "Unsupported DMA direction" in str(by_name[name].note)
    first, after = by_name[kp.ADD_ONE.name], by_name["add_one_after"]
    assert first.status == after.status == "ok"
    assert after.cycles == first.cycles and after.cycles is not None


def test_programs_must_be_findable_by_reference() -> None:
    with pytest.raises(ProgramError, match="module level"):
        profile([kp.add_one()], ["v5e"])


HOG_MODULE = textwrap.dedent(
    """
    import time
    from coremesh.testing.aot import samples

    class Hog:
        name = "hog"
        def build(self, mesh):
            held = []
            for _ in range(40):  # up to 4 GB, 100 MB every 0.1 s: the cap stops it first
                held.append(b"x" * (100 << 20))
                time.sleep(0.1)
            time.sleep(120)
        def arg_specs(self, n):
            return samples.ADD_ONE.arg_specs(n)
        def in_specs(self):
            return samples.ADD_ONE.in_specs()

    PROGRAMS = [Hog(), samples.ADD_ONE]
    """
)


def test_a_child_over_the_memory_cap_is_killed_and_the_rest_still_runs(tmp_path: Any) -> None:
    module = tmp_path / "hog_programs.py"
    module.write_text(HOG_MODULE)
    seen: list[tuple[str, Any]] = []
    results = profile(
        [f"{module}:PROGRAMS"],
        ["v6e"],
        include_xla=False,
        timeout_s=600,  # the hog is ended by the memory cap; add_one's compile only by a hang
        memory_cap_bytes=1 << 30,
        progress=lambda p: seen.append((p.program, p.result)),
    )
    by_name = {r.program: r for r in results}
    hog = by_name["hog"]
    assert hog.status == "aborted" and hog.cycles is None
    assert "over the memory cap of 1.0 GiB" in str(hog.note)
    assert "memory_cap_bytes" in str(hog.note) and MEMORY_CAP_ENV in str(hog.note)
    assert by_name[kp.ADD_ONE.name].status == "ok"
    assert ("hog", "aborted") in seen and (kp.ADD_ONE.name, "ok") in seen


def test_a_cap_below_start_up_aborts_every_program() -> None:
    results = profile(
        ["coremesh.testing.aot.guide:PROGRAMS[add_one]"], ["v5e"], memory_cap_bytes=1 << 20
    )
    assert [r.status for r in results] == ["aborted", "aborted"]
    assert all("over the memory cap of 1.0 MiB" in str(r.note) for r in results)
