"""What each image of a synthetic benchmark shows: building, camera and conditions, and its labels.

Every image is planned from ``(city seed, seed, purpose, index)`` alone, so any image can be made
on its own, in any order, in any process. :func:`render_db_image` / :func:`render_query_image`
return the JPEG bytes and a JSON-ready record (the generation parameters and, for landmark
images, the label for each query of that landmark with the reasons).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.synthetic.config import LANDMARK_NAMES, SynthConfig
from oxbench.datasets.synthetic.labels import PairFacts, decide_label, hard_reasons
from oxbench.datasets.synthetic.rand import rng_for
from oxbench.datasets.synthetic.scene import (
    View,
    facade_level,
    generic_width,
    local_scale,
    project,
    render_view,
    texture_width,
    visible_fraction,
)
from oxbench.errors import require


@dataclass(frozen=True)
class QuerySpec:
    """One query: a box on a separate, easy photograph of a landmark.

    Attributes:
        name: query image name.
        landmark: landmark index; ``label`` its name; ``number`` 1-based within the landmark.
        rect: the query region in facade pixels ``(x1, y1, x2, y2)`` (what must be visible).
        view: how the query photograph is taken.
        scale: image pixels per facade pixel at the region's centre in the query image.
        bbox: the region's box in the query image (what the ground truth stores).
    """

    name: str
    landmark: int
    label: str
    number: int
    rect: tuple[float, float, float, float]
    view: View
    scale: float
    bbox: tuple[float, float, float, float]


def db_name(config: SynthConfig, i: int) -> str:
    """Name of database image ``i`` (neutral: names carry no label)."""
    return f"{config.city}_{i:06d}"


def query_name(config: SynthConfig, landmark: int, number: int) -> str:
    """Name of query image ``number`` (1-based) of ``landmark``."""
    return f"{config.city}_q_{LANDMARK_NAMES[landmark]}_{number}"


def distractor_name(config: SynthConfig, j: int) -> str:
    """Name of on-demand distractor ``j``."""
    return f"{config.city}_x{j:07d}"


def _facade_size(config: SynthConfig, kind: str, index: int) -> tuple[int, int]:
    base = texture_width(config.image_size)
    width = base if kind == "landmark" else generic_width(config.city_seed, index, base)
    fac = facade_level(config.city_seed, kind, index, width, 0, False)
    return fac.width, fac.height


def _fit(config: SynthConfig, size: tuple[int, int]) -> float:
    """Largest head-on zoom at which the whole facade fits in the frame."""
    w, h = config.image_size
    fw, fh = size
    return min(1.0, (h / w) / (fh / fw))


@lru_cache(maxsize=8)
def query_specs(config: SynthConfig) -> tuple[QuerySpec, ...]:
    """All queries of a config, landmark by landmark (cached per process)."""
    from oxbench.datasets.synthetic.scene import homography

    w, h = config.image_size
    specs = []
    for lm in range(config.landmarks):
        fw, fh = _facade_size(config, "landmark", lm)
        for n in range(1, config.queries_per_landmark + 1):
            r = rng_for(config.city_seed, config.seed, "query", lm, n)
            if n == 1:
                rect = (0.0, 0.0, float(fw), float(fh))
            else:
                rw, rh = r.uniform(0.55, 0.95) * fw, r.uniform(0.5, 0.95) * fh
                x1, y1 = r.uniform(0, fw - rw), r.uniform(0, fh - rh)
                rect = (float(x1), float(y1), float(x1 + rw), float(y1 + rh))
            k = r.uniform(0.62, 0.85)
            s = k * min(w / (rect[2] - rect[0]), h / (rect[3] - rect[1]))
            view = View(
                yaw=float(r.uniform(-12, 12)),
                pitch=float(r.uniform(0, 8)),
                roll=float(r.normal(0, 1.0)),
                zoom=float(s * fw / w),
                target=(float((rect[0] + rect[2]) / 2 / fw), float((rect[1] + rect[3]) / 2 / fh)),
                light=float(r.uniform(0.9, 1.1)),
                cast=tuple(float(c) for c in r.normal(1.0, 0.02, 3)),  # type: ignore[arg-type]
                blur=float(r.uniform(0, 0.5)),
                noise=float(r.uniform(0.5, 2.0)),
                jpeg=int(r.integers(85, 96)),
                neighbours=tuple(
                    int(v) for v in r.choice(config.generic_buildings, 2, replace=False)
                ),  # type: ignore[arg-type]
                clutter=False,
            )
            hom = homography(view, (fw, fh), config.image_size)
            cx, cy = (rect[0] + rect[2]) / 2, (rect[1] + rect[3]) / 2
            corners, _ = project(
                hom,
                np.array(
                    [[rect[0], rect[1]], [rect[2], rect[1]], [rect[2], rect[3]], [rect[0], rect[3]]]
                ),
            )
            x1b, y1b = np.clip(corners.min(0), 0, [w - 1, h - 1])
            x2b, y2b = np.clip(corners.max(0), 0, [w - 1, h - 1])
            bbox = (
                round(float(x1b), 2),
                round(float(y1b), 2),
                round(float(x2b), 2),
                round(float(y2b), 2),
            )
            specs.append(
                QuerySpec(
                    query_name(config, lm, n),
                    lm,
                    LANDMARK_NAMES[lm],
                    n,
                    rect,
                    view,
                    local_scale(hom, cx, cy),
                    bbox,
                )
            )
    return tuple(specs)


@lru_cache(maxsize=8)
def _guaranteed(config: SynthConfig) -> dict[int, tuple[int, str]]:
    """Database slots that show each landmark in a view positive for all its queries.

    Two per landmark (one head-on, one oblique), at positions chosen by a seeded permutation, so
    that every query has positives whatever the database size.
    """
    if config.queries_per_landmark == 0:
        return {}
    perm = rng_for(config.city_seed, config.seed, "guaranteed").permutation(config.db_size)
    out = {}
    for lm in range(config.landmarks):
        out[int(perm[lm])] = (lm, "guaranteed-easy")
        out[int(perm[config.landmarks + lm])] = (lm, "guaranteed-hard")
    return out


_HARD_FACTORS = ("angle", "far", "close", "dim", "bright", "night", "occlusion", "roll", "blur")
_JUNK_FACTORS = ("mirror", "partial", "extreme-angle", "buried")


def sample_view(
    r: np.random.Generator, config: SynthConfig, size: tuple[int, int], intent: str
) -> View:
    """Draw a photograph of a facade of ``size`` with the given intent.

    ``intent`` is ``easy``, ``hard``, ``junk``, ``street``, ``guaranteed-easy`` or
    ``guaranteed-hard``; it steers the draw but the labels are decided afterwards from what the
    image really shows (a close-up may be Easy for one query and Unclear for another).
    Landmark and non-landmark images use the same distribution, so views carry no label.
    """
    fit = _fit(config, size)
    yaw = float(r.uniform(0, 25) * r.choice([-1, 1]))
    pitch = float(r.uniform(-3, 12))
    roll = float(r.normal(0, 2.5))
    zoom = float(r.uniform(0.55, 1.0) * fit)
    target = (
        float(np.clip(r.normal(0.5, 0.08), 0.05, 0.95)),
        float(np.clip(r.normal(0.5, 0.08), 0.05, 0.95)),
    )
    light = float(r.uniform(0.75, 1.3))
    cast = tuple(float(c) for c in r.normal(1.0, 0.04, 3))
    shadow = float(r.uniform(0.15, 0.35)) if r.random() < 0.25 else 0.0
    occlusion = 0.0 if r.random() < 0.6 else float(r.uniform(0.03, 0.15))
    blur = float(r.uniform(0, 1.0))
    noise = float(r.uniform(0.5, 3.0))
    jpeg = int(r.integers(config.jpeg_quality[0], config.jpeg_quality[1] + 1))
    night = mirror = False
    clutter = not intent.startswith("guaranteed")  # guaranteed views are unoccluded
    if intent == "guaranteed-easy":
        yaw, pitch, roll = float(r.uniform(-10, 10)), float(r.uniform(0, 6)), 0.0
        zoom, target, occlusion, shadow, blur, light = (
            float(r.uniform(0.8, 0.92) * fit),
            (0.5, 0.5),
            0.0,
            0.0,
            0.3,
            1.0,
        )
    elif intent == "guaranteed-hard":
        yaw = float(r.uniform(40, 55) * r.choice([-1, 1]))
        zoom, target, occlusion = float(r.uniform(0.6, 0.7) * fit), (0.5, 0.5), 0.0
    elif intent == "hard":
        for factor in r.choice(_HARD_FACTORS, size=int(r.integers(1, 3)), replace=False).tolist():
            if factor == "angle":
                yaw = float(r.uniform(38, 68) * r.choice([-1, 1]))
            elif factor == "far":
                zoom = float(r.uniform(0.12, 0.3))
            elif factor == "close":
                zoom = float(r.uniform(1.4, 2.6))
                target = (float(r.uniform(0.2, 0.8)), float(r.uniform(0.25, 0.75)))
            elif factor == "dim":
                light = float(r.uniform(0.22, 0.5))
                cast = tuple(float(c) for c in r.normal(1.0, 0.12, 3))
            elif factor == "bright":
                light = float(r.uniform(1.7, 2.3))
            elif factor == "night":
                night, light, cast = True, float(r.uniform(0.3, 0.5)), (0.8, 0.85, 1.2)
                noise = float(r.uniform(4, 9))
            elif factor == "occlusion":
                occlusion = float(r.uniform(0.35, 0.6))
            elif factor == "roll":
                roll = float(r.uniform(28, 45) * r.choice([-1, 1]))
            elif factor == "blur":
                blur = float(r.uniform(2.3, 3.5))
    elif intent == "junk":
        factor = str(r.choice(_JUNK_FACTORS))
        if factor == "mirror":
            mirror = True
        elif factor == "partial":
            zoom = float(r.uniform(2.0, 3.2))
            target = (
                float(r.choice([r.uniform(0.0, 0.12), r.uniform(0.88, 1.0)])),
                float(r.uniform(0.1, 0.9)),
            )
        elif factor == "extreme-angle":
            yaw = float(r.uniform(76, 80) * r.choice([-1, 1]))
            zoom = float(r.uniform(0.5, 0.8) * fit)
        else:
            occlusion = float(r.uniform(0.8, 0.95))
    elif intent == "street":
        yaw = float(r.uniform(45, 75) * r.choice([-1, 1]))
        zoom = float(r.uniform(0.2, 0.6))
        occlusion = float(r.uniform(0.4, 0.8))
    return View(
        yaw=yaw,
        pitch=pitch,
        roll=roll,
        zoom=zoom,
        target=target,
        mirror=mirror,
        light=light,
        night=night,
        cast=cast,  # type: ignore[arg-type]
        shadow=shadow,
        occlusion=occlusion,
        blur=blur,
        noise=noise,
        jpeg=jpeg,
        clutter=clutter,
    )


@dataclass(frozen=True)
class ImagePlan:
    """What database image ``index`` shows."""

    index: int
    kind: str  # landmark | generic | street
    building: int
    intent: str
    view: View


def plan_db_image(config: SynthConfig, i: int) -> ImagePlan:
    """Plan database image ``i`` from the seeds alone."""
    r = rng_for(config.city_seed, config.seed, "db", i)
    guaranteed = _guaranteed(config).get(i)
    if guaranteed is not None:
        kind, building, intent = "landmark", guaranteed[0], guaranteed[1]
    else:
        u = r.random()
        if u < config.landmark_fraction:
            kind, building = "landmark", int(r.integers(config.landmarks))
        elif u < config.landmark_fraction + config.street_fraction:
            kind, building = "street", int(r.integers(config.generic_buildings))
        else:
            kind, building = "generic", int(r.integers(config.generic_buildings))
        if kind == "street":
            intent = "street"
        else:
            intent = str(r.choice(["easy", "hard", "junk"], p=[0.5, 0.38, 0.12]))
    facade_kind = "landmark" if kind == "landmark" else "generic"
    view = sample_view(r, config, _facade_size(config, facade_kind, building), intent)
    pool = [
        g
        for g in range(config.generic_buildings)
        if not (facade_kind == "generic" and g == building)
    ]
    nbs = r.choice(pool, 2, replace=False)
    view = View(**{**asdict(view), "neighbours": (int(nbs[0]), int(nbs[1]))})
    return ImagePlan(i, kind, building, intent, view)


def encode_jpeg(image: NDArray[np.uint8], quality: int) -> bytes:
    """JPEG bytes of an RGB array (Pillow, baseline, 4:2:0; deterministic)."""
    pil = require("PIL.Image", "images")
    buf = io.BytesIO()
    pil.fromarray(image).save(buf, format="JPEG", quality=int(quality), optimize=False)
    return buf.getvalue()


def _view_record(view: View, occluded: float) -> dict[str, Any]:
    d = asdict(view)
    d = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}
    d["cast"] = [round(c, 4) for c in view.cast]
    d["target"] = [round(c, 4) for c in view.target]
    d["neighbours"] = list(view.neighbours)
    d["angle"] = round(view.angle, 2)
    d["occluded"] = round(occluded, 4)
    return d


def render_db_image(config: SynthConfig, i: int) -> tuple[bytes, dict[str, Any]]:
    """Render database image ``i``: JPEG bytes and its record (parameters, per-query labels)."""
    plan = plan_db_image(config, i)
    facade_kind = "landmark" if plan.kind == "landmark" else "generic"
    r = rng_for(config.city_seed, config.seed, "db-scene", i)
    rendered = render_view(
        config.city_seed, facade_kind, plan.building, plan.view, config.image_size, r
    )
    data = encode_jpeg(rendered.image, plan.view.jpeg)
    record: dict[str, Any] = {
        "name": db_name(config, i),
        "kind": plan.kind,
        "building": LANDMARK_NAMES[plan.building]
        if plan.kind == "landmark"
        else f"generic_{plan.building}",
        "intent": plan.intent,
        "view": _view_record(plan.view, rendered.occluded),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if plan.kind == "landmark":
        labels = {}
        for q in query_specs(config):
            if q.landmark != plan.building:
                continue
            cx, cy = (q.rect[0] + q.rect[2]) / 2, (q.rect[1] + q.rect[3]) / 2
            s = local_scale(rendered.hom, cx, cy)
            change = float("inf") if s <= 0 else max(s / q.scale, q.scale / s)
            facts = PairFacts(
                same_landmark=True,
                mirror=plan.view.mirror,
                visible=visible_fraction(rendered, q.rect, config.image_size),
                angle=plan.view.angle,
                scale_change=change,
                light=plan.view.light,
                night=plan.view.night,
                roll=plan.view.roll,
                blur=plan.view.blur,
            )
            label = decide_label(facts, config.labels)
            labels[q.name] = {
                "label": label,
                "visible": round(facts.visible, 4),
                "scale_change": round(change, 3) if np.isfinite(change) else None,
                "why": hard_reasons(facts, config.labels) if label != "easy" else [],
            }
        record["labels"] = labels
    return data, record


def render_query_image(config: SynthConfig, q: int) -> tuple[bytes, dict[str, Any]]:
    """Render query image ``q`` (index into :func:`query_specs`): JPEG bytes and its record."""
    spec = query_specs(config)[q]
    r = rng_for(config.city_seed, config.seed, "query-scene", spec.landmark, spec.number)
    rendered = render_view(
        config.city_seed, "landmark", spec.landmark, spec.view, config.image_size, r
    )
    data = encode_jpeg(rendered.image, spec.view.jpeg)
    record = {
        "name": spec.name,
        "landmark": spec.label,
        "number": spec.number,
        "bbox": list(spec.bbox),
        "region": [round(v, 2) for v in spec.rect],
        "view": _view_record(spec.view, rendered.occluded),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return data, record


#: Consecutive distractors showing the same (non-landmark) building.
DISTRACTOR_GROUP = 4


def render_distractor(config: SynthConfig, j: int) -> NDArray[np.uint8]:
    """On-demand distractor ``j``: a non-landmark building or street of the city, decoded RGB.

    Distractor buildings come from their own pool (never a database building or a landmark), and
    the image goes through the same JPEG round trip as the stored images. Consecutive indices
    come in groups of :data:`DISTRACTOR_GROUP` photographs of one building (as photo collections
    hold several photos of a building), which also lets a sequential reader reuse the rendered
    facade.
    """
    r = rng_for(config.city_seed, config.seed, "distractor", j)
    building = 1_000_000 + j // DISTRACTOR_GROUP
    intent = (
        "street"
        if r.random() < config.street_fraction
        else str(r.choice(["easy", "hard", "junk"], p=[0.5, 0.38, 0.12]))
    )
    view = sample_view(r, config, _facade_size(config, "generic", building), intent)
    nbs = r.choice(config.generic_buildings, 2, replace=False)
    view = View(**{**asdict(view), "neighbours": (int(nbs[0]), int(nbs[1]))})
    rendered = render_view(
        config.city_seed,
        "generic",
        building,
        view,
        config.image_size,
        rng_for(config.city_seed, config.seed, "distractor-scene", j),
    )
    pil = require("PIL.Image", "images")
    with pil.open(io.BytesIO(encode_jpeg(rendered.image, view.jpeg))) as im:
        return np.asarray(im.convert("RGB"))


def query_region_boxes(config: SynthConfig, i: int) -> dict[str, tuple[float, float, float, float]]:
    """Where each query's region lies in database image ``i``: ``{query name: (x1, y1, x2, y2)}``.

    The region (facade pixels, :attr:`QuerySpec.rect`) is mapped into the image with the view's
    homography -- from the plan alone, nothing rendered -- and boxed: the bounding box of a grid of
    its points that are in front of the camera and inside the frame (occluded points count: the
    object is there behind the occluder). Only queries of the landmark the image shows, and only
    when some of the region is in the frame; other images get ``{}``.
    """
    from oxbench.datasets.synthetic.scene import homography

    plan = plan_db_image(config, i)
    if plan.kind != "landmark":
        return {}
    fw, fh = _facade_size(config, "landmark", plan.building)
    hom = homography(plan.view, (fw, fh), config.image_size)
    w, h = config.image_size
    out: dict[str, tuple[float, float, float, float]] = {}
    for q in query_specs(config):
        if q.landmark != plan.building:
            continue
        x1, y1, x2, y2 = q.rect
        if plan.view.mirror:  # the facade is seen flipped left-right
            x1, x2 = fw - x2, fw - x1
        us, vs = np.meshgrid(np.linspace(x1, x2, 48), np.linspace(y1, y2, 48))
        pts, front = project(hom, np.column_stack([us.ravel(), vs.ravel()]))
        inside = front & (pts[:, 0] >= 0) & (pts[:, 0] <= w) & (pts[:, 1] >= 0) & (pts[:, 1] <= h)
        if inside.sum() < 2:
            continue
        lo, hi = pts[inside].min(0), pts[inside].max(0)
        if hi[0] - lo[0] < 1 or hi[1] - lo[1] < 1:
            continue
        out[q.name] = (
            round(float(lo[0]), 2),
            round(float(lo[1]), 2),
            round(float(hi[0]), 2),
            round(float(hi[1]), 2),
        )
    return out
