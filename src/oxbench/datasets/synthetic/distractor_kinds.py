"""Distractors of other kinds than the test city's own streets, generated on demand by index.

R1M's distractors are photos from elsewhere (no UK, France or Las Vegas), not more of the test
city. These kinds approximate that for the synthetic benchmark, each image a pure function of
``(city, seed, kind, index)`` like :func:`~oxbench.datasets.synthetic.plan.render_distractor`:

- ``city``: buildings of *other cities* -- each of :data:`OTHER_CITIES` cities has its own style
  (:func:`~oxbench.datasets.synthetic.facade.city_style`: wall palette, window designs, materials,
  brick, cornices, lettering), photographed as the database is;
- ``scene``: scenes with no building -- vegetation, sky, crowds, interiors and textures, in turn;
- ``nearmiss``: the test city's landmark style without a landmark's geometry: buildings of the
  landmark kind (more bays, towers and domes, signs, clocks, crests, rose windows) that are not
  one of the landmarks, in the city's own style;
- ``mixed``: each index one of the three, drawn with equal odds; image ``j`` of the mixed set *is*
  image ``j`` of the kind drawn (same name, same pixels), so their features are shared.

``--distractors synthetic-<kind>:N`` asks for N of them (:func:`parse_kind_spec`);
``synthetic-mined-<kind>:N`` for the N most distracting of a pool of that kind, as
``oxbench data mine-distractors`` kept them (:mod:`oxbench.datasets.mining`). A plain ``N`` stays
the test city's own streets (kind ``same``).
"""

from __future__ import annotations

import dataclasses
import io
import re
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.synthetic.config import SynthConfig
from oxbench.datasets.synthetic.rand import rng_for
from oxbench.errors import InputError, require

#: The test city's own streets and buildings (``--distractors N``).
SAME = "same"
#: Kinds asked for by name, with the letter their image names carry (``<city>_x<letter><j>``).
KIND_LETTERS = {"city": "c", "scene": "s", "nearmiss": "n"}
#: Every kind ``synthetic-<kind>:N`` accepts.
KINDS = (*KIND_LETTERS, "mixed")
#: Other cities the ``city`` kind photographs.
OTHER_CITIES = 16
#: Consecutive images of one building (as in :data:`~oxbench.datasets.synthetic.plan.DISTRACTOR_GROUP`).
GROUP = 4
#: Scene subjects of the ``scene`` kind, in turn by index.
SCENES = ("vegetation", "sky", "crowd", "interior", "texture")
#: Most generated distractors a spec may ask for.
MAX_COUNT = 100_000_000

_SPEC_RE = re.compile(r"^synthetic-(mined-)?([a-z]+):(\d{1,9})$")


@dataclass(frozen=True)
class KindSpec:
    """A parsed ``--distractors synthetic-<kind>:N`` (or ``synthetic-mined-<kind>:N``)."""

    kind: str
    count: int
    mined: bool = False

    @property
    def text(self) -> str:
        """The spec as written (``synthetic-mixed:1000``)."""
        return f"synthetic-{'mined-' if self.mined else ''}{self.kind}:{self.count}"


def parse_kind_spec(text: str) -> KindSpec:
    """``synthetic-<kind>:N`` or ``synthetic-mined-<kind>:N`` -> :class:`KindSpec`.

    Raises:
        InputError: one line: not that form, an unknown kind (the kinds named), N of 0 or past
            :data:`MAX_COUNT`.

    Example:
        >>> parse_kind_spec("synthetic-mixed:1000")
        KindSpec(kind='mixed', count=1000, mined=False)
    """
    m = _SPEC_RE.match(text)
    kinds = ", ".join(f"synthetic-{k}:N" for k in KINDS)
    if m is None:
        raise InputError(
            f"--distractors {text!r}: expected a count, a distractor set id or a generated kind "
            f"({kinds}; synthetic-mined-<kind>:N)"
        )
    mined, kind, count = bool(m.group(1)), m.group(2), int(m.group(3))
    if kind not in KINDS:
        raise InputError(f"--distractors {text}: unknown distractor kind {kind!r}; use {kinds}")
    if not 1 <= count <= MAX_COUNT:
        raise InputError(f"--distractors {text}: the count must be 1 to {MAX_COUNT:,}")
    return KindSpec(kind, count, mined)


def is_kind_spec(text: object) -> bool:
    """Whether ``text`` asks for generated distractors of a kind (``synthetic-...:N``)."""
    return isinstance(text, str) and text.startswith("synthetic-") and ":" in text


def kind_tag(distractors: object) -> str:
    """What a run's label adds after the count for a generated kind (``" mixed"``, ``" mined
    mixed"``); ``""`` for anything else."""
    if not is_kind_spec(distractors):
        return ""
    spec = parse_kind_spec(str(distractors))
    return f" {'mined ' if spec.mined else ''}{spec.kind}"


def kind_of(config: SynthConfig, kind: str, j: int) -> str:
    """The kind image ``j`` of ``kind`` really is (``mixed`` draws one of the three)."""
    if kind != "mixed":
        return kind
    r = rng_for(config.city_seed, config.seed, "mixed-kind", j)
    return tuple(KIND_LETTERS)[int(r.integers(len(KIND_LETTERS)))]


def kind_name(config: SynthConfig, kind: str, j: int) -> str:
    """Name of image ``j`` of ``kind`` (``northford_xc0000007``; today's ``_x0000007`` for same)."""
    from oxbench.datasets.synthetic.plan import distractor_name

    if kind == SAME:
        return distractor_name(config, j)
    return f"{config.city}_x{KIND_LETTERS[kind_of(config, kind, j)]}{j:07d}"


def render_kind(config: SynthConfig, kind: str, j: int) -> NDArray[np.uint8]:
    """Image ``j`` of ``kind``, decoded RGB ``[h, w, 3]``, through the same JPEG round trip as
    the stored images."""
    from oxbench.datasets.synthetic.plan import render_distractor

    if kind == SAME:
        return render_distractor(config, j)
    real = kind_of(config, kind, j)
    if real == "city":
        other = dataclasses.replace(config, city=f"{config.city}-other{j // GROUP % OTHER_CITIES}")
        image, quality = _building(other, "generic", 2_000_000 + j // GROUP, "other-city", j)
    elif real == "nearmiss":
        image, quality = _building(config, "landmark", 1_000_000 + j // GROUP, "near-miss", j)
    else:
        image, quality = _scene(config, j)
    return _jpeg_round_trip(image, quality)


def _jpeg_round_trip(image: NDArray[np.uint8], quality: int) -> NDArray[np.uint8]:
    from oxbench.datasets.synthetic.plan import encode_jpeg

    pil = require("PIL.Image", "images")
    with pil.open(io.BytesIO(encode_jpeg(image, quality))) as im:
        return np.asarray(im.convert("RGB"))


def _building(
    config: SynthConfig, kind: str, building: int, purpose: str, j: int
) -> tuple[NDArray[np.uint8], int]:
    """A photograph of ``building`` of ``kind`` in ``config``'s city, drawn as the database's are."""
    from oxbench.datasets.synthetic.plan import _facade_size, sample_view
    from oxbench.datasets.synthetic.scene import View, render_view

    r = rng_for(config.city_seed, config.seed, purpose, j)
    intent = str(r.choice(["easy", "hard", "junk"], p=[0.5, 0.38, 0.12]))
    view = sample_view(r, config, _facade_size(config, kind, building), intent)
    nbs = r.choice(config.generic_buildings, 2, replace=False)
    view = View(**{**asdict(view), "neighbours": (int(nbs[0]), int(nbs[1]))})
    rendered = render_view(
        config.city_seed,
        kind,
        building,
        view,
        config.image_size,
        rng_for(config.city_seed, config.seed, f"{purpose}-scene", j),
    )
    return rendered.image, view.jpeg


def scene_subject(j: int) -> str:
    """What scene image ``j`` shows (:data:`SCENES`, in turn)."""
    return SCENES[j % len(SCENES)]


def _scene(config: SynthConfig, j: int) -> tuple[NDArray[np.uint8], int]:
    """A scene without a building: vegetation, sky, a crowd, an interior or a texture."""
    cv2 = require("cv2", "classic")
    w, h = config.image_size
    r = rng_for(config.city_seed, config.seed, "scene", j)
    subject = scene_subject(j)
    img = np.zeros((h, w, 3), np.uint8)

    def colour(lo: float = 0.0, hi: float = 1.0) -> tuple[int, int, int]:
        return tuple(int(v) for v in r.uniform(255 * lo, 255 * hi, 3))  # type: ignore[return-value]

    if subject == "vegetation":
        img[:] = colour(0.05, 0.25)
        for _ in range(int(r.integers(150, 300))):  # leaves and bushes, dark to light greens
            c = (int(r.uniform(10, 90)), int(r.uniform(60, 200)), int(r.uniform(10, 90)))
            centre = (int(r.integers(0, w)), int(r.integers(0, h)))
            axes = (int(r.integers(3, 30)), int(r.integers(3, 18)))
            cv2.ellipse(img, centre, axes, float(r.uniform(0, 180)), 0, 360, c, -1)
        for _ in range(int(r.integers(1, 5))):  # trunks
            x = int(r.integers(0, w))
            cv2.line(img, (x, h), (x + int(r.integers(-40, 40)), int(r.integers(0, h // 2))),
                     colour(0.15, 0.35), int(r.integers(4, 14)))  # fmt: skip
    elif subject == "sky":
        top, bottom = np.array(colour(0.3, 0.7)), np.array(colour(0.7, 1.0))
        t = np.linspace(0, 1, h)[:, None, None]
        img[:] = (top * (1 - t) + bottom * t).astype(np.uint8)
        for _ in range(int(r.integers(3, 12))):  # clouds
            centre = (int(r.integers(0, w)), int(r.integers(0, h)))
            cv2.ellipse(img, centre, (int(r.integers(20, 120)), int(r.integers(8, 40))), 0, 0,
                        360, colour(0.85, 1.0), -1)  # fmt: skip
        img = cv2.GaussianBlur(img, (0, 0), float(r.uniform(2, 6)))
    elif subject == "crowd":
        img[:] = colour(0.3, 0.6)
        for _ in range(int(r.integers(40, 120))):  # people: a body and a head, far to near
            y = int(r.integers(h // 4, h))
            s = max(3, int(y / h * r.uniform(10, 30)))
            x = int(r.integers(0, w))
            cv2.rectangle(img, (x - s, y - 2 * s), (x + s, y + 3 * s), colour(), -1)
            cv2.circle(img, (x, y - 3 * s), int(s * 0.8), colour(0.4, 0.9), -1)
    elif subject == "interior":
        img[:] = colour(0.5, 0.9)  # back wall
        vx, vy = int(r.integers(w // 3, 2 * w // 3)), int(r.integers(h // 3, 2 * h // 3))
        bw, bh = int(r.integers(w // 5, w // 3)), int(r.integers(h // 5, h // 3))
        floor = np.array([[0, h], [w, h], [vx + bw, vy + bh], [vx - bw, vy + bh]], np.int32)
        cv2.fillPoly(img, [floor], colour(0.2, 0.5))
        for side in (-1, 1):  # side walls
            wall = np.array([[0 if side < 0 else w, 0], [vx + side * bw, vy - bh],
                             [vx + side * bw, vy + bh], [0 if side < 0 else w, h]], np.int32)  # fmt: skip
            cv2.fillPoly(img, [wall], colour(0.4, 0.8))
        for _ in range(int(r.integers(3, 9))):  # furniture and framed pictures
            x, y = int(r.integers(0, w - 40)), int(r.integers(0, h - 40))
            cv2.rectangle(img, (x, y), (x + int(r.integers(15, 90)), y + int(r.integers(15, 70))),
                          colour(), -1)  # fmt: skip
    else:  # texture: a tiled pattern (tiles, fabric, paving)
        tile = int(r.integers(8, 40))
        a, b = colour(), colour()
        yy, xx = np.mgrid[0:h, 0:w]
        pattern = ((xx // tile + (yy // tile) * int(r.integers(1, 3))) % 2).astype(bool)
        img[pattern], img[~pattern] = a, b
        grain = r.normal(0, r.uniform(4, 16), (h, w, 1))
        img = np.clip(img.astype(np.float32) + grain, 0, 255).astype(np.uint8)
    noise = r.normal(0, r.uniform(1, 4), img.shape)
    img = np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)
    return img, int(r.integers(config.jpeg_quality[0], config.jpeg_quality[1] + 1))
