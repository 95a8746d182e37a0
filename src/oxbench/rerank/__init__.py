"""oxbench.rerank."""
