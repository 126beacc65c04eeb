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
    OpCycles,
    cycles_table,
    lines_table,
    profile,
    to_json,
)
from coremesh.testing.aot import samples as kp
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
