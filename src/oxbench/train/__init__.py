"""Training on the other city: matching pairs from ground truth, and the contrastive fine-tuning of
a backbone + GeM with hard-negative mining (Radenovic, Tolias & Chum, TPAMI 2018).

- :mod:`oxbench.train.pairs` -- matching pairs and landmark groups from a benchmark's labels (numpy
  only; also used by the learned whitening);
- :mod:`oxbench.train.model` -- a minimal backbone + GeM retrieval network (torch);
- :mod:`oxbench.train.sfm` -- the SfM-120k training-tuple pickle (restricted unpickler);
- :mod:`oxbench.train.loop` -- ``oxbench train``: contrastive loss, hard-negative mining per epoch,
  resumable per epoch, a checkpoint ``oxbench run`` loads.

Nothing here imports torch at module import except :mod:`~oxbench.train.model` and
:mod:`~oxbench.train.loop`, which are only imported when training or describing.
"""
