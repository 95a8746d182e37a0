"""oxbench.pipelines."""
