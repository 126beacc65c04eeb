"""What an interpreted kernel may take and return: what Mosaic lowers, refused where it does not.

Pallas' interpreter runs kernels on operands Mosaic refuses (float16 on a TensorCore, a bool DMA
on jax 0.10), and crashes on some it cannot model. Checked before the kernel is interpreted:

* data types by :func:`coremesh.core.dtypes.check_operand_dtype` (a SparseCore kernel's by
  ``check_array_dtype``: Mosaic compiles float16 SparseCore operands on v5p and TPU7x), except
  bool: Mosaic takes bool
  operands and results in VMEM blocks on every line (compiled with libtpu for v5p and TPU7x on
  jax 0.10.2 and 0.12.0.1); jax 0.10's lowering refuses a DMA of a bool ref ("DMAs with bool
  dtypes are not supported"), so on that line the kernel body is searched for one;
* extended dtypes (semaphores, PRNG keys) have no data-type rule, and Mosaic lowers both as
  operands, but the interpreter runs neither: it fills a fresh buffer of each operand and result
  with NaN (``NotImplementedError: nan + key<fry>``). Both reach this check only with their
  patch off: ``key_refs`` runs keys as their key data (``coremesh.testing.sim.key_refs``),
  ``kernel_semaphores`` runs semaphores (``coremesh.testing.sim.kernel_semaphores``); without
  it they are refused here with what to do instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from coremesh.core import jax_versions
from coremesh.core.dtypes import (
    BOOL_OPERANDS_SINCE,
    check_array_dtype,
    check_operand_dtype,
    is_extended,
)
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim.jaxprs import all_eqns, is_semaphore


def not_simulated_semaphores(chip: str) -> UnsupportedOnChipError:
    return UnsupportedOnChipError(
        "a kernel whose operands or results are semaphores (a DMA that spans kernel calls) "
        "cannot run on the simulator",
        rule="Pallas' interpreter copies each kernel's buffers in and out, so a DMA started in "
        "one kernel and waited for in the next has no buffer to land in (not simulated)",
        chip=chip,
        fix="start and wait for the copy in one kernel (pl.run_scoped with "
        "pltpu.SemaphoreType.DMA), or check the two-kernel form with the compile-only target "
        "(coremesh.testing.aot)",
    )


def not_simulated_keys(chip: str) -> UnsupportedOnChipError:
    return UnsupportedOnChipError(
        "a kernel whose operands or results are PRNG keys cannot run on the simulator",
        rule="Pallas' interpreter holds no buffers of key dtypes (not simulated; Mosaic "
        "lowers them)",
        chip=chip,
        fix="pass jax.random.key_data(key) (uint32) and rebuild the key in the kernel with "
        "jax.random.wrap_key_data, or check the kernel with the compile-only target "
        "(coremesh.testing.aot)",
    )


def stripped_memory_space(space_name: str) -> tuple[Any, str, Any]:
    """A patch target: the interpreter strips each operand's memory space before the kernel
    and refuses any but HBM / ANY (interpret_pallas_call.py _remove_memory_space_abstract_eval);
    this lets it strip ``space_name`` (a ``pltpu.MemorySpace`` member's name) too. Patches that
    run operands of that space (SMEM scalars, arrays kept in VMEM, semaphore handles) use it."""
    from jax._src import core as jax_core
    from jax._src.pallas.mosaic import core as mosaic_core
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    space = getattr(mosaic_core.MemorySpace, space_name)
    remove = ipc.remove_memory_space_p
    orig = remove.abstract_eval

    def abstract_eval(x: Any, **kw: Any) -> Any:
        if isinstance(x, jax_core.ShapedArray) and x.memory_space is space:
            return jax_core.ShapedArray(x.shape, x.dtype), jax_core.no_effects
        return orig(x, **kw)

    return (remove, "abstract_eval", abstract_eval)


def check_call(values: Sequence[Any], jaxpr: Any, chip: str, *, sparsecore: bool = False) -> None:
    """Refuse an interpreted kernel (on SparseCores if ``sparsecore``) whose operands/results
    (``values``: arrays or avals) or body (``jaxpr``) Mosaic would not lower, or the interpreter
    cannot run."""
    check_dtype = check_array_dtype if sparsecore else check_operand_dtype
    for value in values:
        dtype = getattr(value, "dtype", None)
        if dtype is None:
            continue
        if is_extended(dtype):
            raise (not_simulated_semaphores if is_semaphore(dtype) else not_simulated_keys)(chip)
        if str(dtype) != "bool":
            check_dtype(dtype, chip)
    if jaxpr is not None and not jax_versions.at_least(BOOL_OPERANDS_SINCE):
        for _ in _bool_dmas(jaxpr):
            raise UnsupportedOnChipError(
                "a DMA of a bool ref: DMAs with bool dtypes are not supported. (Mosaic, jax "
                f"{jax_versions.installed()})",
                rule="jax 0.10's Mosaic lowering refuses DMAs of bool arrays; bool blocks that "
                f"the pipeline moves are lowered (jax {BOOL_OPERANDS_SINCE} and later lower both)",
                chip=chip,
                fix="copy the bool data as int8 or int32 (x.astype(jnp.int32)) and compare "
                f"after the copy, or use jax {BOOL_OPERANDS_SINCE} or later",
            )


def _bool_dmas(jaxpr: Any) -> Iterator[Any]:
    """The DMAs in ``jaxpr`` (and the jaxprs inside it) that copy a bool ref."""
    import jax
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    for eqn in all_eqns(jaxpr):
        if eqn.primitive is mosaic_primitives.dma_start_p:
            src = jax.tree.unflatten(eqn.params["tree"], eqn.invars)[0]
            # A view's ref, or a selected view's refs (a multi-ref view has no single aval).
            base = getattr(src, "ref", src)
            refs = base if isinstance(base, (list, tuple)) else [base]
            if any(str(getattr(r.aval, "dtype", "")) == "bool" for r in refs):
                yield eqn
