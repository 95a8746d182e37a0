"""oxbench.evaluation."""
