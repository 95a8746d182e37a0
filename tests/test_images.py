"""Images under a pixel budget (issue 21 item 4), and the viewer reading only images under the run's
recorded image folders (item 6)."""

from __future__ import annotations

import json
import logging
import os
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.datasets.base import read_image
from oxbench.errors import InputError
from oxbench.imaging import DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV, max_pixels, open_image
from oxbench.report.runs import RunRecord
from oxbench.report.viewer import build_viewer
from run_layout import random_ranks, tiny_gt, write_run
from test_records import time_limit

PIL = pytest.importorskip("PIL.Image")


def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG that declares ``width x height`` pixels and holds one scanline: tiny on disk, huge when decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" + b"\x00" * 3 * min(width, 64))
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
    return path


def small_jpeg(path: Path, seed: int = 0, size: tuple[int, int] = (64, 48)) -> Path:
    rng = np.random.default_rng(seed)
    PIL.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
        path, quality=85
    )
    return path


@pytest.mark.parametrize("side", [30_000, 12_000])
def test_an_image_over_the_budget_is_refused_by_name_before_it_is_decoded(tmp_path, side):
    path = png_header(tmp_path / f"big{side}.png", side, side)
    assert path.stat().st_size < 10_000
    with (
        warnings.catch_warnings()
    ):  # Pillow warns above its own lower limit; the CLI drops that warning
        warnings.simplefilter("ignore", PIL.DecompressionBombWarning)
        with pytest.raises(InputError) as exc:
            read_image(path)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and "over the budget of 100.0" in msg, msg
    assert MAX_PIXELS_ENV in msg and "DecompressionBomb" not in msg


def test_the_budget_is_a_validated_setting(tmp_path, monkeypatch):
    assert max_pixels() == DEFAULT_MAX_PIXELS
    path = small_jpeg(tmp_path / "a.jpg")
    monkeypatch.setenv(MAX_PIXELS_ENV, "1000")
    with pytest.raises(InputError, match=r"image is 64 x 48 = 0.0 megapixels, over the budget"):
        read_image(path)
    monkeypatch.setenv(MAX_PIXELS_ENV, str(64 * 48))
    assert read_image(path).shape == (48, 64, 3)
    for bad in ("abc", "nan", "1.5", "-1", "0", "1e30"):
        monkeypatch.setenv(MAX_PIXELS_ENV, bad)
        with pytest.raises(InputError, match=f"environment variable {MAX_PIXELS_ENV}: "):
            read_image(path)


def test_special_files_are_not_images(tmp_path):
    fifo = tmp_path / "f.jpg"
    os.mkfifo(fifo)
    with time_limit(10), pytest.raises(InputError, match="not a regular file"):
        read_image(fifo)
    (tmp_path / "t.jpg").write_bytes(b"\xff\xd8\xff garbage")
    with pytest.raises(InputError, match="cannot decode image"):
        read_image(tmp_path / "t.jpg")
    with pytest.raises(InputError, match="image file not found"):
        with open_image(tmp_path / "none.jpg"):
            pass


def test_allow_partial_skips_an_over_budget_image_and_names_it(tmp_path, caplog):
    pytest.importorskip("torch")
    import logging

    from oxbench.features.deep.extract import ExtractOptions, Extractor
    from oxbench.features.deep.model import build_net

    paths = [
        small_jpeg(tmp_path / "a.jpg"),
        png_header(tmp_path / "big.png", 30_000, 30_000),
        small_jpeg(tmp_path / "c.jpg", 1),
    ]
    ext = Extractor(
        build_net("resnet18", "gem", weights="random").net,
        ExtractOptions(max_side=64, device="cpu", scales=(1.0,)),
    )
    with pytest.raises(InputError, match=r"image big: .*big.png: image is .* over the budget"):
        ext.describe_sources(lambda i: read_image(paths[i]), [0, 1, 2], ["a", "big", "c"])
    with caplog.at_level(logging.WARNING):
        done, x = ext.describe_sources(
            lambda i: read_image(paths[i]), [0, 1, 2], ["a", "big", "c"], allow_undecodable=True
        )
    assert done == [0, 2] and x.shape[0] == 2 and "image big cannot be decoded" in caplog.text


# -- the viewer reads only images under the run's image folders -----------------------------------


def _hostile_run(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    private = tmp_path / "private"
    private.mkdir()
    gt = tiny_gt(0, n_db=12, n_queries=3)
    good = {i: str(small_jpeg(data / f"db{i}.jpg", i)) for i in range(4)}
    fifo = data / "fifo.jpg"
    os.mkfifo(fifo)
    secret = small_jpeg(private / "secret.jpg", 99)
    os.symlink(secret, data / "escape.jpg")
    hostile = {
        4: str(secret),
        5: "/etc/passwd",
        6: "/proc/self/environ",
        7: str(fifo),
        8: str(data / "escape.jpg"),
        9: str(data / ".." / "private" / "secret.jpg"),
        10: str(png_header(data / "bomb.png", 12_000, 12_000)),
        11: "relative/secret.jpg",
    }
    ranks = np.tile(np.arange(12), (3, 1))
    run = write_run(
        tmp_path / "runs",
        gt,
        ranks,
        db_images={**good, **hostile},
        root=data,
        query_images={0: str(secret), 1: "/etc/shadow", 2: str(small_jpeg(data / "q2.jpg", 7))},
    )
    return run, good, secret


@pytest.mark.filterwarnings(
    "ignore:Image size"
)  # Pillow's own warning below oxbench's budget check
def test_viewer_shows_only_regular_images_under_the_recorded_root(tmp_path, caplog):
    run, good, secret = _hostile_run(tmp_path)
    with time_limit(30):
        index, cache = build_viewer(
            RunRecord.load(run), tmp_path / "v", top=12, roots=[tmp_path / "data"]
        )
    text = index.read_text()
    data = json.loads(text.split('id="data">')[1].split("</script>")[0])
    thumbs = {t["index"]: t["thumb"] for t in data["runs"][0]["lists"][0]}
    assert all(thumbs[i] is not None for i in good)
    assert all(thumbs[i] is None for i in range(4, 12)), thumbs
    assert data["queries"][0]["thumb"] is None and data["queries"][1]["thumb"] is None
    assert data["queries"][2]["thumb"] is not None
    assert cache.made == len(good) + 1  # nothing of the private folder was thumbnailed
    assert len(list((tmp_path / "v" / "thumbs").glob("*.jpg"))) == len(good) + 1
    secret_bytes = secret.read_bytes()
    assert all(p.read_bytes() != secret_bytes for p in (tmp_path / "v").rglob("*") if p.is_file())


def test_view_cli_on_a_hostile_record_is_one_warning_line_per_problem_no_pil_warning(
    tmp_path, capsys
):
    run, _, _ = _hostile_run(tmp_path)
    with time_limit(30), pytest.raises(SystemExit) as exc:
        main(
            ["view", str(run), "--out", str(tmp_path / "v"), "--top", "12"]
            + ["--root", str(tmp_path / "data")]
        )
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and "index.html" in out
    assert (
        "DecompressionBombWarning" not in err
        and "Traceback" not in err
        and "warnings.warn" not in err
    )
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("WARNING ") for ln in lines), lines
    bomb = [ln for ln in lines if "bomb.png" in ln]
    assert len(bomb) == 1 and "over the budget" in bomb[0], (
        lines
    )  # in every query's list, named once
    assert any("were not opened: placeholders shown" in ln for ln in lines), lines


def test_run_without_a_recorded_root_shows_placeholders_only(tmp_path):
    gt = tiny_gt(0, n_db=4, n_queries=2)
    img = small_jpeg(tmp_path / "a.jpg")
    run = write_run(
        tmp_path / "runs", gt, random_ranks(gt, 0), db_images=dict.fromkeys(range(4), str(img))
    )
    _, cache = build_viewer(RunRecord.load(run), tmp_path / "v")
    assert cache.made == 0 and cache.outside > 0


def test_a_hostile_thumbnail_index_is_remade(tmp_path, caplog):
    from oxbench.report.viewer import ThumbnailCache

    (tmp_path / "thumbs").mkdir()
    (tmp_path / "thumbs" / "index.json").write_text("[" * 200_000)
    import logging

    with caplog.at_level(logging.WARNING):
        cache = ThumbnailCache(tmp_path / "thumbs")
    assert cache.made == 0 and "unreadable thumbnail index" in caplog.text


@pytest.mark.parametrize("recorded", ["/", "/etc"])
def test_a_record_naming_its_own_root_opens_nothing_outside_the_callers_roots(
    tmp_path, caplog, recorded
):
    """Main 18c1381 took the readable folders from the record it guards: ``"root": "/"`` made
    ``view`` thumbnail a private image outside every dataset, ``"/etc"`` open /etc/passwd."""
    data = tmp_path / "data"
    data.mkdir()
    private = tmp_path / "private"
    private.mkdir()
    secret = small_jpeg(private / "secret.jpg", 99)
    gt = tiny_gt(0, n_db=4, n_queries=2)
    good = str(small_jpeg(data / "db0.jpg", 0))
    images = {0: good, 1: str(secret), 2: "/etc/passwd", 3: str(secret)}
    run = write_run(
        tmp_path / "runs", gt, np.tile(np.arange(4), (2, 1)), db_images=images, root=Path(recorded)
    )
    with caplog.at_level(logging.WARNING):
        _, cache = build_viewer(RunRecord.load(run), tmp_path / "v", top=4, roots=[data])
    assert cache.made == 1 and cache.outside >= 2  # db0 only: neither the secret nor /etc/passwd
    secret_bytes = secret.read_bytes()
    assert all(p.read_bytes() != secret_bytes for p in (tmp_path / "v").rglob("*") if p.is_file())
    assert f"the run read its images from {recorded}" in caplog.text
    # the CLI's default is the data root of the caller, whatever the record says
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OXBENCH_DATA", str(data))
        with pytest.raises(SystemExit) as exc:
            main(["view", str(run), "--out", str(tmp_path / "w"), "--top", "4"])
    assert exc.value.code == 0
    assert len(list((tmp_path / "w" / "thumbs").glob("*.jpg"))) == 1
