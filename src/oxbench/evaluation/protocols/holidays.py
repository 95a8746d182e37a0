"""INRIA Holidays (Jegou et al., ECCV 2008), as ``holidays_map.py`` scores it: the group's other
images are positive, the query image is ignored wherever it appears."""

from __future__ import annotations

from oxbench.evaluation import kernels as K
from oxbench.evaluation.labelled import LabelledProtocol
from oxbench.protocol import register_protocol


class Holidays(LabelledProtocol):
    """Holidays: one setup, the query image ignored; no mP@K unless asked."""

    setups = ("holidays",)
    labels = ("positive", "junk", "negative")
    setup_labels = {"holidays": (frozenset({"positive"}), frozenset({"junk"}))}
    code_setups = {"holidays": ((K.POSITIVE,), (K.JUNK,))}
    command = "holidays"
    full_name = "Holidays"
    about = "INRIA Holidays: mAP, the query image ignored (holidays_map.py)"


HOLIDAYS = register_protocol(Holidays("holidays"))
