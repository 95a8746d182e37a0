"""Training on the other city: matching pairs from ground truth, and the contrastive fine-tuning of
a backbone + GeM with hard-negative mining (Radenovic, Tolias & Chum, TPAMI 2018).

- :mod:`oxbench.train.pairs` -- matching pairs and landmark groups from a benchmark's labels (numpy
  only; also used by the learned whitening);
- :mod:`oxbench.train.sfm` -- the SfM-120k training-tuple pickle (restricted unpickler);
- :mod:`oxbench.train.loop` -- ``oxbench train``: contrastive loss, negatives mined per epoch,
  resumable per epoch; the network is :mod:`oxbench.features.deep`'s and the result is the model file
  ``oxbench run`` loads.

Nothing here imports torch at module import; :mod:`~oxbench.train.loop` imports it when training.
"""
