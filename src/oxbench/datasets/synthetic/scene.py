"""Photographs of facades: a pinhole camera, the street around the building, light and defects.

A facade is a plane (facade pixels are world units, y pointing down). A :class:`View` places a
camera in front of it (yaw, pitch, roll, distance, aim point); the plane-to-image homography
renders the facade and its neighbours, then occluders (trees, cars, people, lamp posts, buses),
illumination and colour change, blur, noise and JPEG compression are applied. Everything needed
to label the image (what fraction of a query region is visible, at what scale, from what angle)
follows from the view and the occluder mask, so the labels are true by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.synthetic.facade import Facade, render_facade
from oxbench.datasets.synthetic.rand import rng_for
from oxbench.errors import require

FOCAL_FACTOR = 1.1  # focal length in units of the image width (a ~49 degree lens)
TEXTURE_FACTOR = 1.3  # landmark texture width in units of the image width


def _cv2():  # noqa: ANN202 - returns a module
    return require("cv2", "classic")


@dataclass(frozen=True)
class View:
    """How one photograph is taken. Angles in degrees; ``zoom`` = facade width / image width
    when seen head-on; ``target`` = aim point as fractions of the facade width and height.
    """

    yaw: float = 0.0
    pitch: float = 0.0
    roll: float = 0.0
    zoom: float = 0.8
    target: tuple[float, float] = (0.5, 0.5)
    mirror: bool = False
    light: float = 1.0
    night: bool = False
    cast: tuple[float, float, float] = (1.0, 1.0, 1.0)
    shadow: float = 0.0  # darkening of a cast shadow (0 = none)
    occlusion: float = 0.0  # target share of the main facade covered by occluders
    blur: float = 0.0  # Gaussian sigma in pixels
    noise: float = 0.0  # Gaussian noise sigma (0..255 scale)
    jpeg: int = 90
    neighbours: tuple[int, int] = (0, 1)
    clutter: bool = True  # allow a stray street object when no occlusion is asked for

    @property
    def angle(self) -> float:
        """Angle between the viewing direction and the facade normal, in degrees."""
        c = math.cos(math.radians(self.yaw)) * math.cos(math.radians(self.pitch))
        return math.degrees(math.acos(max(-1.0, min(1.0, c))))


def homography(
    view: View, facade_size: tuple[int, int], image_size: tuple[int, int]
) -> NDArray[np.float64]:
    """The 3x3 map from facade pixels ``(u, v, 1)`` to image pixels for ``view``.

    The camera looks at the aim point from distance ``focal * facade_width / (zoom * W)``, turned
    by ``yaw`` (left-right), ``pitch`` (positive = looking up from street level) and ``roll``.
    """
    fw, fh = facade_size
    w, h = image_size
    f = FOCAL_FACTOR * w
    d = f * fw / (view.zoom * w)
    yaw, pitch, roll = (math.radians(a) for a in (view.yaw, view.pitch, view.roll))
    target = np.array([view.target[0] * fw, view.target[1] * fh, 0.0])
    to_cam = np.array(
        [math.sin(yaw) * math.cos(pitch), math.sin(pitch), -math.cos(yaw) * math.cos(pitch)]
    )
    centre = target + d * to_cam
    z = -to_cam
    x = np.cross([0.0, 1.0, 0.0], z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    cr, sr = math.cos(roll), math.sin(roll)
    x, y = cr * x + sr * y, -sr * x + cr * y
    rot = np.stack([x, y, z])
    t = -rot @ centre
    k = np.array([[f, 0.0, w / 2.0], [0.0, f, h / 2.0], [0.0, 0.0, 1.0]])
    hom = k @ np.column_stack([rot[:, 0], rot[:, 1], t])
    # Scale by a positive number (the aim point's depth) so that the third homogeneous
    # coordinate stays the depth's sign: points behind the camera keep w < 0.
    return hom / d


def project(
    hom: NDArray[np.float64], pts: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Map ``[n, 2]`` facade points to image points; also return which are in front of the camera."""
    ph = np.column_stack([pts, np.ones(len(pts))]) @ hom.T
    front = ph[:, 2] > 1e-9
    out = ph[:, :2] / np.where(front, ph[:, 2], 1.0)[:, None]
    return out, front


def local_scale(hom: NDArray[np.float64], u: float, v: float) -> float:
    """sqrt |det J| of the homography at facade point (u, v): image pixels per facade pixel."""
    p = hom @ np.array([u, v, 1.0])
    if p[2] <= 0:
        return 0.0
    jac = (hom[:2, :2] * p[2] - np.outer(p[:2], hom[2, :2])) / p[2] ** 2
    return math.sqrt(abs(float(np.linalg.det(jac))))


# ---------------------------------------------------------------------------------------------
# facade textures (cached per process: a worker renders each building once)


def texture_width(image_size: tuple[int, int]) -> int:
    """Landmark texture width for an image size (generic buildings are narrower)."""
    return int(round(TEXTURE_FACTOR * image_size[0]))


def generic_width(city_seed: int, index: int, base: int) -> int:
    """Texture width of generic building ``index`` (buildings differ in width)."""
    return int(round(base * rng_for(city_seed, "generic-width", index).uniform(0.55, 0.95)))


@lru_cache(maxsize=160)
def facade_level(
    city_seed: int, kind: str, index: int, width: int, level: int, mirror: bool
) -> Facade:
    """A facade at pyramid ``level`` (each level halves the size), mirrored if asked; cached."""
    cv2 = _cv2()
    if level == 0:
        fac = render_facade(city_seed, kind, index, width)
        return fac.mirrored() if mirror else fac
    up = facade_level(city_seed, kind, index, width, level - 1, mirror)
    small = cv2.pyrDown(up.rgba)
    return Facade(small, up.body_top // 2, kind, index)


def _pick_level(scale: float) -> int:
    if scale <= 0:
        return 0
    return int(min(3, max(0, math.floor(math.log2(1.0 / scale)))))


# ---------------------------------------------------------------------------------------------
# scene pieces


_TILE = 1024


@lru_cache(maxsize=1)
def _noise_tile() -> NDArray[np.float32]:
    """A fixed tile of unit Gaussian noise; images take seeded random crops of it (fast)."""
    return np.random.default_rng(20240607).standard_normal((_TILE, _TILE, 3), dtype=np.float32)


def _noise(rng: np.random.Generator, h: int, w: int, channels: int = 3) -> NDArray[np.float32]:
    """``h x w x channels`` unit noise, a seeded crop of the tile (tiled when the image is larger)."""
    tile = _noise_tile()
    if h > _TILE or w > _TILE:
        reps = (h // _TILE + 2, w // _TILE + 2, 1)
        tile = np.tile(tile, reps)
    y0 = int(rng.integers(0, tile.shape[0] - h + 1))
    x0 = int(rng.integers(0, tile.shape[1] - w + 1))
    c0 = int(rng.integers(0, 4 - channels)) if channels < 3 else 0
    return tile[y0 : y0 + h, x0 : x0 + w, c0 : c0 + channels]


def _sky(rng: np.random.Generator, w: int, h: int, night: bool) -> NDArray[np.float32]:
    cv2 = _cv2()
    sw, shh = max(8, w // 8), max(8, h // 8)
    t = np.linspace(0.0, 1.0, shh, dtype=np.float32)[:, None, None]
    if night:
        top, bottom = np.array([0.02, 0.03, 0.08]), np.array([0.1, 0.1, 0.16])
    else:
        top = np.array([rng.uniform(0.25, 0.45), rng.uniform(0.45, 0.65), rng.uniform(0.75, 0.95)])
        bottom = np.array([0.82, 0.86, 0.92]) * rng.uniform(0.9, 1.05)
        if rng.random() < 0.3:  # overcast
            top = bottom = np.array([0.75, 0.77, 0.8]) * rng.uniform(0.8, 1.05)
    sky = (top * (1 - t) + bottom * t).astype(np.float32) * np.ones((1, sw, 1), np.float32)
    clouds = cv2.resize(
        rng.standard_normal((6, 8)).astype(np.float32), (sw, shh), interpolation=cv2.INTER_CUBIC
    )
    sky += (0.06 if not night else 0.01) * np.clip(clouds, 0, None)[..., None]
    return cv2.resize(sky, (w, h), interpolation=cv2.INTER_LINEAR)


def _ground(rng: np.random.Generator, w: int, h: int) -> NDArray[np.float32]:
    cv2 = _cv2()
    base = rng.uniform(0.35, 0.55)
    low = cv2.resize(rng.standard_normal((h // 16 + 2, w // 16 + 2)).astype(np.float32), (w, h))
    g = base * (1.0 + 0.08 * low + 0.05 * _noise(rng, h, w, 1)[..., 0])
    return g[..., None] * np.array([1.0, 0.98, 0.95], np.float32)


def _composite(
    dst: NDArray[np.float32],
    rgba: NDArray[np.uint8],
    hom: NDArray[np.float64],
    size: tuple[int, int],
) -> NDArray[np.float32]:
    """Warp an RGBA texture into ``dst`` (in place); return the warped alpha in [0, 1].

    Only the bounding box of the projected texture is warped (it is often a small part).
    """
    cv2 = _cv2()
    w, h = size
    th, tw = rgba.shape[:2]
    alpha_full = np.zeros((h, w), np.float32)
    corners, front = project(hom, np.array([[0, 0], [tw, 0], [tw, th], [0, th]], np.float64))
    if front.all():
        x0 = int(max(0, np.floor(corners[:, 0].min()) - 1))
        y0 = int(max(0, np.floor(corners[:, 1].min()) - 1))
        x1 = int(min(w, np.ceil(corners[:, 0].max()) + 2))
        y1 = int(min(h, np.ceil(corners[:, 1].max()) + 2))
    else:  # part of the plane is behind the camera: warp the whole frame
        x0, y0, x1, y1 = 0, 0, w, h
    if x1 <= x0 or y1 <= y0:
        return alpha_full
    shift = np.array([[1.0, 0.0, -x0], [0.0, 1.0, -y0], [0.0, 0.0, 1.0]])
    warped = cv2.warpPerspective(
        rgba,
        shift @ hom,
        (x1 - x0, y1 - y0),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=(0, 0, 0, 0),
    )
    alpha = warped[..., 3:4].astype(np.float32) * (1.0 / 255.0)
    roi = dst[y0:y1, x0:x1]
    roi *= 1.0 - alpha
    roi += alpha * (warped[..., :3].astype(np.float32) * (1.0 / 255.0))
    alpha_full[y0:y1, x0:x1] = alpha[..., 0]
    return alpha_full


def _occluder(
    img: NDArray[np.float32],
    mask: NDArray[np.uint8],
    rng: np.random.Generator,
    w: int,
    h: int,
    ground_y: float,
) -> None:
    """Draw one street object (tree, car, person, lamp post, bus) and mark it in ``mask``."""
    cv2 = _cv2()
    kind = str(rng.choice(["tree", "tree", "car", "person", "lamp", "bus"]))
    low = min(max(ground_y, 0.55 * h), 1.0 * h)
    base_y = int(rng.uniform(low, 1.08 * h))
    cx = int(rng.uniform(-0.1, 1.1) * w)

    def rect(
        p1: tuple[int, int], p2: tuple[int, int], colour: tuple[float, ...], on_mask: bool = True
    ) -> None:
        cv2.rectangle(img, p1, p2, colour, -1)
        if on_mask:
            cv2.rectangle(mask, p1, p2, 255, -1)

    def disc(c: tuple[int, int], r: int, colour: tuple[float, ...]) -> None:
        cv2.circle(img, c, r, colour, -1)
        cv2.circle(mask, c, r, 255, -1)

    if kind == "tree":
        r = int(rng.uniform(0.12, 0.32) * h)
        trunk_h = int(r * rng.uniform(0.8, 1.6))
        rect((cx - r // 8, base_y - trunk_h), (cx + r // 8, base_y), (0.25, 0.18, 0.1))
        cy = base_y - trunk_h - r // 2
        bx0, by0 = cx - 2 * r, cy - 2 * r
        canopy = np.zeros((4 * r, 4 * r), np.uint8)
        for _ in range(int(rng.integers(4, 9))):
            c = (int(2 * r + rng.normal(0, r * 0.45)), int(2 * r + rng.normal(0, r * 0.35)))
            cv2.circle(canopy, c, int(r * rng.uniform(0.4, 0.75)), 255, -1)
        # clip the canopy box to the frame
        ix0, iy0 = max(0, bx0), max(0, by0)
        ix1, iy1 = min(w, bx0 + 4 * r), min(h, by0 + 4 * r)
        if ix1 > ix0 and iy1 > iy0:
            sel = canopy[iy0 - by0 : iy1 - by0, ix0 - bx0 : ix1 - bx0] > 0
            green = np.array(
                [rng.uniform(0.12, 0.25), rng.uniform(0.3, 0.45), rng.uniform(0.08, 0.15)],
                np.float32,
            )
            leaf = np.clip(1.0 + 0.35 * _noise(rng, iy1 - iy0, ix1 - ix0, 1), 0.3, 1.8) * green
            img[iy0:iy1, ix0:ix1][sel] = leaf[sel]
            mask[iy0:iy1, ix0:ix1][sel] = 255
    elif kind in ("car", "bus"):
        bw = int(rng.uniform(0.25, 0.45) * w) if kind == "car" else int(rng.uniform(0.5, 0.9) * w)
        bh = int(bw * (rng.uniform(0.35, 0.45) if kind == "car" else rng.uniform(0.3, 0.4)))
        x0, y0 = cx - bw // 2, base_y - bh
        body = tuple(float(c) for c in rng.uniform(0.1, 0.9, 3))
        rect((x0, y0 + (bh // 3 if kind == "car" else 0)), (x0 + bw, base_y - bh // 8), body)
        if kind == "car":
            rect((x0 + bw // 5, y0), (x0 + 4 * bw // 5, y0 + bh // 3 + 2), body)
            rect(
                (x0 + bw // 5 + 4, y0 + 4),
                (x0 + 4 * bw // 5 - 4, y0 + bh // 3),
                (0.12, 0.15, 0.2),
                False,
            )
        else:
            for k in range(6):
                wx = x0 + k * bw // 6 + 4
                rect((wx, y0 + bh // 8), (wx + bw // 6 - 8, y0 + bh // 2), (0.12, 0.15, 0.2), False)
        for wx in (x0 + bw // 5, x0 + 4 * bw // 5):
            disc((wx, base_y - bh // 8), max(3, bh // 5), (0.05, 0.05, 0.05))
    elif kind == "person":
        ph = int(rng.uniform(0.15, 0.45) * h)
        pw = max(3, ph // 4)
        coat = tuple(float(c) for c in rng.uniform(0.05, 0.8, 3))
        rect((cx - pw // 2, base_y - int(ph * 0.85)), (cx + pw // 2, base_y), coat)
        disc((cx, base_y - int(ph * 0.92)), max(2, ph // 12), (0.75, 0.6, 0.5))
    else:  # lamp post
        lh = int(rng.uniform(0.5, 0.95) * h)
        lw = max(2, int(0.012 * w))
        rect((cx - lw // 2, base_y - lh), (cx + lw // 2, base_y), (0.08, 0.09, 0.08))
        rect((cx - 3 * lw, base_y - lh - 4 * lw), (cx + 3 * lw, base_y - lh), (0.08, 0.09, 0.08))


@dataclass(frozen=True)
class Rendered:
    """A rendered photograph and what is needed to label it."""

    image: NDArray[np.uint8]  # H x W x 3 RGB
    hom: NDArray[np.float64]  # landmark facade pixels (level 0, unmirrored) -> image
    occluders: NDArray[np.uint8]  # H x W, 255 where an occluder covers the scene
    occluded: float  # measured share of the main facade's visible pixels covered by occluders


def render_view(
    city_seed: int,
    kind: str,
    index: int,
    view: View,
    image_size: tuple[int, int],
    rng: np.random.Generator,
) -> Rendered:
    """Photograph building ``index`` of ``kind`` with ``view``.

    Args:
        city_seed: the city.
        kind: ``landmark`` or ``generic`` (the main building).
        index: the main building.
        view: camera, light and defects.
        image_size: ``(width, height)``.
        rng: randomness for the street (sky, ground, occluders, noise); seeded by the caller.
    """
    cv2 = _cv2()
    w, h = image_size
    base_w = texture_width(image_size)
    main_w = base_w if kind == "landmark" else generic_width(city_seed, index, base_w)
    main0 = facade_level(city_seed, kind, index, main_w, 0, view.mirror)
    fw, fh = main0.width, main0.height
    hom = homography(view, (fw, fh), image_size)
    scale = local_scale(hom, view.target[0] * fw, view.target[1] * fh)
    level = _pick_level(scale)

    img = _sky(rng, w, h, view.night)
    # ground: below the line through the projected bottom corners of the street
    bottom, front = project(hom, np.array([[-1.5 * fw, fh], [2.5 * fw, fh]], np.float64))
    ground_y = float(h)
    if front.all():
        (x1, y1), (x2, y2) = bottom
        if abs(x2 - x1) > 1e-6:
            yy = y1 + (np.arange(w) - x1) * (y2 - y1) / (x2 - x1)
            ground_y = float(np.clip(np.median(yy), -h, 2 * h))
            below = np.arange(h)[:, None] >= yy[None, :]
            if below.any():
                np.copyto(img, _ground(rng, w, h), where=below[..., None])

    # neighbours left and right, bottom-aligned, then the main building
    gap = int(rng.uniform(0.0, 0.08) * fw)
    for side, nb in zip((-1, 1), view.neighbours, strict=True):
        nw = generic_width(city_seed, nb, base_w)
        nfac0 = facade_level(city_seed, "generic", nb, nw, 0, False)
        dx = -gap - nfac0.width if side < 0 else fw + gap
        dy = fh - nfac0.height
        shift = np.array([[1.0, 0, dx], [0, 1.0, dy], [0, 0, 1.0]])
        nhom = hom @ shift
        corners, nfront = project(
            nhom,
            np.array(
                [[0, 0], [nfac0.width, 0], [nfac0.width, nfac0.height], [0, nfac0.height]],
                np.float64,
            ),
        )
        if (
            not nfront.all()
            or corners[:, 0].max() < 0
            or corners[:, 0].min() > w
            or corners[:, 1].max() < 0
            or corners[:, 1].min() > h
        ):
            continue
        lvl = min(level, _pick_level(local_scale(nhom, nfac0.width / 2, nfac0.height / 2)))
        nfac = facade_level(city_seed, "generic", nb, nw, lvl, False)
        down = np.diag([2.0**lvl, 2.0**lvl, 1.0])
        _composite(img, nfac.rgba, nhom @ down, image_size)
    main = facade_level(city_seed, kind, index, main_w, level, view.mirror)
    down = np.diag([2.0**level, 2.0**level, 1.0])
    main_alpha = _composite(img, main.rgba, hom @ down, image_size)

    # cast shadow across part of the scene
    if view.shadow > 0:
        sh = np.zeros((h, w), np.uint8)
        xa, xb = sorted(rng.uniform(-0.3, 1.3, 2) * w)
        cv2.fillPoly(sh, [np.array([[xa, 0], [w * 1.5, 0], [w * 1.5, h], [xb, h]], np.int32)], 255)
        sh = cv2.GaussianBlur(sh, (0, 0), 3)
        img *= (1.0 - view.shadow * (sh.astype(np.float32) / 255.0))[..., None]

    # occluders until the main facade is covered as asked
    occ = np.zeros((h, w), np.uint8)
    facade_px = main_alpha > 0.5
    n_facade = max(1, int(facade_px.sum()))
    occluded = 0.0
    if view.occlusion > 0:
        for _ in range(14):
            _occluder(img, occ, rng, w, h, ground_y)
            occluded = float(np.count_nonzero(facade_px & (occ > 0))) / n_facade
            if occluded >= view.occlusion:
                break
    elif view.clutter and rng.random() < 0.3:  # a street object low in the frame
        _occluder(img, occ, rng, w, h, max(ground_y, 0.9 * h))
        occluded = float(np.count_nonzero(facade_px & (occ > 0))) / n_facade

    # light and colour
    img *= np.asarray(view.cast, np.float32) * view.light
    if view.night:
        img = img**1.3
    if view.blur > 0.05:
        img = cv2.GaussianBlur(img, (0, 0), view.blur)
    if view.noise > 0:
        img += (view.noise / 255.0) * _noise(rng, h, w)
    out = np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return Rendered(out, hom, occ, occluded)


def visible_fraction(
    rendered: Rendered,
    rect: tuple[float, float, float, float],
    image_size: tuple[int, int],
    n: int = 24,
) -> float:
    """Share of a facade rectangle (level-0 facade pixels) that the image shows unoccluded.

    A point counts when it is in front of the camera, inside the frame and not behind an
    occluder; an ``n x n`` grid of points over the rectangle is tested.
    """
    w, h = image_size
    x1, y1, x2, y2 = rect
    us, vs = np.meshgrid(np.linspace(x1, x2, n), np.linspace(y1, y2, n))
    pts, front = project(rendered.hom, np.column_stack([us.ravel(), vs.ravel()]))
    inside = (
        front & (pts[:, 0] >= 0) & (pts[:, 0] <= w - 1) & (pts[:, 1] >= 0) & (pts[:, 1] <= h - 1)
    )
    xi = np.clip(np.round(pts[:, 0]).astype(np.int64), 0, w - 1)
    yi = np.clip(np.round(pts[:, 1]).astype(np.int64), 0, h - 1)
    seen = inside & (rendered.occluders[yi, xi] == 0)
    return float(seen.mean())
