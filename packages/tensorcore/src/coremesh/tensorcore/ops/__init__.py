"""Array-level TensorCore ops, each equal to its jax.numpy reference."""
