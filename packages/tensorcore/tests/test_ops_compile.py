"""Every TensorCore op compiles with libtpu for every TPU generation (v4 in megacore mode)."""

from __future__ import annotations

import textwrap
from importlib.metadata import entry_points
from typing import Any

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import coremesh.core as cc
from coremesh.tensorcore.ops.matmul import matmul
from coremesh.tensorcore.programs import programs
from coremesh.testing.aot import Arg, compile_matrix, profile, target_program

ROWS = P("device", None)


@pytest.mark.aot
@pytest.mark.parametrize("chip", list(cc.CHIPS))
def test_ops_compile(chip: str) -> None:
    progs = programs()
    results = compile_matrix(progs, [chip])
    failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert len(results) == len(progs) == 8


def test_programs_are_registered_for_the_compile_matrix() -> None:
    (ep,) = [e for e in entry_points(group="coremesh.programs") if e.name == "tensorcore"]
    assert ep.load() is programs


def _bench_matmul_args(n: int) -> list[Any]:
    return [Arg((2048 * n, 2048), jnp.bfloat16, ROWS), Arg((2048, 2048), jnp.bfloat16)]


#: The benchmark's matmul with the op's own limit and with a raised one (for profile() below).
LIMITS = {
    "default": target_program(matmul, _bench_matmul_args, name="default"),
    "raised_40mib": target_program(
        lambda a, b: matmul(a, b, vmem_limit_bytes=40 << 20), _bench_matmul_args, name="raised"
    ),
}


UNPINNED = textwrap.dedent(
    """
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    from coremesh.tensorcore import backend
    from coremesh.tensorcore.ops.matmul import matmul
    from coremesh.testing.aot import Arg, target_program

    backend.PIN_BYTES = 1 << 62  # operands left anywhere, as a bare pl.kernel leaves them

    def args(n):
        return [Arg((2048 * n, 2048), jnp.bfloat16, P("device", None)),
                Arg((2048, 2048), jnp.bfloat16)]

    RAISED = target_program(lambda a, b: matmul(a, b, vmem_limit_bytes=40 << 20), args,
                            name="unpinned_raised")
    """
)


@pytest.mark.aot
def test_a_raised_vmem_limit_profiles_with_operands_pinned_to_hbm(tmp_path: Any) -> None:
    # Operands left anywhere, XLA copies them into VMEM before the kernel on TPU7x, and with a
    # 40 MiB scoped limit libtpu 0.0.52's profile then runs out of VMEM: the diagnosis names
    # both shares and the fix. Pinned to HBM (what TensorCoreKernel does), both limits profile.
    module = tmp_path / "unpinned_matmul.py"
    module.write_text(UNPINNED)
    (unpinned,) = profile([f"{module}:RAISED"], ["TPU7x"], devices=4, include_xla=False)
    assert unpinned.status == "failed" and unpinned.error is not None
    assert unpinned.error["kind"] == "vmem_program"
    assert "XLA's own buffers" in unpinned.error["what"]
    assert "vmem_limit_bytes" in unpinned.error["fix"]
    refs = [f"{__file__}:LIMITS[{name}]" for name in LIMITS]
    default, raised = profile(refs, ["TPU7x"], devices=4, jobs=1, include_xla=False)
    assert default.status == raised.status == "ok"
    assert default.kernel_cycles and raised.kernel_cycles
    assert default.prefetch_bytes == raised.prefetch_bytes == 0
