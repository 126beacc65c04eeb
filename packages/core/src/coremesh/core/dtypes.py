"""Which dtypes a chip can hold and multiply, checked before anything is traced.

jax 0.10.2 loops forever tiling a float64 pipeline (tpu_info._get_tiling_factor with packing 0),
so an unsupported dtype must be refused here, not discovered by a hang.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from coremesh.core import jax_versions
from coremesh.core.chips import Chip, get_chip
from coremesh.core.errors import UnsupportedOnChipError

_F32, _BF16 = "float32", "bfloat16"
_F8 = ("float8_e5m2", "float8_e4m3b11fnuz")
_F8_7 = ("float8_e5m2", "float8_e4m3fn")
_I8, _I4 = ("int8", "uint8"), ("int4", "uint4")

#: generation -> allowed (lhs, rhs) dtype families for native MXU matmuls (jax's own table).
_MATMUL: dict[int, tuple[tuple[frozenset[str], frozenset[str]], ...]] = {
    4: ((frozenset({_F32, _BF16}), frozenset({_F32, _BF16, "int8"})),),
    5: (
        (frozenset({_F32, _BF16, *_F8}), frozenset({_F32, _BF16, *_F8})),
        (frozenset(_I8), frozenset(_I8)),
        (frozenset(_I4), frozenset(_I4)),
    ),
    7: (
        (frozenset({_F32, _BF16}), frozenset({_F32, _BF16})),
        (frozenset({_F32, _BF16, *_F8_7}), frozenset(_F8_7)),
    ),
}
_MATMUL[6] = _MATMUL[5]


def dtype_name(dtype: Any) -> str:
    """Canonical name of a numpy/jax dtype (``bfloat16`` works without importing jax)."""
    try:
        return str(np.dtype(dtype))
    except TypeError:
        return str(getattr(dtype, "name", dtype))


def mxu_operand(x: Any) -> Any:
    """``x`` as a TPU's MXU multiplies it at the default precision (``jnp.dot``, ``@`` and
    ``einsum`` without ``precision=``, in kernels and out): a ``float32`` operand rounded to the
    nearest ``bfloat16`` (kept ``float32``); other dtypes as they are. A numpy array stays one,
    a jax array or tracer stays one. The products of such operands are exact in ``float32``, so a
    reference computes ``mxu_operand(a) @ mxu_operand(b)`` at full precision to get what the
    chip gets, up to the order of its sums. (Evaluate it eagerly for numbers: under ``jit``,
    XLA:CPU may drop the pair of conversions where excess precision is allowed.)"""
    import ml_dtypes

    if not hasattr(x, "astype"):
        x = np.asarray(x)
    if np.dtype(x.dtype) != np.float32:
        return x
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def itemsize(dtype: Any) -> int:
    """Bytes per element; an extended dtype's (a PRNG key, a semaphore) are those of the
    array jax stores it as (a threefry key: two uint32)."""
    name = dtype_name(dtype)
    if name in ("int4", "uint4"):
        return 1
    if is_extended(dtype):
        from jax._src import core as jax_core

        physical = jax_core.physical_element_aval(dtype)
        return int(math.prod(physical.shape)) * itemsize(physical.dtype)
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        import jax.numpy as jnp

        return int(jnp.dtype(dtype).itemsize)


def is_extended(dtype: Any) -> bool:
    """Is ``dtype`` one of jax's extended dtypes (semaphores, PRNG keys): no array data type,
    so no data-type rule applies (Mosaic lowers semaphore and key operands itself)."""
    import jax

    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.extended))
    except TypeError:
        return False


def check_array_dtype(dtype: Any, chip: str | Chip) -> str:
    """Refuse dtypes no TPU holds in VMEM (64-bit and complex types)."""
    c = get_chip(chip)
    name = dtype_name(dtype)
    if is_extended(dtype):
        return name
    if name in ("float64", "int64", "uint64", "complex64", "complex128") or itemsize(dtype) > 4:
        narrow = {"float64": "float32", "int64": "int32", "uint64": "uint32"}.get(name, "float32")
        raise UnsupportedOnChipError(
            f"dtype {name} cannot be used in a TPU kernel",
            rule="TPU vector units and VMEM hold 8-, 16- and 32-bit types only",
            chip=c.name,
            fix=f"cast to {narrow} before the kernel (and check JAX_ENABLE_X64 is not turning "
            "Python scalars into 64-bit arrays)",
        )
    return name


#: The first jax whose Mosaic lowering moves bool arrays by DMA (so takes bool operands).
BOOL_OPERANDS_SINCE = "0.11.0"


def check_operand_dtype(dtype: Any, chip: str | Chip) -> str:
    """Refuse what a Pallas TPU kernel takes as no operand or result, on any generation.

    Beyond ``check_array_dtype``: Mosaic refuses float16 arguments ("Only arguments with
    float8e5m2, ..., bfloat16 or 32-bit element types are supported"; a float16 VMEM load fails
    too) on every jax line, and jax 0.10's Mosaic lowering refuses DMAs of bool ("DMAs with bool
    dtypes are not supported"), which jax 0.11 lowers. Measured with libtpu 0.0.52 on v4, v5e,
    v5p, v6e and TPU7x, on jax 0.10.2, 0.11.2 and 0.12.0.1.
    """
    c = get_chip(chip)
    name = check_array_dtype(dtype, c)
    if is_extended(dtype):
        return name
    if name == "float16":
        raise UnsupportedOnChipError(
            "float16 cannot be a TPU kernel's operand or result",
            rule="Mosaic takes floating-point operands as bfloat16, float32 or 8-/4-bit floats "
            "only, on every TPU generation",
            chip=c.name,
            fix="cast to bfloat16 (or float32) before the kernel and back after it",
        )
    if name == "bool" and not jax_versions.at_least(BOOL_OPERANDS_SINCE):
        raise UnsupportedOnChipError(
            f"bool cannot be a TPU kernel's operand or result with jax {jax_versions.installed()}",
            rule="a kernel's operands move by DMA, and jax 0.10's Mosaic lowering refuses DMAs "
            f"of bool arrays (jax {BOOL_OPERANDS_SINCE} and later lower them)",
            chip=c.name,
            fix="cast to int8 or int32 (x.astype(jnp.int32)) before the kernel and back after "
            f"it, or use jax {BOOL_OPERANDS_SINCE} or later",
        )
    return name


def check_matmul_dtypes(lhs: Any, rhs: Any, chip: str | Chip) -> None:
    """Refuse lhs/rhs dtype pairs the chip's MXU cannot multiply natively."""
    c = get_chip(chip)
    lname, rname = check_array_dtype(lhs, c), check_array_dtype(rhs, c)
    pairs = _MATMUL.get(c.generation, ())
    if any(lname in lset and rname in rset for lset, rset in pairs):
        return
    ok = "; ".join(f"lhs {sorted(lset)} x rhs {sorted(rset)}" for lset, rset in pairs)
    raise UnsupportedOnChipError(
        f"{c.name} cannot multiply {lname} by {rname} on its MXU",
        rule=f"{c.name} MXU input pairs: {ok}",
        chip=c.name,
        fix="cast both operands to bfloat16 (f32 accumulation) or pick a chip that has them",
    )
