"""``oxbench view``: a static HTML viewer of a run's ranked lists (one run, or two side by side).

``build_viewer(run, out)`` writes ``out/index.html`` and ``out/thumbs/``; the page works offline
from that folder (``file://``, no server, no network fonts or scripts: the CSS and JS are inline).

Per query it shows the query image with its box drawn, and for each run the top results as
thumbnails bordered by their label colour (easy / hard / junk / negative; positive for the other
protocols) with rank, label and score. Results with spatially verified matches (``matches.json``)
are marked; clicking one draws the inlier correspondences between the two images. The query list
can be limited to a setup's queries (those with positives there) and sorted worst first (or, with
two runs, by the largest change).

Names are never written into HTML markup: the page's data is one JSON block in which ``<``, ``>``
and ``&`` are escaped as ``\\u003c``..., and the script shows names with ``textContent``, so an image
called ``<script>alert(1)</script>`` is text. Images whose path is ``null`` (generated distractors)
or cannot be read get a placeholder (a missing file is logged and counted, not fatal: the viewer
never changes a number).

Thumbnails are made once with Pillow and cached in ``thumbs/``, keyed by the source path, its
modification time and size, and the thumbnail size: a second build reuses them.

The viewer reads only images under the folders its caller gives (``roots``: the data root of the
``view`` command, ``--root`` or ``$OXBENCH_DATA`` or the per-user default) and the run folders
themselves, after resolving links -- never folders named by the record it shows (a record saying
``"root": "/"`` must not open ``/``) -- and only regular files of at most
:data:`MAX_IMAGE_BYTES` within the pixel budget (:mod:`oxbench.imaging`), decoded with Pillow's draft
mode at about the thumbnail size. Any other path in ``retrieved.json`` (a private image elsewhere,
``/etc/passwd``, ``/proc/self/environ``, a FIFO) gets a placeholder and is never opened.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oxbench.errors import InputError, require
from oxbench.fileio import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_input_bytes,
)
from oxbench.imaging import open_image
from oxbench.report.runs import RunRecord, check_comparable

log = logging.getLogger(__name__)

LABEL_COLOURS = {
    "easy": "#2ca02c",
    "positive": "#2ca02c",
    "hard": "#ff7f0e",
    "junk": "#9a9a9a",
    "negative": "#d62728",
}
_MANIFEST = "index.json"
#: Largest image file the viewer opens.
MAX_IMAGE_BYTES = 256 << 20


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


@dataclass
class ThumbnailCache:
    """Thumbnails of source images in ``folder``, made once (Pillow) and reused.

    The key of a thumbnail is the sha256 of the source's absolute path, ``st_mtime_ns``, size in
    bytes, and the thumbnail size, so an edited image gets a new thumbnail. ``folder/index.json``
    keeps the source's pixel size per key (boxes and matches are in source pixels).

    Attributes:
        folder: where the thumbnails go.
        roots: the only folders images are read from (the run's recorded image folders); a source
            that resolves outside them is not opened.
        made, reused, unreadable: counters of this session.
        outside: sources refused because they resolve outside ``roots`` or are not regular files.
    """

    folder: Path
    roots: tuple[Path, ...] = ()
    made: int = 0
    reused: int = 0
    unreadable: int = 0
    outside: int = 0
    _sizes: dict[str, list[int]] = field(default_factory=dict)
    _dirty: bool = False
    _refused: set[str] = field(
        default_factory=set
    )  # sources already refused: counted and named once

    def __post_init__(self) -> None:
        manifest = self.folder / _MANIFEST
        if manifest.is_file():
            try:
                data = json.loads(read_input_bytes(manifest, limit=64 << 20))
                if isinstance(data, dict):
                    self._sizes = {
                        k: v
                        for k, v in data.items()
                        if isinstance(v, list)
                        and len(v) == 2
                        and all(isinstance(x, int) for x in v)
                    }
            except (InputError, ValueError, RecursionError):
                log.warning("%s: unreadable thumbnail index; thumbnails will be remade", manifest)

    def get(self, source: str | None, size: int) -> dict[str, Any] | None:
        """``{"src": "thumbs/<key>.jpg", "w": source width, "h": source height}``, or ``None`` for
        no image (``source`` is ``None``, missing or unreadable)."""
        if source is None or source in self._refused:
            return None
        self._refused.add(source)  # until it succeeds below
        # resolve links first (no file is opened), then allow only regular files under the roots
        real = os.path.realpath(source)
        if not _inside(real, [os.path.realpath(r) for r in self.roots]):
            self.outside += 1
            log.debug("image outside the run's image folders, not shown: %s", source)
            return None
        path = Path(real)
        try:
            st = os.stat(path)
        except OSError:
            self.unreadable += 1
            log.warning("image not found: %s (placeholder shown)", source)
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_IMAGE_BYTES:
            self.outside += 1
            log.warning(
                "not a regular image file of at most %d MB: %s (placeholder shown)",
                MAX_IMAGE_BYTES >> 20,
                source,
            )
            return None
        key = hashlib.sha256(
            f"{path}\0{st.st_mtime_ns}\0{st.st_size}\0{size}".encode()
        ).hexdigest()[:24]
        thumb = self.folder / f"{key}.jpg"
        if key in self._sizes and thumb.is_file():
            self.reused += 1
        else:
            require("PIL.Image", "images")
            try:
                with open_image(path) as im:  # refuses an image over the pixel budget unread
                    w, h = im.size
                    im.draft("RGB", (size, size))  # JPEG: decode at about the thumbnail size
                    small = im.convert("RGB")
                    small.thumbnail((size, size))
                    buf = io.BytesIO()
                    small.save(buf, format="JPEG", quality=82)
            except (OSError, ValueError, SyntaxError) as exc:
                self.unreadable += 1
                reason = (
                    exc.problem if isinstance(exc, InputError) else " ".join(str(exc).split())[:200]
                )
                log.warning("unreadable image %s (%s): placeholder shown", source, reason)
                return None
            atomic_write_bytes(thumb, buf.getvalue())
            self._sizes[key] = [int(w), int(h)]
            self._dirty = True
            self.made += 1
        self._refused.discard(source)
        w, h = self._sizes[key]
        return {"src": f"{self.folder.name}/{thumb.name}", "w": w, "h": h}

    def save(self) -> None:
        """Write the size index if thumbnails were added."""
        if self._dirty:
            atomic_write_json(self.folder / _MANIFEST, self._sizes, indent=None)
            self._dirty = False


def _run_data(run: RunRecord, cache: ThumbnailCache, top: int, size: int) -> dict[str, Any]:
    matches = run.matches() or {}
    lists = []
    for q in run.queries:
        entries = []
        for t in q.top[:top]:
            idx = int(t["index"])
            m = matches.get(q.index, {}).get(idx)
            entries.append(
                {
                    "rank": t["rank"],
                    "index": idx,
                    "name": t["name"],
                    "label": t["label"],
                    "score": t.get("score"),
                    "thumb": cache.get(t.get("image"), size),
                    "matches": m,
                }
            )
        lists.append(entries)
    return {
        "method": run.method,
        "label": run.label,
        "run_id": run.run_id,
        "path": str(run.path),
        "k": run.k,
        "ap": {s: [None if v != v else float(v) for v in run.per_query(s)] for s in run.setups},
        "map": {s: run.mean(s) for s in run.setups},
        "lists": lists,
        "has_matches": bool(matches),
    }


def viewer_data(
    runs: Sequence[RunRecord],
    cache: ThumbnailCache,
    *,
    top: int = 20,
    thumb_size: int = 160,
    query_size: int = 400,
) -> dict[str, Any]:
    """The JSON object the page renders (thumbnails are made on the way)."""
    base = runs[0]
    return {
        "dataset": base.dataset_id,
        "n_distractors": base.n_distractors,
        "protocol": base.protocol,
        "setups": list(base.setups),
        "default_setup": "medium" if "medium" in base.setups else base.setups[0],
        "labels": list(base.labels),
        "colours": {lab: LABEL_COLOURS.get(lab, "#999999") for lab in base.labels},
        "queries": [
            {
                "name": q.name,
                "bbox": None if q.bbox is None else list(q.bbox),
                "thumb": cache.get(q.image, query_size),
                "n_labelled": dict(q.n_labelled),
            }
            for q in base.queries
        ],
        "runs": [_run_data(r, cache, top, thumb_size) for r in runs],
    }


def _script_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``<``, ``>``, ``&`` or line separators appear raw."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    for ch, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text


def build_viewer(
    run: RunRecord,
    out: str | Path,
    *,
    other: RunRecord | None = None,
    top: int = 20,
    thumb_size: int = 160,
    query_size: int = 400,
    roots: Sequence[str | Path] = (),
) -> tuple[Path, ThumbnailCache]:
    """Write ``out/index.html`` and ``out/thumbs/`` for ``run`` (and ``other`` side by side).

    Args:
        run: the run (its queries fill the list).
        out: the output folder.
        other: a second run on the same queries, shown beside the first.
        roots: the folders images may be read from (with the run folders themselves); what the
            runs record is never trusted for this.
        top: results shown per query (at most the run's stored k).
        thumb_size: longest side of result thumbnails, in pixels.
        query_size: longest side of the query image.

    Returns:
        ``(path of index.html, the thumbnail cache with its counters)``.

    Raises:
        InputError: two runs on different datasets, ground truth or queries; bad sizes.
        MissingExtraError: Pillow is missing and there are images to show.
    """
    if top < 1 or thumb_size < 16 or query_size < 16:
        raise InputError(
            f"--top must be >= 1 and thumbnail sizes >= 16 (got {top}, {thumb_size}, {query_size})"
        )
    runs = [run] if other is None else [run, other]
    if other is not None:
        check_comparable(runs)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError("the viewer writes a folder; this path is a file", out)
    allowed = tuple(dict.fromkeys([*(Path(r) for r in roots), *(r.path for r in runs)]))
    cache = ThumbnailCache(out / "thumbs", roots=allowed)
    data = viewer_data(runs, cache, top=top, thumb_size=thumb_size, query_size=query_size)
    cache.save()
    if cache.outside:
        recorded = [
            str(p)
            for r in runs
            for p in r.image_roots
            if not _inside(os.path.realpath(p), [os.path.realpath(a) for a in allowed])
        ]
        hint = (
            f"; the run read its images from {', '.join(dict.fromkeys(recorded))}: give that "
            "folder as --root to show them"
            if recorded
            else ""
        )
        log.warning(
            "%d image paths of the run are not regular files under the folders given (%s) and were "
            "not opened: placeholders shown%s",
            cache.outside,
            ", ".join(map(str, roots)) or "none",
            hint,
        )
    title = " vs ".join(f"{r.label} {r.run_id}" for r in runs) + f" on {run.dataset_id}"
    page = _PAGE.replace("@TITLE@", html.escape(title)).replace("@CSS@", _CSS).replace("@JS@", _JS)
    page = page.replace("@DATA@", _script_json(data))
    index = atomic_write_text(out / "index.html", page)
    log.info(
        "viewer: %s (%d thumbnails made, %d reused, %d images unreadable)",
        index,
        cache.made,
        cache.reused,
        cache.unreadable,
    )
    return index, cache


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>@TITLE@</title>
<style>@CSS@</style>
</head><body>
<aside id="side">
 <h1 id="title"></h1>
 <label>setup <select id="setup"></select></label>
 <label>order <select id="order"></select></label>
 <p id="count"></p>
 <ol id="queries"></ol>
</aside>
<main id="main"></main>
<div id="overlay" hidden><div id="overlay-box"><button id="close" type="button">close</button>
<p id="overlay-title"></p><div id="overlay-body"></div></div></div>
<script type="application/json" id="data">@DATA@</script>
<script>@JS@</script>
</body></html>
"""

_CSS = """
body{margin:0;font:13px/1.35 system-ui,sans-serif;display:flex;height:100vh;color:#222}
#side{width:260px;overflow:auto;border-right:1px solid #ccc;padding:8px;box-sizing:border-box;flex:none}
#side h1{font-size:14px;margin:0 0 6px}#side label{display:block;margin:4px 0}
#queries{list-style:none;padding:0;margin:0}
.q{display:flex;justify-content:space-between;gap:6px;padding:3px 4px;cursor:pointer;border-radius:3px}
.q:hover{background:#eef}.q.sel{background:#dde3ff}.q .ap{font-variant-numeric:tabular-nums;color:#555}
#main{flex:1;overflow:auto;padding:10px}
.qhead{display:flex;gap:14px;align-items:flex-start;margin-bottom:10px}
.qimg{position:relative;display:inline-block}.qimg img{display:block}
.qimg svg{position:absolute;left:0;top:0}
.cols{display:flex;gap:14px;align-items:flex-start}.col{flex:1;min-width:0}
.col h2{font-size:13px;margin:4px 0}
.grid{display:flex;flex-wrap:wrap;gap:6px}
.res{width:var(--w);border:4px solid #999;border-radius:3px;padding:2px;box-sizing:content-box;background:#fafafa}
.res img,.res .ph{width:100%;height:var(--h);object-fit:contain;display:block;background:#eee}
.ph{display:flex!important;align-items:center;justify-content:center;color:#777;font-size:11px}
.cap{font-size:11px;display:flex;justify-content:space-between}.nm{font-size:11px;overflow-wrap:anywhere}
.res.m{cursor:pointer;outline:2px dashed #36c}.legend span{display:inline-block;margin-right:8px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:middle}
#overlay{position:fixed;inset:0;background:rgba(0,0,0,.55);display:flex;align-items:center;justify-content:center}
#overlay[hidden]{display:none}.summary td,.summary th{padding:2px 8px;text-align:left}#overlay-box{background:#fff;padding:10px;max-width:95vw;max-height:95vh;overflow:auto}
"""

_JS = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; };
const SVG = "http://www.w3.org/2000/svg";
const svgEl = (tag, attrs) => { const e = document.createElementNS(SVG, tag);
  for (const k in attrs) e.setAttribute(k, String(attrs[k])); return e; };
const pct = (v) => (v === null || v === undefined) ? "-" : (100 * v).toFixed(2);
let current = null;

function init() {
  $("title").textContent = D.dataset + (D.n_distractors ? " +" + D.n_distractors + " distractors" : "") +
    ": " + D.runs.map((r) => r.label).join(" vs ");
  for (const s of D.setups) { const o = el("option", "", s); o.value = s; $("setup").appendChild(o); }
  $("setup").value = D.default_setup;
  const orders = [["index", "query order"], ["worst0", "worst first" + (D.runs.length > 1 ? " (A)" : "")]];
  if (D.runs.length > 1) { orders.push(["worst1", "worst first (B)"], ["change", "largest change (B - A)"]); }
  for (const [v, t] of orders) { const o = el("option", "", t); o.value = v; $("order").appendChild(o); }
  $("setup").addEventListener("change", () => { renderList(); if (current !== null) show(current); });
  $("order").addEventListener("change", renderList);
  $("close").addEventListener("click", () => { $("overlay").hidden = true; });
  $("overlay").addEventListener("click", (ev) => { if (ev.target === $("overlay")) $("overlay").hidden = true; });
  renderList();
  // "#q=N" (0-based query index) opens that query: links to one query can be shared
  const m = /^#q=(\d+)$/.exec(location.hash);
  if (m && Number(m[1]) < D.queries.length) show(Number(m[1])); else summary();
}

// the first pane: what each run is and its mAP per setup, before any query is picked
function summary() {
  const main = $("main");
  main.replaceChildren();
  main.appendChild(el("h2", "", "Run summary"));
  const table = el("table", "summary");
  const head = el("tr");
  for (const h of ["", "label", "method", "run"].concat(D.setups.map((s) => "mAP " + s))) head.appendChild(el("th", "", h));
  table.appendChild(head);
  D.runs.forEach((r, ri) => {
    const tr = el("tr");
    for (const v of [D.runs.length > 1 ? "ABCD"[ri] : "", r.label, r.method, r.run_id].concat(D.setups.map((s) => pct(r.map[s])))) {
      tr.appendChild(el("td", "", v));
    }
    table.appendChild(tr);
  });
  main.appendChild(table);
  main.appendChild(el("p", "hint", "Pick a query on the left to see its ranked list."));
}

function renderList() {
  const setup = $("setup").value, order = $("order").value;
  const ap = D.runs.map((r) => r.ap[setup]);
  let idx = D.queries.map((_, i) => i).filter((i) => ap[0][i] !== null);
  const key = { worst0: (i) => ap[0][i], worst1: (i) => ap[1][i], change: (i) => -Math.abs(ap[1][i] - ap[0][i]) }[order];
  if (key) idx.sort((a, b) => key(a) - key(b) || a - b);
  const list = $("queries");
  list.replaceChildren();
  for (const i of idx) {
    const li = el("li", "q" + (i === current ? " sel" : ""));
    li.dataset.index = String(i);
    li.appendChild(el("span", "qn", D.queries[i].name));
    li.appendChild(el("span", "ap", ap.map((a) => pct(a[i])).join(" / ")));
    li.addEventListener("click", () => show(i));
    list.appendChild(li);
  }
  $("count").textContent = idx.length + " of " + D.queries.length + " queries (" + setup + ")";
}

function image(thumb, w, h, alt) {
  if (!thumb) { const p = el("div", "ph", "no image"); p.style.height = h + "px"; return p; }
  const img = el("img"); img.src = thumb.src; img.alt = alt; img.loading = "lazy"; return img;
}

function show(i) {
  current = i;
  if (location.hash !== "#q=" + i) history.replaceState(null, "", "#q=" + i);
  for (const li of document.querySelectorAll(".q")) li.classList.toggle("sel", li.dataset.index === String(i));
  const q = D.queries[i], setup = $("setup").value, main = $("main");
  main.replaceChildren();
  const head = el("div", "qhead");
  const box = el("div", "qimg");
  box.appendChild(image(q.thumb, 400, 300, q.name));
  if (q.thumb && q.bbox) {
    const img = box.firstChild;
    const draw = () => {
      const s = svgEl("svg", { width: img.width, height: img.height, viewBox: "0 0 " + q.thumb.w + " " + q.thumb.h });
      const [x1, y1, x2, y2] = q.bbox;
      s.appendChild(svgEl("rect", { x: x1, y: y1, width: x2 - x1, height: y2 - y1, fill: "none", stroke: "#ff0",
        "stroke-width": Math.max(2, q.thumb.w / 150) }));
      box.appendChild(s);
    };
    if (img.complete) draw(); else img.addEventListener("load", draw);
  }
  head.appendChild(box);
  const info = el("div", "qinfo");
  info.appendChild(el("h2", "", q.name));
  info.appendChild(el("p", "", "setup " + setup + ": AP " + D.runs.map((r) => r.label + " " + pct(r.ap[setup][i])).join(", ")));
  info.appendChild(el("p", "", "labelled: " + Object.entries(q.n_labelled).map(([k, v]) => k + " " + v).join(", ")));
  const legend = el("p", "legend");
  for (const lab of D.labels) { const s = el("span"); const sw = el("i"); sw.style.background = D.colours[lab];
    s.appendChild(sw); s.appendChild(document.createTextNode(lab)); legend.appendChild(s); }
  info.appendChild(legend);
  head.appendChild(info);
  main.appendChild(head);
  const cols = el("div", "cols");
  D.runs.forEach((r, ri) => {
    const col = el("section", "col");
    col.appendChild(el("h2", "", (D.runs.length > 1 ? "ABCD"[ri] + ": " : "") + r.label + " (" + r.run_id +
      ") mAP " + pct(r.map[setup])));
    const grid = el("div", "grid");
    grid.dataset.run = String(ri);
    for (const t of r.lists[i]) {
      const fig = el("figure", "res" + (t.matches ? " m" : ""));
      fig.style.margin = "0";
      fig.style.borderColor = D.colours[t.label] || "#999";
      fig.style.setProperty("--w", "120px"); fig.style.setProperty("--h", "90px");
      fig.appendChild(image(t.thumb, 120, 90, t.name));
      const cap = el("figcaption", "cap");
      cap.appendChild(el("span", "", "#" + t.rank + " " + t.label));
      cap.appendChild(el("span", "", t.score === null ? "" : Number(t.score).toFixed(3)));
      fig.appendChild(cap);
      fig.appendChild(el("div", "nm", t.name));
      if (t.matches) { fig.title = t.matches.length + " verified matches: click"; fig.addEventListener("click", () => showMatches(q, t)); }
      grid.appendChild(fig);
    }
    col.appendChild(grid);
    cols.appendChild(col);
  });
  main.appendChild(cols);
}

function showMatches(q, t) {
  const body = $("overlay-body");
  body.replaceChildren();
  $("overlay-title").textContent = q.name + " \u2194 " + t.name + ": " + t.matches.length + " inliers";
  const H = 360, qa = q.thumb, da = t.thumb;
  const qw = qa ? qa.w * H / qa.h : H, dw = da ? da.w * H / da.h : H;
  const s = svgEl("svg", { width: qw + dw + 10, height: H });
  const put = (th, x, w) => { if (th) s.appendChild(svgEl("image", { href: th.src, x: x, y: 0, width: w, height: H }));
    else s.appendChild(svgEl("rect", { x: x, y: 0, width: w, height: H, fill: "#eee" })); };
  put(qa, 0, qw); put(da, qw + 10, dw);
  const sq = qa ? H / qa.h : 1, sd = da ? H / da.h : 1;
  for (const [xq, yq, xd, yd] of t.matches) {
    s.appendChild(svgEl("line", { x1: xq * sq, y1: yq * sq, x2: qw + 10 + xd * sd, y2: yd * sd, stroke: "#0f0",
      "stroke-width": 1, "stroke-opacity": 0.8 }));
  }
  body.appendChild(s);
  $("overlay").hidden = false;
}

init();
"""
