"""cvae: a class-conditioned VAE for MNIST in JAX, Flax Linen, Optax and Orbax."""
