"""The original Oxford 5K / Paris 6K protocol (Philbin et al., CVPR 2007): good + ok positive,
junk deleted from the list, as ``compute_ap.cpp`` scores it (which accumulates in single precision:
its numbers differ from ours by < 5e-7). Per-query results are keyed by the query id
(``all_souls_1``), as ``compute_ap`` and the ranked-list files name queries."""

from __future__ import annotations

from oxbench.evaluation import kernels as K
from oxbench.evaluation.labelled import DEFAULT_KS, LabelledProtocol
from oxbench.protocol import register_protocol


class Original(LabelledProtocol):
    """The original protocol: one setup, good + ok positive, junk ignored."""

    setups = ("original",)
    labels = ("positive", "junk", "negative")
    setup_labels = {"original": (frozenset({"positive"}), frozenset({"junk"}))}
    code_setups = {"original": ((K.POSITIVE,), (K.JUNK,))}
    default_ks = DEFAULT_KS
    scores_feature_files = True
    keys_by_query_id = True
    command = "oxford"
    full_name = "Oxford 5K / Paris 6K"
    about = "original Oxford 5K / Paris 6K: good + ok positive, junk ignored (compute_ap.cpp)"


ORIGINAL = register_protocol(Original("original"))
