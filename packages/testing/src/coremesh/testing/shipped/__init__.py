"""JAX's shipped Pallas TPU kernels (``jax.experimental.pallas.ops.tpu``) as a corpus.

Each :class:`ShippedKernel` is one kernel at small shapes with an independent ``jax.numpy``
reference: ``tests/test_shipped_kernels.py`` runs it on the simulator, and :func:`programs`
(entry point ``coremesh.programs``: ``jax-ops``) hands it to ``coremesh check``, ``profile`` and
``aot-all`` beside its reference as the XLA program. The kernels are imported only when called,
so the corpus loads on every supported jax line; the public calls used here are the same on
0.10.2, 0.11.2 and 0.12.0.1 (only the kernels' internals differ).
"""

from __future__ import annotations

from coremesh.testing.shipped import all_gather, attention, matmul, megablox, paged
from coremesh.testing.shipped.entry import ALL_CHIPS, ShippedKernel
from coremesh.testing.shipped.programs import program, programs

#: Every shipped kernel of the corpus, by name.
KERNELS: dict[str, ShippedKernel] = {
    k.name: k for family in (matmul, attention, paged, megablox, all_gather) for k in family.KERNELS
}

__all__ = ["ALL_CHIPS", "KERNELS", "ShippedKernel", "program", "programs"]
