"""oxbench.report."""
