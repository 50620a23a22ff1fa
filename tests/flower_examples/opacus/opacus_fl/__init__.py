"""opacus: Training with Sample-Level Differential Privacy using Opacus Privacy Engine."""
