"""coremesh.testing: verify core-level Pallas TPU programs without a TPU."""

__version__ = "0.1.0"
