"""Family-neutral steps: what every method family builds its pipeline from.

Each step is a resumable function keyed by what determines its output, returning what it made and
whether it came from the cache (:class:`StepResult`, measured by the step). No step knows a family.

- :mod:`~oxbench.pipelines.steps.keys` -- dataset digests and cache keys, parts, :class:`StepResult`;
- :mod:`~oxbench.pipelines.steps.local` -- local features of a benchmark into feature stores;
- :mod:`~oxbench.pipelines.steps.vocabulary` -- a vocabulary trained on another benchmark;
- :mod:`~oxbench.pipelines.steps.words` -- visual words of every feature of a part;
- :mod:`~oxbench.pipelines.steps.verify` -- spatial verification of short lists;
- :mod:`~oxbench.pipelines.steps.settings` -- the settings a quantising family shares (the method
  part it shares is :mod:`oxbench.pipelines.quantising`).
"""

from oxbench.pipelines.steps.keys import (
    PARTS,
    StepResult,
    dataset_key,
    gt_digest,
    last_if_empty,
    part_names,
    parts_of,
)
from oxbench.pipelines.steps.local import extraction_job, features_dir, open_store, step_features
from oxbench.pipelines.steps.settings import CLASSIC_FEATURES, LocalQuantisation
from oxbench.pipelines.steps.verify import (
    MATCHES_FOR_VIEWERS,
    ShortListVerifier,
    VerifiedList,
    joined,
    short_list_verifier,
    verified_first,
    verify_short_lists,
)
from oxbench.pipelines.steps.vocabulary import (
    VocabularySpec,
    load_vocabulary,
    step_vocabulary,
    training_descriptors,
    vocabulary_path,
)
from oxbench.pipelines.steps.words import (
    AssignShard,
    WordedParts,
    Words,
    describe_and_assign,
    reopen_store,
    step_assign,
    store_spec,
    words_path,
)

__all__ = [
    "CLASSIC_FEATURES",
    "MATCHES_FOR_VIEWERS",
    "PARTS",
    "AssignShard",
    "LocalQuantisation",
    "ShortListVerifier",
    "StepResult",
    "VerifiedList",
    "VocabularySpec",
    "WordedParts",
    "Words",
    "dataset_key",
    "describe_and_assign",
    "extraction_job",
    "features_dir",
    "gt_digest",
    "last_if_empty",
    "load_vocabulary",
    "joined",
    "open_store",
    "part_names",
    "parts_of",
    "reopen_store",
    "short_list_verifier",
    "step_assign",
    "step_features",
    "step_vocabulary",
    "store_spec",
    "training_descriptors",
    "verified_first",
    "verify_short_lists",
    "vocabulary_path",
    "words_path",
]
