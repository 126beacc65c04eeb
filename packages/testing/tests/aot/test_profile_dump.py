"""libtpu's dump directory, read from files written by hand in libtpu 0.0.52's formats."""

from __future__ import annotations

from pathlib import Path

from coremesh.testing.aot.profile_dump import (
    OpCycles,
    clear_dump,
    dump_flags,
    parse_mosaic_ops,
    parse_sparsecore_bundles,
    parse_static_profile,
    parse_tensorcore_bundles,
    read_dump,
)


def _write_dump(root: Path) -> None:
    (root / "sp").mkdir(parents=True)
    (root / "sp" / "k.1_TPU v5_static_llo_profile.textproto").write_text(
        'hlo_op_estimate {\n  hlo_op_name: "k.1"\n  estimated_cycles: 123\n'
        "  num_equivalent_hlos: 1\n}\n"
    )
    (root / "sp" / "fusion.2_TPU v5_static_llo_profile.textproto").write_text(
        'hlo_op_estimate {\n  hlo_op_name: "fusion.2"\n  estimated_cycles: 17\n}\n'
    )
    (root / "jf").mkdir()
    (root / "jf" / "17-k.1-00-schedule-analysis_final_bundles.txt").write_text(
        "Schedule analysis:\n\ttotal scheduled bundles:    93\n"
    )
    (root / "jf" / "18-copy.3-00-schedule-analysis_final_bundles.txt").write_text(
        "total scheduled bundles: 4\n"
    )
    (root / "jf" / "17-TLP-00-schedule-analysis_final_bundles.txt").write_text(
        "total scheduled bundles: 5\n"
    )
    (root / "jf" / "19-<late-initialization>-00-schedule-analysis_final_bundles.txt").write_text(
        "total scheduled bundles: 2\n"
    )
    (root / "jf" / "module_0001.jit_f-TLP-hlo.txt").write_text(
        "  %k.1 = f32[8,128]{1,0} custom-call(f32[8,128]{1,0} %p), "
        'custom_call_target="tpu_custom_call", backend_config="..."\n'
        "  %fusion.2 = f32[8,128]{1,0} fusion(f32[8,128]{1,0} %k.1), kind=kLoop\n"
    )
    (root / "scb").mkdir()
    (root / "scb" / "jit_f_1_bundles.txt").write_text(
        "scs\nmain:\n0x0: {  s1 = sld  }\n0x1: {  _ = snop  }\ntec\nexec:\n0x0: {  v0 = vld  }\n"
    )


def test_parsers_read_libtpus_dump_formats(tmp_path: Path) -> None:
    _write_dump(tmp_path)
    assert parse_static_profile(str(tmp_path / "sp")) == {"k.1": 123, "fusion.2": 17}
    # The program's glue (TLP, <late-initialization>) is not an operation of its own.
    assert parse_tensorcore_bundles(str(tmp_path / "jf")) == {"k.1": 93, "copy.3": 4}
    assert parse_mosaic_ops(str(tmp_path / "jf")) == {"k.1"}
    assert parse_sparsecore_bundles(str(tmp_path / "scb")) == {"scs": 2, "tec": 1}


def test_read_dump_joins_estimates_bundles_and_kinds(tmp_path: Path) -> None:
    _write_dump(tmp_path)
    ops, sc = read_dump(str(tmp_path))
    assert ops == [
        OpCycles("copy.3", "xla", None, 4),
        OpCycles("fusion.2", "xla", 17, None),
        OpCycles("k.1", "mosaic", 123, 93),
    ]
    assert sc == {"scs": 2, "tec": 1}


def test_clear_dump_leaves_each_part_empty(tmp_path: Path) -> None:
    _write_dump(tmp_path)
    clear_dump(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jf", "scb", "sp"]
    assert all(not any(p.iterdir()) for p in tmp_path.iterdir())
    assert read_dump(str(tmp_path)) == ([], {})


def test_the_flags_name_the_parts_read_dump_reads() -> None:
    flags = dump_flags("/d").split()
    assert "--xla_jf_dump_static_llo_profile_to=/d/sp" in flags
    assert "--xla_jf_dump_to=/d/jf" in flags and "--xla_sc_dump_bundles_to=/d/scb" in flags
    bundles_only = dump_flags("/d", static_profile=False).split()
    assert set(flags) - set(bundles_only) == {"--xla_jf_dump_static_llo_profile_to=/d/sp"}
