"""``oxbench view``: the static HTML viewer -- escaping, placeholders, the thumbnail cache, and a real
headless browser (Debian's chromium + chromedriver through selenium; skipped only when absent)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth
from oxbench.report.runs import RunRecord
from oxbench.report.viewer import build_viewer
from run_layout import better_ranks, random_ranks, tiny_gt, write_run

REPO = Path(__file__).resolve().parents[1]
HOSTILE_DB = "<script>alert(1)</script>"
HOSTILE_QUERY = '<img src=x onerror="alert(2)">&amp;'


def facade(path: Path, seed: int, size=(320, 240)) -> Path:
    """A synthetic-looking building photo: sky, a coloured facade, a grid of windows."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    w, h = size
    im = Image.new("RGB", size, (150, 190, 235))
    d = ImageDraw.Draw(im)
    hue = rng.integers(90, 220, 3)
    x0, y0 = int(rng.integers(10, 60)), int(rng.integers(20, 70))
    d.rectangle([x0, y0, w - x0, h], fill=tuple(int(v) for v in hue))
    d.polygon(
        [(x0 - 8, y0), (w // 2, y0 - 25), (w - x0 + 8, y0)], fill=tuple(int(v * 0.6) for v in hue)
    )
    for gx in range(x0 + 10, w - x0 - 20, 28):
        for gy in range(y0 + 12, h - 20, 34):
            d.rectangle([gx, gy, gx + 14, gy + 20], fill=(40, 50, 70))
    im.save(path, quality=85)
    return path


@pytest.fixture
def viewer_runs(tmp_path):
    base = tiny_gt(0, n_queries=10)
    queries = [
        dataclasses.replace(q, bbox=(60.0 + 3 * i, 40.0, 340.0, 290.0))
        for i, q in enumerate(base.queries)
    ]
    queries[1] = dataclasses.replace(queries[1], name=HOSTILE_QUERY)
    gt = GroundTruth(base.dataset, base.protocol, base.db_names, tuple(queries))
    db_names = list(gt.db_names)
    db_names[7] = HOSTILE_DB
    img = tmp_path / "img"
    img.mkdir()
    db_images = {i: str(facade(img / f"db{i}.jpg", i)) for i in range(gt.n_db)}
    db_images[3] = None  # generated distractor-like: no image
    db_images[4] = str(img / "missing.jpg")  # a path that does not exist
    q_images = {q: str(facade(img / f"q{q}.jpg", 100 + q, (400, 300))) for q in range(gt.n_queries)}
    ra, rb = random_ranks(gt, 1), better_ranks(gt, 1, 2)
    matches = {
        0: {
            int(rb[0, 0]): [
                [30.0, 40.0, 50.0, 60.0],
                [100.0, 120.0, 90.0, 100.0],
                [200, 150, 210, 160],
            ]
        }
    }
    common = {"db_images": db_images, "query_images": q_images, "db_names": db_names, "root": img}
    a = write_run(
        tmp_path / "runs",
        gt,
        ra,
        method="bow",
        scores=np.sort(np.random.default_rng(0).random(ra.shape))[:, ::-1],
        **common,
    )
    b = write_run(
        tmp_path / "runs", gt, rb, method="bow-sv-qe", config_name="b", matches=matches, **common
    )
    return gt, a, b, img


def page_data(index: Path) -> dict:
    text = index.read_text()
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_names_are_never_markup(viewer_runs, tmp_path):
    gt, a, b, _ = viewer_runs
    index, _ = build_viewer(
        RunRecord.load(a), tmp_path / "v", other=RunRecord.load(b), roots=[viewer_runs[3]]
    )
    text = index.read_text()
    assert HOSTILE_DB not in text and "<img src=x" not in text and "alert(1)</script>" not in text
    assert (
        "<script>" not in text.replace("<script>@", "").split('id="data">')[1].split("</script>")[0]
    )
    data = page_data(index)  # the escaped JSON decodes back to the exact names
    assert data["queries"][1]["name"] == HOSTILE_QUERY
    assert HOSTILE_DB in {t["name"] for lst in data["runs"][0]["lists"] for t in lst}
    assert (
        "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    )


def test_placeholders_cache_and_matches(viewer_runs, tmp_path):
    gt, a, b, img = viewer_runs
    out = tmp_path / "v"
    index, cache = build_viewer(
        RunRecord.load(a), out, other=RunRecord.load(b), top=30, roots=[img]
    )
    data = page_data(index)
    by_index = {t["index"]: t for lst in data["runs"][0]["lists"] for t in lst}
    assert by_index[3]["thumb"] is None and by_index[4]["thumb"] is None
    assert (
        by_index[0]["thumb"]["src"].startswith("thumbs/")
        and (out / by_index[0]["thumb"]["src"]).is_file()
    )
    assert (by_index[0]["thumb"]["w"], by_index[0]["thumb"]["h"]) == (320, 240)
    n_images = (gt.n_db - 2) + gt.n_queries
    assert cache.made == n_images and cache.unreadable > 0
    first = data["runs"][1]["lists"][0][0]
    assert first["matches"] and len(first["matches"]) == 3 and data["runs"][1]["has_matches"]
    _, again = build_viewer(RunRecord.load(a), out, other=RunRecord.load(b), top=30, roots=[img])
    assert again.made == 0 and again.reused > 0
    thumbs = sorted(p.name for p in (out / "thumbs").iterdir())
    os.utime(img / "db0.jpg", ns=(1, 1))  # a changed source gets a new thumbnail
    _, third = build_viewer(RunRecord.load(a), out, other=RunRecord.load(b), top=30, roots=[img])
    assert third.made == 1 and len(list((out / "thumbs").iterdir())) == len(thumbs) + 1


def test_view_cli_and_refusals(viewer_runs, tmp_path, capsys):
    gt, a, b, img = viewer_runs
    with pytest.raises(SystemExit) as exc:
        main(["view", str(a), "--out", str(tmp_path / "v"), "--top", "5", "--root", str(img)])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "index.html" in out and "thumbnails:" in out
    assert all(
        len(lst) == 5 for lst in page_data(tmp_path / "v" / "index.html")["runs"][0]["lists"]
    )
    other = tiny_gt(3, n_queries=10)
    c = write_run(tmp_path / "o", other, random_ranks(other, 1))
    with pytest.raises(InputError, match="ground truth differs"):
        build_viewer(RunRecord.load(a), tmp_path / "w", other=RunRecord.load(c))
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="this path is a file"):
        build_viewer(RunRecord.load(a), tmp_path / "file")


# -- the real browser --------------------------------------------------------------------------


def _browser():
    """(chromium, chromedriver) paths, or a skip with the reason."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    chrome = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )
    driver = shutil.which("chromedriver")
    if chrome is None or driver is None:
        pytest.skip(
            "no chromium/chromedriver found (Debian: apt-get install chromium chromium-driver)"
        )
    return chrome, driver


@pytest.fixture
def browser(tmp_path):
    chrome, driver_path = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chrome-profile'}",
        "--window-size=1280,860",
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def test_viewer_in_headless_chromium(viewer_runs, tmp_path, browser):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    gt, a, b, img = viewer_runs
    index, _ = build_viewer(
        RunRecord.load(a), tmp_path / "v", other=RunRecord.load(b), top=12, roots=[img]
    )
    browser.get(index.resolve().as_uri())
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#queries .q"))
    items = browser.find_elements(By.CSS_SELECTOR, "#queries .q")
    assert len(items) == gt.n_queries  # every query has positives in Medium
    assert browser.find_element(By.ID, "count").text.startswith(f"{gt.n_queries} of {gt.n_queries}")
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#queries .qn")]
    assert HOSTILE_QUERY in names  # shown as text

    # the first pane is the runs' summary: label, method, run id and mAP per setup (issue 24)
    assert browser.find_element(By.CSS_SELECTOR, "#main h2").text == "Run summary"
    cells = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in browser.find_elements(By.CSS_SELECTOR, "#main table.summary tr")[1:]
    ]
    ra_, rb_ = RunRecord.load(a), RunRecord.load(b)
    assert [c[1:4] for c in cells] == [[r.label, r.method, r.run_id] for r in (ra_, rb_)]
    assert cells[1][4:] == [f"{100 * rb_.mean(s):.2f}" for s in rb_.setups]

    # worst first: the list is sorted by run A's medium AP
    Select(browser.find_element(By.ID, "order")).select_by_value("worst0")
    ap_a = RunRecord.load(a).per_query("medium")
    first = browser.find_element(By.CSS_SELECTOR, "#queries .q").get_attribute("data-index")
    assert int(first) == int(np.argmin(ap_a))

    # clicking a query shows both runs' lists
    browser.find_element(By.CSS_SELECTOR, '#queries .q[data-index="0"]').click()
    grids = browser.find_elements(By.CSS_SELECTOR, ".grid")
    assert len(grids) == 2
    assert [len(g.find_elements(By.CSS_SELECTOR, ".res")) for g in grids] == [12, 12]
    shown = [e.text for e in grids[0].find_elements(By.CSS_SELECTOR, ".nm")]
    rec_a = RunRecord.load(a)
    assert shown == [t["name"] for t in rec_a.queries[0].top[:12]]
    assert browser.find_elements(By.CSS_SELECTOR, ".qimg svg rect")  # the query box is drawn
    broken = browser.execute_script(
        "return [...document.images].filter(i => i.complete && i.naturalWidth === 0).map(i => i.src)"
    )
    assert broken == []
    # verified matches: the first result of run B has three
    browser.find_element(By.CSS_SELECTOR, '.grid[data-run="1"] .res.m').click()
    assert browser.find_element(By.ID, "overlay").is_displayed()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#overlay-body line")) == 3
    shot = tmp_path / "viewer.png"
    browser.find_element(By.ID, "close").click()
    browser.find_element(
        By.CSS_SELECTOR, '#queries .q[data-index="1"]'
    ).click()  # the hostile query
    assert browser.find_element(By.CSS_SELECTOR, ".qinfo h2").text == HOSTILE_QUERY
    browser.find_element(By.CSS_SELECTOR, '#queries .q[data-index="0"]').click()
    browser.save_screenshot(str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("OXBENCH_WRITE_DOCS_SCREENSHOT") == "1":
        from PIL import Image  # a palette PNG keeps the committed screenshot small

        with Image.open(shot) as im:
            im.convert("RGB").quantize(colors=96).save(REPO / "docs" / "viewer.png", optimize=True)

    assert browser.current_url.endswith("#q=0")  # the open query is in the address
    browser.get(index.resolve().as_uri() + "#q=1")  # and a link opens it
    browser.refresh()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".qinfo h2"))
    assert browser.find_element(By.CSS_SELECTOR, ".qinfo h2").text == HOSTILE_QUERY

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - no script ran from a name
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
