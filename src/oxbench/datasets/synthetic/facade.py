"""Planar building facades: a city's shared style and each building's own identity.

A *city* fixes the architectural vocabulary: wall palette, window designs, cornice profile,
brick size, lettering. Every building of the city draws from it, so windows, cornices and brick
look alike across buildings (other buildings are genuinely confusable, as in Oxford). A building
adds its own identity: proportions, bay and floor counts, material and colour, roof line, and --
for landmarks -- unique details (signs with lettering, clocks, crests, rose windows, niches,
banners) that a local-feature matcher can latch on to.

:func:`render_facade` returns an RGBA texture (alpha 0 above the roof line) in facade pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.synthetic.rand import rng_for
from oxbench.errors import require

Color = tuple[float, float, float]

_SYLLABLES = (
    "AR", "BEL", "CON", "DOR", "EST", "FAL", "GRA", "HOL", "IN", "KEN", "LOR", "MAR", "NOR",
    "OX", "PEN", "QUI", "ROS", "SAL", "TOR", "VAL", "WIN", "AL", "BRI", "CAS", "DUN", "EL",
    "FOR", "GUS", "HAM", "IVY", "JO", "KIR", "LEY", "MON", "NET", "OLD", "PAR", "RIV", "STO",
)  # fmt: skip


def _cv2():  # noqa: ANN202 - returns a module
    return require("cv2", "classic")


@dataclass(frozen=True)
class WindowStyle:
    """One window design of a city (shared by all its buildings)."""

    aspect: float  # height / width
    top: str  # flat | round | pointed | segment
    panes: tuple[int, int]  # columns, rows of glazing bars
    frame: float  # frame thickness as a fraction of the width
    pediment: str  # none | tri | seg | lintel
    sill: bool


@dataclass(frozen=True)
class CityStyle:
    """The architectural vocabulary shared by every building of one city."""

    walls: tuple[Color, ...]
    trims: tuple[Color, ...]
    glass: tuple[Color, ...]
    accents: tuple[Color, ...]
    windows: tuple[WindowStyle, ...]
    materials: tuple[str, ...]
    brick: tuple[float, float]  # brick width, height as fractions of a bay width
    cornice: tuple[tuple[float, float], ...]  # (height as fraction of bay, shade) bands
    dentils: bool
    font: int


def _hsv(h: float, s: float, v: float) -> Color:
    import colorsys

    r, g, b = colorsys.hsv_to_rgb(h % 1.0, min(max(s, 0.0), 1.0), min(max(v, 0.0), 1.0))
    return (r, g, b)


@lru_cache(maxsize=8)
def city_style(city_seed: int) -> CityStyle:
    """The style of a city, derived from its seed only."""
    rng = rng_for(city_seed, "style")
    # Mostly earthy stone and brick hues; now and then a painted city.
    hue = rng.uniform(0.0, 0.13) if rng.random() < 0.8 else rng.uniform(0, 1)
    walls = tuple(
        _hsv(hue + rng.normal(0, 0.04), rng.uniform(0.12, 0.45), rng.uniform(0.5, 0.88))
        for _ in range(5)
    )
    trims = tuple(
        _hsv(rng.uniform(0, 1), rng.uniform(0.0, 0.25), rng.uniform(0.75, 0.97)) for _ in range(3)
    )
    glass = tuple(
        _hsv(rng.uniform(0.5, 0.7), rng.uniform(0.2, 0.5), rng.uniform(0.12, 0.35))
        for _ in range(3)
    )
    accents = tuple(
        _hsv(rng.uniform(0, 1), rng.uniform(0.5, 0.9), rng.uniform(0.35, 0.85)) for _ in range(6)
    )
    windows = tuple(
        WindowStyle(
            aspect=float(rng.uniform(1.3, 2.1)),
            top=str(rng.choice(["flat", "round", "pointed", "segment"])),
            panes=(int(rng.integers(1, 4)), int(rng.integers(2, 5))),
            frame=float(rng.uniform(0.06, 0.12)),
            pediment=str(rng.choice(["none", "tri", "seg", "lintel"])),
            sill=bool(rng.random() < 0.7),
        )
        for _ in range(4)
    )
    materials = tuple(rng.permutation(["brick", "ashlar", "plaster"]).tolist())
    brick = (float(rng.uniform(0.09, 0.14)), float(rng.uniform(0.035, 0.05)))
    cornice = tuple(
        (float(rng.uniform(0.02, 0.06)), float(rng.uniform(0.55, 1.25)))
        for _ in range(int(rng.integers(3, 6)))
    )
    font = int(rng.choice([0, 2, 3, 4]))  # Hershey simplex / duplex / complex / triplex
    return CityStyle(
        walls,
        trims,
        glass,
        accents,
        windows,
        materials,
        brick,
        cornice,
        bool(rng.random() < 0.6),
        font,
    )


def _lowfreq(rng: np.random.Generator, h: int, w: int, cell: int) -> NDArray[np.float32]:
    cv2 = _cv2()
    gh, gw = max(2, h // cell + 2), max(2, w // cell + 2)
    grid = rng.standard_normal((gh, gw)).astype(np.float32)
    return cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)


def _material(
    rng: np.random.Generator, kind: str, h: int, w: int, base: Color, bay: float, style: CityStyle
) -> NDArray[np.float32]:
    """Wall texture, float32 RGB in [0, 1]."""
    base_arr = np.asarray(base, dtype=np.float32)
    img = np.empty((h, w, 3), dtype=np.float32)
    img[:] = base_arr
    if kind in ("brick", "ashlar"):
        bw = max(6, int(style.brick[0] * bay * (1.0 if kind == "brick" else 2.6)))
        bh = max(3, int(style.brick[1] * bay * (1.0 if kind == "brick" else 2.4)))
        n_rows, n_cols = h // bh + 1, w // bw + 2
        jitter = rng.normal(0.0, 0.03 if kind == "brick" else 0.02, (n_rows, n_cols, 3)).astype(
            np.float32
        )
        jitter += rng.normal(0.0, 0.1 if kind == "brick" else 0.06, (n_rows, n_cols, 1)).astype(
            np.float32
        )
        mortar_w = max(1, bh // 6)
        mortar_col = np.asarray(style.trims[0], dtype=np.float32) * 0.85
        xx = np.arange(w)
        # one course of bricks at a time: the same row of bricks repeats over bh pixel rows
        for row in range(n_rows):
            y0, y1 = row * bh, min(h, (row + 1) * bh)
            if y0 >= h:
                break
            shift = (row % 2) * (bw // 2) if kind == "brick" else (row * 37 % bw)
            line = base_arr * (1.0 + jitter[row, (xx + shift) // bw])
            line[((xx + shift) % bw) < mortar_w] = mortar_col
            img[y0:y1] = line
            img[y0 : min(y1, y0 + mortar_w)] = mortar_col
    else:
        img *= 1.0 + 0.06 * _lowfreq(rng, h, w, max(8, int(bay * 0.3)))[..., None]
    img *= 1.0 + 0.035 * rng.standard_normal((h, w, 1), dtype=np.float32)
    return img


def _u8(c: Color, shade: float = 1.0) -> tuple[int, int, int]:
    return tuple(int(min(255, max(0, round(255 * v * shade)))) for v in c)  # type: ignore[return-value]


def _arch_poly(x0: int, y0: int, w: int, h: int, top: str) -> NDArray[np.int32]:
    """Outline of a window/door opening with the given top shape (closed polygon)."""
    pts: list[tuple[float, float]] = []
    if top == "flat":
        pts = [(x0, y0), (x0 + w, y0)]
    else:
        rise = w / 2 if top in ("round", "pointed") else w / 5
        n = 14
        for i in range(n + 1):
            t = i / n
            if top == "pointed":
                # two circular arcs meeting at the apex
                ang = np.pi * t
                x = x0 + w / 2 - (w / 2) * np.cos(ang)
                y = y0 + rise - rise * (np.sin(ang) ** 0.6)
            else:
                x = x0 + w * t
                y = y0 + rise - rise * np.sqrt(max(0.0, 1 - (2 * t - 1) ** 2))
            pts.append((x, y))
    pts += [(x0 + w, y0 + h), (x0, y0 + h)]
    return np.round(np.asarray(pts)).astype(np.int32)


def _window(
    img: NDArray[np.uint8],
    x0: int,
    y0: int,
    w: int,
    h: int,
    ws: WindowStyle,
    style: CityStyle,
    trim: Color,
    vr: np.random.Generator,
) -> None:
    """One window: frame, glass with reflection, glazing bars, optional blind/curtain, sill, pediment."""
    cv2 = _cv2()
    if w < 6 or h < 8:
        return
    fr = max(1, int(ws.frame * w))
    outer = _arch_poly(x0, y0, w, h, ws.top)
    cv2.fillPoly(img, [outer], _u8(trim), cv2.LINE_AA)
    inner = _arch_poly(x0 + fr, y0 + fr, w - 2 * fr, h - 2 * fr, ws.top)
    # ``vr`` draws the window's look from a small set of variants shared across the city, so that
    # the same window design looks the same on different buildings.
    glass = style.glass[int(vr.integers(len(style.glass)))]
    cv2.fillPoly(img, [inner], _u8(glass), cv2.LINE_AA)
    gx0, gy0, gw, gh = x0 + fr, y0 + fr, w - 2 * fr, h - 2 * fr
    # reflection: a slanted light band
    bx = gx0 + int(vr.uniform(0.0, 0.6) * gw)
    band = int(vr.uniform(0.15, 0.35) * gw) + 1
    refl = np.array(
        [[bx, gy0 + gh], [bx + band, gy0 + gh], [bx + band + gw // 2, gy0], [bx + gw // 2, gy0]],
        np.int32,
    )
    mask = np.zeros((h + 2, w + 2), np.uint8)
    cv2.fillPoly(mask, [inner - [x0 - 1, y0 - 1]], 255)
    band_mask = np.zeros_like(mask)
    cv2.fillPoly(band_mask, [refl - [x0 - 1, y0 - 1]], 255)
    sub = img[y0 - 1 : y0 + h + 1, x0 - 1 : x0 + w + 1]
    m = (mask > 0) & (band_mask > 0)
    if sub.shape[:2] == m.shape:
        sub[m] = np.minimum(255, sub[m].astype(np.int32) + 45).astype(np.uint8)
        kind = int(vr.integers(4))
        if kind == 1:  # blind pulled part way down
            drop = int(vr.uniform(0.2, 0.7) * gh)
            blind = np.zeros_like(mask)
            cv2.rectangle(blind, (0, 0), (w + 1, fr + drop), 255, -1)
            sel = (mask > 0) & (blind > 0)
            sub[sel] = _u8(style.trims[-1], 0.92)
            for yb in range(fr + 3, fr + drop, max(3, gh // 12)):
                cv2.line(sub, (fr, yb), (w - fr, yb), _u8(style.trims[-1], 0.7), 1)
        elif kind == 2:  # curtains at both sides
            cw = int(vr.uniform(0.15, 0.35) * gw)
            cur = np.zeros_like(mask)
            cv2.rectangle(cur, (0, 0), (fr + cw, h + 1), 255, -1)
            cv2.rectangle(cur, (w - fr - cw, 0), (w + 1, h + 1), 255, -1)
            sub[(mask > 0) & (cur > 0)] = _u8(
                style.accents[int(vr.integers(len(style.accents)))], 0.9
            )
    # glazing bars
    cols, rows = ws.panes
    bar = max(1, fr // 2)
    for i in range(1, cols):
        x = gx0 + gw * i // cols
        cv2.line(img, (x, gy0), (x, gy0 + gh), _u8(trim), bar)
    for j in range(1, rows):
        y = gy0 + gh * j // rows
        cv2.line(img, (gx0, y), (gx0 + gw, y), _u8(trim), bar)
    if ws.sill:
        cv2.rectangle(img, (x0 - fr, y0 + h), (x0 + w + fr, y0 + h + 2 * fr), _u8(trim, 1.05), -1)
        cv2.line(
            img, (x0 - fr, y0 + h + 2 * fr), (x0 + w + fr, y0 + h + 2 * fr), _u8(trim, 0.55), 1
        )
    if ws.pediment == "tri":
        apex = (x0 + w // 2, y0 - max(4, w // 3))
        pts = np.array([[x0 - 2 * fr, y0 - fr], [x0 + w + 2 * fr, y0 - fr], apex], np.int32)
        cv2.fillPoly(img, [pts], _u8(trim), cv2.LINE_AA)
        cv2.polylines(img, [pts], True, _u8(trim, 0.6), 1, cv2.LINE_AA)
    elif ws.pediment == "seg":
        cv2.ellipse(
            img,
            (x0 + w // 2, y0 - fr),
            (w // 2 + 2 * fr, max(3, w // 5)),
            0,
            180,
            360,
            _u8(trim),
            -1,
            cv2.LINE_AA,
        )
        cv2.ellipse(
            img,
            (x0 + w // 2, y0 - fr),
            (w // 2 + 2 * fr, max(3, w // 5)),
            0,
            180,
            360,
            _u8(trim, 0.6),
            1,
            cv2.LINE_AA,
        )
    elif ws.pediment == "lintel":
        cv2.rectangle(img, (x0 - fr, y0 - 3 * fr), (x0 + w + fr, y0 - fr), _u8(trim, 0.95), -1)
        cv2.rectangle(
            img, (x0 + w // 2 - fr, y0 - 3 * fr), (x0 + w // 2 + fr, y0 - fr), _u8(trim, 1.1), -1
        )


def _word(rng: np.random.Generator, n_syl: tuple[int, int] = (2, 4)) -> str:
    return "".join(rng.choice(_SYLLABLES, size=int(rng.integers(*n_syl))).tolist())


def _sign(
    img: NDArray[np.uint8],
    rng: np.random.Generator,
    x0: int,
    y0: int,
    w: int,
    h: int,
    style: CityStyle,
) -> None:
    """A lettered sign board: the strongest unique detail for local features."""
    cv2 = _cv2()
    bg = style.accents[int(rng.integers(len(style.accents)))]
    fg = (0.95, 0.92, 0.8) if sum(bg) < 1.6 else (0.08, 0.08, 0.1)
    cv2.rectangle(img, (x0, y0), (x0 + w, y0 + h), _u8(bg), -1)
    cv2.rectangle(img, (x0, y0), (x0 + w, y0 + h), _u8(fg, 0.9), max(1, h // 12))
    text = _word(rng)
    if rng.random() < 0.5:
        text += f" {int(rng.integers(1600, 1950))}"
    (tw, th), _ = cv2.getTextSize(text, style.font, 1.0, 2)
    scale = min((w * 0.9) / tw, (h * 0.7) / th)
    thick = max(1, int(scale * 2))
    (tw, th), _ = cv2.getTextSize(text, style.font, scale, thick)
    cv2.putText(
        img,
        text,
        (x0 + (w - tw) // 2, y0 + (h + th) // 2),
        style.font,
        scale,
        _u8(fg),
        thick,
        cv2.LINE_AA,
    )


def _clock(
    img: NDArray[np.uint8], rng: np.random.Generator, cx: int, cy: int, r: int, style: CityStyle
) -> None:
    cv2 = _cv2()
    if r < 5:
        return
    rim = style.accents[int(rng.integers(len(style.accents)))]
    cv2.circle(img, (cx, cy), r + max(2, r // 6), _u8(rim), -1, cv2.LINE_AA)
    cv2.circle(img, (cx, cy), r, (238, 234, 220), -1, cv2.LINE_AA)
    for k in range(12):
        a = 2 * np.pi * k / 12
        p1 = (int(cx + 0.78 * r * np.sin(a)), int(cy - 0.78 * r * np.cos(a)))
        p2 = (int(cx + 0.95 * r * np.sin(a)), int(cy - 0.95 * r * np.cos(a)))
        cv2.line(img, p1, p2, (20, 20, 20), max(1, r // (10 if k % 3 == 0 else 18)), cv2.LINE_AA)
    for length, width in ((0.5, max(2, r // 9)), (0.8, max(1, r // 14))):
        a = rng.uniform(0, 2 * np.pi)
        cv2.line(
            img,
            (cx, cy),
            (int(cx + length * r * np.sin(a)), int(cy - length * r * np.cos(a))),
            (15, 15, 15),
            width,
            cv2.LINE_AA,
        )


def _crest(
    img: NDArray[np.uint8], rng: np.random.Generator, cx: int, cy: int, r: int, style: CityStyle
) -> None:
    """A heraldic shield with random quartering and a star: unique per landmark."""
    cv2 = _cv2()
    if r < 5:
        return
    c1, c2, c3 = (style.accents[int(i)] for i in rng.choice(len(style.accents), 3, replace=False))
    shield = np.array(
        [
            [cx - r, cy - r],
            [cx + r, cy - r],
            [cx + r, cy + r // 3],
            [cx, cy + r],
            [cx - r, cy + r // 3],
        ],
        np.int32,
    )
    cv2.fillPoly(img, [shield], _u8(c1), cv2.LINE_AA)
    if rng.random() < 0.5:
        cv2.fillPoly(
            img,
            [
                np.array(
                    [[cx, cy - r], [cx + r, cy - r], [cx + r, cy + r // 3], [cx, cy + r]], np.int32
                )
            ],
            _u8(c2),
            cv2.LINE_AA,
        )
    else:
        cv2.rectangle(img, (cx - r, cy - r), (cx + r, cy - r // 3), _u8(c2), -1)
    n = int(rng.integers(4, 8))
    ang = np.linspace(0, 2 * np.pi, 2 * n, endpoint=False) + rng.uniform(0, np.pi)
    rad = np.where(np.arange(2 * n) % 2 == 0, 0.45 * r, 0.2 * r)
    star = np.stack([cx + rad * np.cos(ang), cy + rad * np.sin(ang)], 1).astype(np.int32)
    cv2.fillPoly(img, [star], _u8(c3), cv2.LINE_AA)
    cv2.polylines(img, [shield], True, (30, 30, 30), max(1, r // 12), cv2.LINE_AA)


def _rose(
    img: NDArray[np.uint8],
    rng: np.random.Generator,
    cx: int,
    cy: int,
    r: int,
    style: CityStyle,
    trim: Color,
) -> None:
    cv2 = _cv2()
    if r < 6:
        return
    cv2.circle(img, (cx, cy), r + max(2, r // 8), _u8(trim), -1, cv2.LINE_AA)
    n = int(rng.integers(6, 13))
    for k in range(n):
        a0 = 360 * k / n
        col = (
            style.accents[int(rng.integers(len(style.accents)))]
            if rng.random() < 0.5
            else style.glass[0]
        )
        cv2.ellipse(img, (cx, cy), (r, r), a0, 0, 360 / n, _u8(col), -1, cv2.LINE_AA)
    for k in range(n):
        a = 2 * np.pi * k / n
        cv2.line(
            img,
            (cx, cy),
            (int(cx + r * np.cos(a)), int(cy + r * np.sin(a))),
            _u8(trim),
            max(1, r // 12),
            cv2.LINE_AA,
        )
    cv2.circle(img, (cx, cy), max(2, r // 4), _u8(trim), -1, cv2.LINE_AA)


def _niche(
    img: NDArray[np.uint8], rng: np.random.Generator, x0: int, y0: int, w: int, h: int, trim: Color
) -> None:
    """A round-headed niche with a statue silhouette."""
    cv2 = _cv2()
    cv2.fillPoly(img, [_arch_poly(x0, y0, w, h, "round")], _u8(trim, 0.45), cv2.LINE_AA)
    stone = _u8(trim, float(rng.uniform(0.85, 1.05)))
    cx = x0 + w // 2
    head = max(2, w // 7)
    cv2.circle(img, (cx, y0 + w // 2 + head), head, stone, -1, cv2.LINE_AA)
    body = np.array(
        [
            [cx - w // 4, y0 + h],
            [cx + w // 4, y0 + h],
            [cx + w // 6, y0 + w // 2 + 2 * head],
            [cx - w // 6, y0 + w // 2 + 2 * head],
        ],
        np.int32,
    )
    cv2.fillPoly(img, [body], stone, cv2.LINE_AA)
    arm = int(rng.uniform(-0.3, 0.3) * w)
    cv2.line(
        img,
        (cx, y0 + w // 2 + 3 * head),
        (cx + w // 3, y0 + w // 2 + 2 * head + arm),
        stone,
        max(1, w // 12),
        cv2.LINE_AA,
    )


def _banner(
    img: NDArray[np.uint8],
    rng: np.random.Generator,
    x0: int,
    y0: int,
    w: int,
    h: int,
    style: CityStyle,
) -> None:
    cv2 = _cv2()
    c1, c2 = (style.accents[int(i)] for i in rng.choice(len(style.accents), 2, replace=False))
    pts = np.array(
        [[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0 + w // 2, y0 + h - w // 2], [x0, y0 + h]],
        np.int32,
    )
    cv2.fillPoly(img, [pts], _u8(c1), cv2.LINE_AA)
    n = int(rng.integers(2, 5))
    for k in range(n):
        y = y0 + int((k + 0.5) * (h - w) / n)
        cv2.rectangle(img, (x0, y), (x0 + w, y + max(2, h // 20)), _u8(c2), -1)
    cv2.circle(img, (x0 + w // 2, y0 + h // 3), max(2, w // 4), _u8(c2), -1, cv2.LINE_AA)


def _cornice(
    img: NDArray[np.uint8],
    y: int,
    x0: int,
    x1: int,
    bay: float,
    style: CityStyle,
    trim: Color,
    dentils: bool,
) -> int:
    """A moulded horizontal band starting at row ``y``; returns its height."""
    cv2 = _cv2()
    yy = y
    for frac, shade in style.cornice:
        hh = max(1, int(frac * bay))
        cv2.rectangle(img, (x0, yy), (x1, yy + hh - 1), _u8(trim, shade), -1)
        yy += hh
    if dentils:
        dh = max(2, int(0.05 * bay))
        step = max(4, int(0.08 * bay))
        cv2.rectangle(img, (x0, yy), (x1, yy + dh), _u8(trim, 0.6), -1)
        for x in range(x0, x1, step):
            cv2.rectangle(img, (x, yy), (x + step // 2, yy + dh), _u8(trim, 1.0), -1)
        yy += dh + 1
    return yy - y


@dataclass(frozen=True)
class Facade:
    """A rendered facade texture.

    Attributes:
        rgba: ``H x W x 4`` uint8; alpha is 0 above the roof line.
        body_top: first row of the main wall (rows above hold only gables/towers).
        kind: ``landmark`` or ``generic``.
        index: the building's index within its kind.
    """

    rgba: NDArray[np.uint8]
    body_top: int
    kind: str
    index: int

    @property
    def width(self) -> int:
        return int(self.rgba.shape[1])

    @property
    def height(self) -> int:
        return int(self.rgba.shape[0])

    def mirrored(self) -> Facade:
        """The facade seen from its back/mirror side (left-right flipped)."""
        return Facade(
            np.ascontiguousarray(self.rgba[:, ::-1]), self.body_top, self.kind, self.index
        )


def render_facade(city_seed: int, kind: str, index: int, width: int) -> Facade:
    """Render building ``index`` of ``kind`` (``landmark`` or ``generic``) of a city.

    Args:
        city_seed: the city (see :attr:`SynthConfig.city_seed`).
        kind: landmarks get more bays, a distinctive roof and unique details.
        index: building number within its kind.
        width: texture width in pixels (the layout scales with it).

    Returns:
        The facade; its height follows from the building's proportions.
    """
    cv2 = _cv2()
    if kind not in ("landmark", "generic"):
        raise ValueError(f"unknown building kind {kind!r}")
    style = city_style(city_seed)
    rng = rng_for(city_seed, "building", kind, index)
    landmark = kind == "landmark"
    bays = int(rng.integers(5, 10)) if landmark else int(rng.integers(3, 7))
    margin = float(rng.uniform(0.2, 0.6))
    bay = width / (bays + 2 * margin)
    floors = int(rng.integers(2, 5)) if landmark else int(rng.integers(2, 6))
    floor_h = bay * float(rng.uniform(1.15, 1.55))
    ground_h = floor_h * float(rng.uniform(1.1, 1.45))
    parapet_h = bay * float(rng.uniform(0.2, 0.45))
    roof = (
        str(rng.choice(["gable", "tower", "dome", "parapet"]))
        if landmark
        else str(rng.choice(["parapet", "parapet", "gable", "flat"]))
    )
    extra = 0
    if roof == "gable":
        extra = int(bay * rng.uniform(1.2, 2.0))
    elif roof == "tower":
        extra = int(bay * rng.uniform(2.2, 3.2))
    elif roof == "dome":
        extra = int(bay * rng.uniform(1.6, 2.4))
    body_h = int(ground_h + floors * floor_h + parapet_h + bay * 0.3)
    height = body_h + extra
    wall_colour = style.walls[int(rng.integers(len(style.walls)))]
    wall_colour = tuple(float(np.clip(c * rng.uniform(0.9, 1.1), 0, 1)) for c in wall_colour)  # type: ignore[assignment]
    trim = style.trims[int(rng.integers(len(style.trims)))]
    material = style.materials[int(rng.choice(3, p=[0.5, 0.3, 0.2]))]

    wall = _material(rng, material, height, width, wall_colour, bay, style)
    # weathering: broad grime plus a few dark streaks
    wall *= (1.0 + 0.07 * _lowfreq(rng, height, width, max(8, int(bay * 0.7))))[..., None]
    img = np.clip(wall * 255.0, 0, 255).astype(np.uint8)
    alpha = np.zeros((height, width), np.uint8)
    alpha[extra:, :] = 255

    # roof line shapes above the body
    body_top = extra
    x_mid = width // 2
    if roof == "gable":
        gw = int(bay * rng.uniform(2.5, min(bays, 5.0)))
        pts = np.array(
            [
                [x_mid - gw // 2 - int(bay * 0.2), body_top + 1],
                [x_mid + gw // 2 + int(bay * 0.2), body_top + 1],
                [x_mid, 0],
            ],
            np.int32,
        )
        cv2.fillPoly(alpha, [pts], 255, cv2.LINE_AA)
        cv2.polylines(img, [pts], True, _u8(trim), max(2, int(bay * 0.06)), cv2.LINE_AA)
    elif roof == "tower":
        tw = int(bay * rng.uniform(1.2, 1.9))
        cv2.rectangle(
            alpha, (x_mid - tw // 2, int(bay * 0.6)), (x_mid + tw // 2, body_top + 1), 255, -1
        )
        spire = np.array(
            [
                [x_mid - tw // 2 - 2, int(bay * 0.6)],
                [x_mid + tw // 2 + 2, int(bay * 0.6)],
                [x_mid, 0],
            ],
            np.int32,
        )
        cv2.fillPoly(alpha, [spire], 255, cv2.LINE_AA)
        cv2.fillPoly(img, [spire], _u8(style.accents[0], 0.6), cv2.LINE_AA)
        for k in range(1, 4):
            y = int(bay * 0.6) + k * (body_top - int(bay * 0.6)) // 4
            cv2.line(
                img,
                (x_mid - tw // 2, y),
                (x_mid + tw // 2, y),
                _u8(trim, 0.9),
                max(1, int(bay * 0.04)),
            )
    elif roof == "dome":
        dw = int(bay * rng.uniform(2.0, min(bays, 4.0)))
        cv2.ellipse(
            alpha,
            (x_mid, body_top + 1),
            (dw // 2, extra - int(bay * 0.35)),
            0,
            180,
            360,
            255,
            -1,
            cv2.LINE_AA,
        )
        cv2.ellipse(
            img,
            (x_mid, body_top + 1),
            (dw // 2, extra - int(bay * 0.35)),
            0,
            180,
            360,
            _u8(style.accents[1], 0.7),
            -1,
            cv2.LINE_AA,
        )
        for k in range(-3, 4):
            cv2.ellipse(
                img,
                (x_mid, body_top + 1),
                (abs(k) * dw // 8 + 1, extra - int(bay * 0.35)),
                0,
                180,
                360,
                _u8(trim, 0.8),
                max(1, int(bay * 0.03)),
                cv2.LINE_AA,
            )
        cv2.rectangle(
            alpha, (x_mid - int(bay * 0.15), 0), (x_mid + int(bay * 0.15), int(bay * 0.4)), 255, -1
        )
        cv2.rectangle(
            img,
            (x_mid - int(bay * 0.15), 0),
            (x_mid + int(bay * 0.15), int(bay * 0.4)),
            _u8(trim),
            -1,
        )

    x0_body = int(margin * bay)
    # parapet / balustrade at the top of the body
    y = body_top
    ph = int(parapet_h)
    cv2.rectangle(img, (0, y), (width - 1, y + ph), _u8(trim, 0.95), -1)
    if roof in ("parapet", "dome") and ph > 6:
        step = max(4, int(bay * 0.12))
        for x in range(step, width - step, step):
            cv2.ellipse(
                img,
                (x, y + ph // 2),
                (max(1, step // 4), max(2, ph // 3)),
                0,
                0,
                360,
                _u8(trim, 0.7),
                -1,
                cv2.LINE_AA,
            )
    y += ph
    y += _cornice(img, y, 0, width - 1, bay, style, trim, style.dentils)

    pilasters = landmark and rng.random() < 0.7 or (not landmark and rng.random() < 0.3)
    win_styles = [style.windows[int(rng.integers(len(style.windows)))] for _ in range(floors)]
    variant_base = int(rng.integers(6))  # windows share one of a few city-wide looks
    for f in range(floors):
        ws = win_styles[f]
        fy = int(y + f * floor_h)
        w_w = int(bay * rng.uniform(0.42, 0.55)) if f == 0 else int(bay * 0.48)
        w_h = min(int(w_w * ws.aspect), int(floor_h * 0.68))
        for b in range(bays):
            bx = int(x0_body + b * bay)
            wx = bx + (int(bay) - w_w) // 2
            wy = fy + int((floor_h - w_h) * 0.55)
            variant = (variant_base + 7 * f + 3 * b + int(rng.integers(3))) % 6
            _window(img, wx, wy, w_w, w_h, ws, style, trim, rng_for(city_seed, "window", variant))
        if f < floors - 1 and rng.random() < 0.5:
            cv2.rectangle(
                img,
                (0, int(fy + floor_h) - max(1, int(bay * 0.04))),
                (width - 1, int(fy + floor_h)),
                _u8(trim, 0.9),
                -1,
            )
    y_ground = int(y + floors * floor_h)
    # a float (floor_h is fractional); summed in the original order so the pixels stay the same
    cornice_h = _cornice(img, y_ground, 0, width - 1, bay * 0.6, style, trim, False)
    ground_top = y + (cornice_h + floors * floor_h)
    if pilasters:
        pw = max(3, int(bay * 0.12))
        for b in range(bays + 1):
            px = int(x0_body + b * bay) - pw // 2
            cv2.rectangle(img, (px, body_top + ph), (px + pw, y_ground), _u8(trim, 0.97), -1)
            cv2.line(img, (px, body_top + ph), (px, y_ground), _u8(trim, 1.15), 1)
            cv2.line(img, (px + pw, body_top + ph), (px + pw, y_ground), _u8(trim, 0.55), 1)
            cv2.rectangle(
                img,
                (px - 2, body_top + ph),
                (px + pw + 2, body_top + ph + max(2, pw // 2)),
                _u8(trim, 0.8),
                -1,
            )

    # ground floor: a door (landmarks: an arched portal) and shop fronts or windows
    gy = int(ground_top) + 2
    gh = height - gy
    door_b = bays // 2 if landmark else int(rng.integers(bays))
    for b in range(bays):
        bx = int(x0_body + b * bay)
        if b == door_b:
            dw = int(bay * (0.7 if landmark else 0.5))
            dh = int(gh * 0.8)
            dx = bx + (int(bay) - dw) // 2
            dy = height - dh
            top = "round" if landmark else str(rng.choice(["flat", "round"]))
            cv2.fillPoly(
                img, [_arch_poly(dx - 3, dy - 3, dw + 6, dh + 3, top)], _u8(trim), cv2.LINE_AA
            )
            door_col = style.accents[int(rng.integers(len(style.accents)))]
            cv2.fillPoly(img, [_arch_poly(dx, dy, dw, dh, top)], _u8(door_col, 0.55), cv2.LINE_AA)
            for k in range(2):
                px0 = dx + dw * k // 2 + max(2, dw // 12)
                cv2.rectangle(
                    img,
                    (px0, dy + dh // 3),
                    (px0 + dw // 2 - 2 * max(2, dw // 12), height - max(3, dh // 10)),
                    _u8(door_col, 0.8),
                    max(1, dw // 30),
                )
        elif not landmark and rng.random() < 0.5:
            # shop front: big glass and a lettered fascia
            sx, sw = bx + int(bay * 0.06), int(bay * 0.88)
            fascia = max(6, int(gh * 0.18))
            _sign(img, rng, sx, gy + 2, sw, fascia, style)
            cv2.rectangle(
                img, (sx, gy + fascia + 4), (sx + sw, height - 1), _u8(style.glass[1]), -1
            )
            cv2.line(img, (sx + sw // 2, gy + fascia + 4), (sx + sw // 2, height - 1), _u8(trim), 2)
        else:
            ws = win_styles[0]
            w_w = int(bay * 0.5)
            w_h = min(int(w_w * ws.aspect), int(gh * 0.6))
            _window(
                img,
                bx + (int(bay) - w_w) // 2,
                gy + int((gh - w_h) * 0.4),
                w_w,
                w_h,
                ws,
                style,
                trim,
                rng_for(city_seed, "window", 6 + (variant_base + b) % 3),
            )
    # plinth
    cv2.rectangle(
        img, (0, height - max(3, int(bay * 0.12))), (width - 1, height - 1), _u8(trim, 0.7), -1
    )

    if landmark:
        # the landmark's unique details
        det = rng_for(city_seed, "details", index)
        band_y = gy - int(bay * 0.42)
        _sign(
            img,
            det,
            int(x0_body + bay * max(1, bays // 2 - 1)),
            max(body_top + ph, band_y),
            int(bay * min(3, bays - 2)),
            int(bay * 0.32),
            style,
        )
        r = int(bay * 0.42) if roof in ("gable", "tower") else int(bay * 0.3)
        if roof == "tower":
            _clock(img, det, x_mid, body_top - extra // 3, r, style)
        elif roof == "gable" and det.random() < 0.5:
            _rose(img, det, x_mid, body_top - extra // 3, r, style, trim)
        elif roof == "gable":
            _clock(img, det, x_mid, body_top - extra // 3, r, style)
        elif det.random() < 0.6:
            _clock(img, det, x_mid, body_top + ph + int(bay * 0.5), r, style)
        for side in (-1, 1):
            if det.random() < 0.6:
                cx = int(x_mid + side * bay * rng.uniform(1.0, bays / 2 - 0.3))
                _crest(img, det, cx, gy - int(bay * 0.9), max(5, int(bay * 0.22)), style)
        if det.random() < 0.5 and floors >= 2:
            nb = [0, bays - 1]
            for b in nb:
                bx = int(x0_body + b * bay)
                _niche(
                    img,
                    det,
                    bx + int(bay * 0.3),
                    int(y_ground - floor_h * 0.95),
                    int(bay * 0.4),
                    int(floor_h * 0.8),
                    trim,
                )
        if det.random() < 0.5:
            for b in det.choice(bays, size=min(2, bays), replace=False).tolist():
                bx = int(x0_body + b * bay)
                _banner(
                    img,
                    det,
                    bx + int(bay * 0.75),
                    body_top + ph + int(bay * 0.3),
                    max(4, int(bay * 0.18)),
                    int(floor_h * 1.1),
                    style,
                )
    elif rng.random() < 0.3:
        _crest(img, rng, x_mid, gy - int(bay * 0.5), max(4, int(bay * 0.15)), style)

    rgba = np.dstack([img, alpha])
    return Facade(rgba, body_top, kind, index)
