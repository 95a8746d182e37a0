"""oxbench.index."""
