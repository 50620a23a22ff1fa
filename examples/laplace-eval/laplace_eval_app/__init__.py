"""laplace-eval: Laplace-protected client inference results scored by clustering (seed 000)."""
