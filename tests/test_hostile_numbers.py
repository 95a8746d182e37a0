"""Numbers that lie: command-line counts, pickled indices, array headers, settings (issue 31 item 6).

Each case gave a traceback on main 18c1381; each is now one line naming what is wrong.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from oxbench.cli import main
from oxbench.cli.options import is_count, parse_distractors, parse_partition
from oxbench.errors import InputError
from run_layout import random_ranks, tiny_gt, write_run


@pytest.mark.parametrize(
    "text, problem",
    [
        ("²/3", "ASCII digits"),
        ("0/³", "ASCII digits"),
        ("١/4", "ASCII digits"),  # an Arabic-Indic one
        ("1" * 5000 + "/3", "ASCII digits"),
        ("0/" + "9" * 25, "ASCII digits"),
        ("5/3", "0 <= I < N"),
    ],
)
def test_partition_takes_bounded_ascii_digits(text: str, problem: str) -> None:
    with pytest.raises(InputError, match=problem) as err:
        parse_partition(text)
    assert len(str(err.value)) < 200 and "\n" not in str(err.value)


def test_distractors_take_bounded_ascii_digits() -> None:
    assert parse_distractors("1000") == 1000 and parse_distractors("revisitop1m") == "revisitop1m"
    for text in ("²", "1" * 5000, "١٢"):
        with pytest.raises(InputError, match="at most 20 ASCII digits") as err:
            parse_distractors(text)
        assert len(str(err.value)) < 200
    with pytest.raises(InputError, match="more than 100 million"):
        parse_distractors("999999999999")
    assert is_count("0") and not is_count("") and not is_count("-1") and not is_count("1 ")


@pytest.mark.parametrize("argv", [["--partition", "²/3"], ["--distractors", "²"]])
def test_the_cli_says_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", *argv, "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "ASCII digits" in err


def test_an_sfm_pickle_with_an_index_of_10_to_the_30_is_one_line(tmp_path: Path) -> None:
    from oxbench.train.sfm import sfm_training_set

    pkl = tmp_path / "sfm.pkl"
    pkl.write_bytes(
        pickle.dumps(
            {"train": {"cids": ["a", "b"], "qidxs": [10**30], "pidxs": [1], "cluster": [0, 0]}}
        )
    )
    with pytest.raises(InputError, match="lists of 64-bit integers") as err:
        sfm_training_set(pkl, tmp_path, 20)
    assert str(pkl) in str(err.value) and "\n" not in str(err.value)


def _claim_shape(path: Path, shape: tuple[int, ...]) -> None:
    """Rewrite a .npy header to claim ``shape`` (same header length, same data)."""
    data = path.read_bytes()
    header_len = 10 + int.from_bytes(data[8:10], "little")
    header = data[10:header_len].decode("latin1")
    start, end = header.index("'shape': (") + len("'shape': "), header.index("), ") + 1
    new = header[:start] + repr(shape) + header[end:]
    new = new.rstrip("\n").rstrip(" ")
    new = new + " " * (len(header) - len(new) - 1) + "\n"
    assert len(new) == len(header)
    path.write_bytes(data[:10] + new.encode("latin1") + data[header_len:])


def test_a_ranks_header_claiming_1e11_by_1e11_is_one_line_in_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gt = tiny_gt(0, n_queries=4)
    run = write_run(tmp_path / "runs", gt, random_ranks(gt, 1))
    ranks = Path(run) / "ranks.npy"
    _claim_shape(ranks, (10**11, 10**11))
    with pytest.raises(SystemExit) as exc:
        main(["export", str(run), "--format", "revisitop", "--out", str(tmp_path / "r.npy")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "header claims shape (100000000000, 100000000000)" in err and str(ranks) in err
    assert not (tmp_path / "r.npy").exists()


def test_device_nan_is_refused_by_the_settings_check() -> None:
    from oxbench.pipelines.presets import resolve_method

    for bad in ("nan", "cuda:²", "cuda:1;rm", "CPU"):
        with pytest.raises(InputError, match="expected auto, cpu, cuda or cuda:<n>"):
            resolve_method("gem-r50-imagenet", **{"descriptor.device": bad})
    for good in ("auto", "cpu", "cuda", "cuda:1"):
        m = resolve_method("gem-r50-imagenet", **{"descriptor.device": good})
        assert m.descriptor.device == good  # type: ignore[attr-defined]


def test_allow_partial_skips_an_over_budget_image_as_its_help_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Main 18c1381 stopped a local-feature run with --allow-partial at an over-budget image."""
    import logging

    pytest.importorskip("cv2")
    from oxbench.datasets.base import FileImages
    from oxbench.features.sift import SiftConfig
    from oxbench.features.store import DescribeImages, FeatureStore, extract_to_store
    from test_images import png_header, small_jpeg

    paths = [small_jpeg(tmp_path / f"im{i}.jpg", i, (96, 80)) for i in range(3)]
    paths.append(png_header(tmp_path / "huge.png", 30_000, 30_000))
    source = FileImages(tuple(p.stem for p in paths), tuple(paths))
    cfg = SiftConfig(n_features=30)
    with pytest.raises(InputError, match="over the budget") as err:  # strict: one line
        extract_to_store(
            DescribeImages(source, cfg), 4, FeatureStore.open(tmp_path / "a", cfg), progress=False
        )
    assert "huge.png" in str(err.value)
    store = FeatureStore.open(tmp_path / "s", cfg)
    with caplog.at_level(logging.WARNING):
        n = extract_to_store(
            DescribeImages(source, cfg, allow_partial=True), 4, store, progress=False
        )
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert n == 4 and len(said) == 1 and "1 image(s)" in said[0] and "'huge'" in said[0], said
    assert (
        store.count("huge") == 0
        and store.count("im0") > 0
        and store.skipped(store.names) == ["huge"]
    )
    with pytest.raises(InputError, match="over the budget"):  # a strict run reads it again
        extract_to_store(
            DescribeImages(source, cfg), 4, FeatureStore.open(tmp_path / "s", cfg), progress=False
        )


def test_http_byte_counts_are_bounded_ascii_digits() -> None:
    from oxbench.datasets.fetch import _header_count

    assert _header_count("1234") == 1234 and _header_count(" 7 ") == 7
    for bad in (None, "", "²", "12a", "-1", "1" * 21, "١٢"):
        assert _header_count(bad) is None, bad


@pytest.mark.parametrize(
    "name, raw",
    [
        ("cas.max_images", "1" * 40),  # a graph bound of 10^40 images
        ("cas.sigma", "1e-300"),  # would underflow every similarity to 0 (a 0/0 diffusion)
        ("cas.mu", "0"),  # alpha = 1: the diffusion keeps no fit to the identity
        ("cas.k5", "99999999999"),
    ],
)
def test_cas_numbers_are_one_line(name: str, raw: str) -> None:
    from oxbench.pipelines.presets import resolve_method

    with pytest.raises(InputError) as err:
        resolve_method("features", rerank="cas", **{name: raw})
    assert name.split(".")[1] in str(err.value) and "\n" not in str(err.value)
