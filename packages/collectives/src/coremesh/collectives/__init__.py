"""coremesh.collectives: collectives over TensorCores and TPU chips (work in progress).

Nothing is exported yet: the operations land with their tests (see the package README).
"""

__version__ = "0.1.0"
__all__: list[str] = []
