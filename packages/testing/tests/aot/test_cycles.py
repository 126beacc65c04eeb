"""Static cycle estimates: coremesh's table against libtpu's own dump of the same compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from typing import Any

import jax
import pytest

from coremesh.core.chips import CHIPS
from coremesh.testing.aot import (
    CycleEstimate,
    ProgramError,
    cycles_table,
    lines_table,
    profile,
    to_json,
)
from coremesh.testing.aot import samples as kp
from coremesh.testing.aot.cycles import (
    MEMORY_CAP_ENV,
    OpCycles,
    group_rss_bytes,
    memory_cap,
    parse_size,
    parse_sparsecore_bundles,
    parse_static_profile,
    parse_tensorcore_bundles,
)
from coremesh.testing.aot.roofline import Work, roofline_for
from coremesh.testing.guide import PROGRAMS as GUIDE

ESTIMATED = ("v5e", "v5p", "v6e", "TPU7x")

# An independent compile of the guide's add_one and of plain-jnp x + 1, with nothing from
# coremesh.testing.aot: libtpu's static profile read straight from its dump directory.
REFERENCE = textwrap.dedent(
    """
    import glob, json, os, re, shutil, sys
    import numpy as np
    import jax
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from coremesh.testing.guide import PROGRAMS

    dump = sys.argv[1]
    program = PROGRAMS["add_one"]
    out = {}
    for chip, topo in [("v5e", "v5e:2x2"), ("v5p", "v5p:2x2x1"), ("v6e", "v6e:2x2"),
                       ("TPU7x", "TPU7x:2x1x1")]:
        devices = topologies.get_topology_desc(topology_name=topo, platform="tpu").devices
        mesh = Mesh(np.array(devices), ("device",))
        (spec,) = program.in_specs()
        (x,) = program.arg_specs(len(devices))
        arg = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))
        plain = jax.jit(jax.shard_map(lambda v: v + 1, mesh=mesh, in_specs=spec,
                                      out_specs=spec))
        for variant in ("kernel", "xla"):
            shutil.rmtree(dump, ignore_errors=True)
            with jax.set_mesh(mesh):
                fn = program.build(mesh) if variant == "kernel" else plain
                fn.lower(arg).compile()
            cycles = {}
            for path in glob.glob(os.path.join(dump, "*.textproto")):
                text = open(path).read()
                name = re.search(r'hlo_op_name: "([^"]+)"', text).group(1)
                cycles[name] = int(re.search(r"estimated_cycles: (\\d+)", text).group(1))
            out.setdefault(chip, {})[variant] = cycles
    print(json.dumps(out))
    """
)


Estimates = dict[tuple[str, str, str], CycleEstimate]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dump = str(tmp_path_factory.mktemp("reference") / "sp")
    env = dict(os.environ)
    env.update(
        LIBTPU_INIT_ARGS=f"--xla_jf_dump_static_llo_profile_to={dump}",
        JAX_PLATFORMS="cpu",
        ALLOW_MULTIPLE_LIBTPU_LOAD="1",
        TPU_ACCELERATOR_TYPE="v5p-8",
        TPU_WORKER_HOSTNAMES="localhost",
    )
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE, dump],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=True,
    )
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def estimates() -> Estimates:
    refs = [
        "coremesh.testing.aot.guide:PROGRAMS[add_one]",
        "coremesh.testing.aot.guide:PROGRAMS[sc_add_one]",
    ]
    results = profile(refs, list(CHIPS), jobs=2)
    return {(r.program, r.variant, r.chip): r for r in results}


@pytest.mark.parametrize("chip", ESTIMATED)
@pytest.mark.parametrize("variant", ["kernel", "xla"])
def test_add_one_cycles_are_libtpus(
    estimates: Estimates, reference: dict[str, Any], chip: str, variant: str
) -> None:
    r = estimates["add_one", variant, chip]
    assert r.status == "ok"
    assert {o.name: o.cycles for o in r.ops} == reference[chip][variant]
    cycles = sum(reference[chip][variant].values())
    assert r.cycles == cycles
    assert all(o.cycles is not None and o.cycles > 0 for o in r.ops)
    kinds = {o.kind for o in r.ops}
    assert kinds == ({"mosaic"} if variant == "kernel" else {"xla"})
    assert r.seconds == pytest.approx(cycles / CHIPS[chip].clock_hz)


def test_bigger_blocks_estimate_fewer_cycles_for_the_same_work() -> None:
    # (8, 128) blocks pay the pipeline's per-step cost 128 times as often as (256, 512) blocks
    # for the same 1 MiB per device: libtpu 0.0.52 puts them ~50x apart on every jax line.
    refs = [
        "coremesh.testing.aot.samples:ADD_ONE",
        "coremesh.testing.aot.samples:ADD_ONE_BIG_BLOCKS",
    ]
    small, big = profile(refs, ["v5p"], include_xla=False)
    assert (small.program, big.program) == (kp.ADD_ONE.name, kp.ADD_ONE_BIG_BLOCKS.name)
    assert small.cycles is not None and big.cycles is not None
    assert 0 < big.cycles * 10 < small.cycles


@pytest.mark.parametrize("chip", ESTIMATED)
def test_add_one_roofline_and_ratio(estimates: Estimates, chip: str) -> None:
    # By hand: each device reads and writes its 256 x 1024 float32 shard once.
    (x,) = GUIDE["add_one"].arg_specs(4)
    shard = x.shape[0] // 4 * x.shape[1] * 4
    c = CHIPS[chip]
    bandwidth = c.hbm_bytes_per_s * c.default_cores_per_device / c.tensorcores_per_chip
    bound = 2 * shard / bandwidth
    for variant in ("kernel", "xla"):
        r = estimates["add_one", variant, chip]
        assert r.roofline is not None
        assert r.roofline.bound_s == pytest.approx(bound)
        assert r.cycles is not None
        assert r.ratio == pytest.approx(r.cycles / c.clock_hz / bound)


def test_v4_has_no_estimate_but_bundles(estimates: Estimates) -> None:
    for variant in ("kernel", "xla"):
        r = estimates["add_one", variant, "v4"]
        assert r.status == "no_estimate" and r.cycles is None
        assert "static profile aborted" in str(r.note)
        assert r.bundles and r.bundles > 0


@pytest.mark.parametrize("chip", ["v5p", "v6e", "TPU7x"])
def test_sparsecore_kernel_has_bundles_not_cycles(estimates: Estimates, chip: str) -> None:
    r = estimates["sc_add_one", "kernel", chip]
    assert r.status == "no_estimate" and r.cycles is None
    assert r.sparsecore_bundles.get("scs", 0) > 0 and r.sparsecore_bundles.get("tec", 0) > 0
    assert "SparseCore" in str(r.note)
    # Its XLA version runs on the TensorCore and does get an estimate.
    assert estimates["sc_add_one", "xla", chip].status == "ok"


@pytest.mark.parametrize("chip", ["v4", "v5e"])
def test_sparsecore_kernel_on_chips_without_sparsecores(estimates: Estimates, chip: str) -> None:
    r = estimates["sc_add_one", "kernel", chip]
    assert r.status == "unsupported"
    assert r.error is not None and "SparseCores" in r.error["what"]


def test_table_and_json(estimates: Estimates) -> None:
    results = list(estimates.values())
    table = cycles_table(results, "markdown")
    v5p = estimates["add_one", "kernel", "v5p"]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]
    row = next(r for r in rows if r[:2] == ["add_one", "v5p"])
    assert row[2] == f"{v5p.cycles:,}"
    assert next(r for r in rows if r[:2] == ["sc_add_one", "v5e"])[2] == "n/a"
    assert "Dma latency model is currently only supported" in table
    doc = json.loads(to_json(cycle_results=results))
    entry = next(
        d
        for d in doc["cycles"]
        if (d["program"], d["variant"], d["chip"]) == ("add_one", "kernel", "v5p")
    )
    assert entry["cycles"] == v5p.cycles and entry["ratio"] == pytest.approx(v5p.ratio)
    # Every estimate says which jax and libtpu made it; so does the table.
    assert (entry["jax"], entry["libtpu"]) == (jax.__version__, metadata.version("libtpu"))
    assert f"Estimated by libtpu {entry['libtpu']} with jax {entry['jax']}." in table


def test_estimates_record_the_jax_and_libtpu_that_made_them(estimates: Estimates) -> None:
    for r in estimates.values():
        assert r.jax_version == jax.__version__
        assert r.libtpu_version == metadata.version("libtpu")


def _record(program: str, chip: str, jax_v: str, cycles: int | None, **kw: Any) -> dict[str, Any]:
    status = kw.pop("status", "ok" if cycles is not None else "no_estimate")
    return {
        "program": program,
        "chip": chip,
        "variant": "kernel",
        "cycles": cycles,
        "status": status,
        "jax": jax_v,
        "libtpu": "0.0.52",
        **kw,
    }


def test_lines_table_puts_runs_side_by_side_oldest_first() -> None:
    records = [
        _record("add_one", "v5p", "0.12.0.1", 1100),
        _record("add_one", "v5p", "0.10.2", 1000),
        _record("add_one", "v4", "0.10.2", None),
        _record("add_one", "v4", "0.12.0.1", None),
        _record("add_one", "v5p", "0.11.2", 1000),
        _record("sc_add_one", "v5e", "0.10.2", None, status="unsupported"),
        {**_record("add_one", "v5p", "0.10.2", 7), "variant": "xla"},
    ]
    table = lines_table(records, "plain")
    header, _, *rows = table.splitlines()
    assert header.split()[:2] == ["program", "chip"]
    assert header.index("jax 0.10.2") < header.index("jax 0.11.2") < header.index("jax 0.12.0.1")
    cells = [row.split() for row in rows]
    assert cells[0] == ["add_one", "v4", "no", "estimate", "no", "estimate"]
    assert cells[1] == ["add_one", "v5p", "1,000", "1,000", "1,100", "+10.00%"]
    assert cells[2][:3] == ["sc_add_one", "v5e", "n/a"]
    assert "7" in lines_table(records, "plain", variant="xla").splitlines()[2].split()


SLOW_MODULE = textwrap.dedent(
    """
    import dataclasses
    import time
    from coremesh.testing.aot import Work, samples

    class Slow:
        name = "slow"
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
    # The timeout must only be longer than a real compile on a loaded machine (add_one: ~1 s).
    results = profile([f"{module}:PROGRAMS"], ["v6e"], include_xla=False, timeout_s=30)
    by_name = {r.program: r for r in results}
    assert by_name["slow"].status == "timeout"
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


def test_parsers_read_libtpus_dump_formats(tmp_path: Any) -> None:
    sp = tmp_path / "sp"
    sp.mkdir()
    (sp / "k.1_TPU v5_static_llo_profile.textproto").write_text(
        'hlo_op_estimate {\n  hlo_op_name: "k.1"\n  estimated_cycles: 123\n'
        "  num_equivalent_hlos: 1\n}\n"
    )
    assert parse_static_profile(str(sp)) == {"k.1": 123}
    jf = tmp_path / "jf"
    jf.mkdir()
    (jf / "17-k.1-00-schedule-analysis_final_bundles.txt").write_text(
        "Schedule analysis:\n\ttotal scheduled bundles:    93\n"
    )
    (jf / "17-TLP-00-schedule-analysis_final_bundles.txt").write_text(
        "total scheduled bundles: 5\n"
    )
    assert parse_tensorcore_bundles(str(jf)) == {"k.1": 93}
    scb = tmp_path / "scb"
    scb.mkdir()
    (scb / "jit_f_1_bundles.txt").write_text(
        "scs\nmain:\n0x0: {  s1 = sld  }\n0x1: {  _ = snop  }\ntec\nexec:\n0x0: {  v0 = vld  }\n"
    )
    assert parse_sparsecore_bundles(str(scb)) == {"scs": 2, "tec": 1}


def _estimate(status: Any, partial: bool = False) -> CycleEstimate:
    ops = (OpCycles("k.1", "mosaic", 700, 40), OpCycles("fusion.2", "xla", 17, 5))
    return CycleEstimate(
        program="p",
        variant="kernel",
        chip="v5p",
        topology="v5p:2x2x1",
        mode="device",
        num_devices=4,
        cores_per_device=2,
        status=status,
        ops=ops,
        roofline=roofline_for(Work(2**20), "v5p"),
        partial=partial,
    )


def test_ops_of_a_program_that_died_midway_are_kept_but_not_summed() -> None:
    ok = _estimate("ok")
    assert (ok.cycles, ok.kernel_cycles, ok.bundles) == (717, 700, 45)
    assert ok.seconds is not None and ok.ratio is not None
    for status in ("aborted", "timeout", "no_estimate"):
        r = _estimate(status, partial=True)
        assert (r.cycles, r.kernel_cycles, r.seconds, r.ratio) == (None, None, None, None)
        doc = r.to_json()
        assert doc["cycles"] is None and doc["kernel_cycles"] is None and doc["partial"] is True
        assert [o["cycles"] for o in doc["ops"]] == [700, 17]
    # Code generation may have stopped midway too; after a static-profile abort it had finished.
    assert _estimate("aborted", partial=True).bundles is None
    assert _estimate("timeout", partial=True).bundles is None
    assert _estimate("no_estimate", partial=True).bundles == 45


def test_memory_cap_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_size("8G") == 8 * 2**30 and parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5k") == 1536 and parse_size(" 1000000 ") == 10**6
    with pytest.raises(ValueError, match=MEMORY_CAP_ENV):
        parse_size("lots")
    monkeypatch.setenv(MEMORY_CAP_ENV, "3G")
    assert memory_cap() == 3 * 2**30
    assert memory_cap(12345) == 12345
    assert memory_cap(0) is None
    monkeypatch.setenv(MEMORY_CAP_ENV, "0")
    assert memory_cap() is None
    monkeypatch.delenv(MEMORY_CAP_ENV)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_cap() == physical // 2


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads Linux's /proc")
def test_group_rss_counts_the_childs_resident_memory() -> None:
    hog = "b = b'x' * (200 << 20); print('ready', flush=True); import sys; sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", hog],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        rss = group_rss_bytes(proc.pid)
        assert rss is not None and 200 << 20 < rss < 400 << 20
    finally:
        proc.kill()
        proc.wait()
    assert group_rss_bytes(proc.pid) is None


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
        timeout_s=60,
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
