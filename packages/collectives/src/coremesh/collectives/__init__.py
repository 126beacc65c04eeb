"""coremesh.collectives: collectives over the TensorCores of a device, over chips, or both.

Two faces:

* jittable functions on arrays, equal to ``jax.lax`` (:func:`psum`, :func:`all_gather`,
  :func:`psum_scatter`, :func:`all_to_all`, :func:`ppermute`...), each one Pallas kernel;
* in-kernel collectives on refs for the body of a ``core_map`` / ``pl.kernel``
  (:mod:`coremesh.collectives.in_kernel`, also reachable under its former name ``blocks``),
  with the scratch and semaphores they need.

Axes: ``"core"`` (the TensorCores of one device), a device mesh axis (``"device"``), or
``("device", "core")`` (every core of every device, cores of a device adjacent). Algorithms:
unidirectional and bidirectional rings, a two-stage hierarchical schedule, direct exchanges.
"""

from coremesh.collectives import in_kernel
from coremesh.collectives.axes import Axis, resolve
from coremesh.collectives.cost import Traffic, traffic
from coremesh.collectives.ops import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    pmax,
    pmin,
    ppermute,
    psum,
    psum_scatter,
    reduce_scatter,
)
from coremesh.collectives.scratch import Scratch, ScratchSpec
from coremesh.core import jax_versions

#: The in-kernel collectives' former name, kept so ``from coremesh.collectives import blocks``
#: still works.
blocks = in_kernel

jax_versions.check()  # refuse a jax older than coremesh supports; warn on an untested one

__version__ = "0.1.0"
__all__ = [
    "Axis",
    "Scratch",
    "ScratchSpec",
    "Traffic",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "blocks",
    "in_kernel",
    "pmax",
    "pmin",
    "ppermute",
    "psum",
    "psum_scatter",
    "reduce_scatter",
    "resolve",
    "traffic",
]
