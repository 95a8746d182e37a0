"""The method families: one module each, holding its config, its method and its presets.

- :mod:`~oxbench.pipelines.families.bow` -- RootSIFT bag of words (tf-idf, spatial re-ranking, QE);
- :mod:`~oxbench.pipelines.families.asmk` -- aggregated selective match kernels over RootSIFT;
- :mod:`~oxbench.pipelines.families.he` -- Hamming embedding and weak geometric consistency over RootSIFT;
- :mod:`~oxbench.pipelines.families.global_descriptors` -- one vector per image (VLAD, CNN
  descriptors, your own files), whitening, exact or FAISS search, QE, DBA, diffusion.

Every module here is imported when the preset registry is first used
(:data:`oxbench.pipelines.presets.METHODS`); a new family is one new module. No family imports
another: what two families share is a step (:mod:`oxbench.pipelines.steps`).
"""
