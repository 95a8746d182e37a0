"""The revisited labels (Easy / Hard / Unclear / Negative), decided from generation parameters.

The rules are :class:`~oxbench.datasets.synthetic.config.LabelThresholds`; this module applies them
to the measured facts of one (query, database image) pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from oxbench.datasets.synthetic.config import LabelThresholds

Label = Literal["easy", "hard", "junk", "negative"]


@dataclass(frozen=True)
class PairFacts:
    """What the generator knows about one database image relative to one query.

    Attributes:
        same_landmark: the image's main building is the query's landmark.
        mirror: the image shows the mirror (back) side of the facade.
        visible: share of the query region inside the frame, in front of the camera, unoccluded.
        angle: viewing angle to the facade normal, degrees.
        scale_change: ratio of the query region's apparent size here and in the query image,
            taken >= 1 (2.0 = twice as large or twice as small).
        light: global light factor (1 = the query's light).
        night: a night view.
        roll: in-plane rotation, degrees.
        blur: Gaussian blur sigma, pixels.
    """

    same_landmark: bool
    mirror: bool = False
    visible: float = 1.0
    angle: float = 0.0
    scale_change: float = 1.0
    light: float = 1.0
    night: bool = False
    roll: float = 0.0
    blur: float = 0.0


def decide_label(facts: PairFacts, t: LabelThresholds) -> Label:
    """Apply the documented rules (see :class:`LabelThresholds`) to one pair.

    Example:
        >>> decide_label(PairFacts(True, visible=0.9, angle=10.0), LabelThresholds())
        'easy'
        >>> decide_label(PairFacts(True, visible=0.9, angle=50.0), LabelThresholds())
        'hard'
        >>> decide_label(PairFacts(True, visible=0.1), LabelThresholds())
        'junk'
    """
    if not facts.same_landmark:
        return "negative"
    if (
        facts.mirror
        or facts.visible < t.junk_max_visible
        or facts.angle > t.junk_min_angle_deg
        or facts.scale_change > t.junk_min_scale_change
        or facts.light < t.junk_max_light
    ):
        return "junk"
    if (
        facts.angle > t.easy_max_angle_deg
        or facts.scale_change > t.easy_max_scale_change
        or facts.night
        or not t.easy_min_light <= facts.light <= t.easy_max_light
        or facts.visible < t.easy_min_visible
        or abs(facts.roll) > t.easy_max_roll_deg
        or facts.blur > t.easy_max_blur
    ):
        return "hard"
    return "easy"


def hard_reasons(facts: PairFacts, t: LabelThresholds) -> list[str]:
    """Which rules made a pair Hard or Unclear (for the manifest: *why* is this image Hard?)."""
    out = []
    if facts.mirror:
        out.append("mirror side")
    if facts.visible < t.easy_min_visible:
        out.append(f"visible {facts.visible:.2f}")
    if facts.angle > t.easy_max_angle_deg:
        out.append(f"angle {facts.angle:.0f}")
    if facts.scale_change > t.easy_max_scale_change:
        out.append(f"scale x{facts.scale_change:.1f}")
    if facts.night:
        out.append("night")
    if not t.easy_min_light <= facts.light <= t.easy_max_light:
        out.append(f"light {facts.light:.2f}")
    if abs(facts.roll) > t.easy_max_roll_deg:
        out.append(f"roll {facts.roll:.0f}")
    if facts.blur > t.easy_max_blur:
        out.append(f"blur {facts.blur:.1f}")
    return out
