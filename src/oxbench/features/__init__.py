"""oxbench.features."""
