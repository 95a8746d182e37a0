"""``oxbench data ...`` end to end: exit codes, terms, fetch through a local mirror, bad input."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from oxbench.cli import main
from oxbench.datasets import fetch as fetch_mod
from oxbench.datasets import prepare
from oxbench.datasets.fetch import apply_mirror
from oxbench.datasets.lock import LockFile
from test_datasets import make_oxford, make_paris_archives, make_revisited
from test_fetch import Behaviour, Server

pytest.importorskip("PIL.Image")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the console entry point; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(["data", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach the owners' hosts: with a mirror, only the mirror is tried."""
    monkeypatch.setattr(
        prepare,
        "candidate_urls",
        lambda urls, mirror, **kw: [apply_mirror(u, mirror) for u in urls] if mirror else [],
    )
    monkeypatch.setattr(fetch_mod, "disk_free", lambda p: 10**13)
    monkeypatch.delenv("OXBENCH_MIRROR", raising=False)
    monkeypatch.delenv("OXBENCH_DATA", raising=False)


def test_list_and_info(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list")
    assert code == 0 and "roxford5k" in out and "1,001,001" in out
    code, out, _ = run(capsys, "list", "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert rows["rparis6k"]["images"] == 6322 and rows["holidays"]["protocols"] == ["holidays"]
    code, out, _ = run(capsys, "info", "revisitop1m")
    assert (
        code == 0
        and "revisitop1m.100.tar.gz" in out
        and "oxbench.lock.json" in out
        and "YFCC100M" in out
    )
    code, out, err = run(capsys, "info", "oxford6k")
    assert code == 2 and "unknown dataset 'oxford6k'" in err and err.count("\n") == 1


def _serve_roxford(server: Server, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_revisited(src)
    with tarfile.open(tmp_path / "oxbuild_images-v1.tgz", "w:gz") as tf:
        tf.add(src / "jpg", arcname="oxbuild_images")
    server.paths["/~vgg/data/oxbuildings/oxbuild_images-v1.tgz"] = Behaviour(
        (tmp_path / "oxbuild_images-v1.tgz").read_bytes(), mode="drop", drop_times=1
    )
    server.paths["/revisitop/data/datasets/roxford5k/gnd_roxford5k.pkl"] = Behaviour(
        (src / "gnd_roxford5k.pkl").read_bytes()
    )


def test_fetch_through_mirror_then_verify(
    capsys: pytest.CaptureFixture[str], server: Server, tmp_path: Path
) -> None:
    _serve_roxford(server, tmp_path)
    root = tmp_path / "root"
    # no terminal and no --accept-terms: exit 2 with the remedy, nothing downloaded
    code, _, err = run(capsys, "fetch", "roxford5k", "--root", str(root), "--mirror", server.base)
    assert code == 2 and "--accept-terms" in err.splitlines()[-1]
    assert all(b.served == 0 for b in server.paths.values())
    args = [
        "fetch",
        "roxford5k",
        "--root",
        str(root),
        "--mirror",
        server.base,
        "--accept-terms",
        "--no-progress",
        "--jobs",
        "2",
    ]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "Terms of use of roxford5k" in err
    ddir = root / "roxford5k"
    assert len(list((ddir / "jpg").glob("*.jpg"))) == 10 and (ddir / "gnd_roxford5k.pkl").exists()
    assert not (ddir / "downloads").exists()  # archive removed after extraction
    lock = LockFile(root).read()
    assert set(lock["files"]) == {"oxbuild_images-v1.tgz", "gnd_roxford5k.pkl"}
    assert "roxford5k" in lock["terms_accepted"]
    # idempotent: a second fetch downloads nothing
    served = {p: b.served for p, b in server.paths.items()}
    code, out, _ = run(capsys, *args)
    assert code == 0 and "nothing to download" in out
    assert {p: b.served for p, b in server.paths.items()} == served
    # verify: counts differ from the official ones -> exit 1, JSON report written
    report = tmp_path / "v.json"
    code, out, _ = run(
        capsys, "verify", "roxford5k", "--root", str(root), "--report", str(report), "--no-progress"
    )
    assert code == 1 and "database images: found 8, expected 4993" in out
    d = json.loads(report.read_text())
    assert d["ok"] is False and d["checksums_ok"] == ["gnd_roxford5k.pkl"] and not d["missing"]


def test_second_dataset_reuses_the_shared_archive(
    capsys: pytest.CaptureFixture[str], server: Server, tmp_path: Path
) -> None:
    _serve_roxford(server, tmp_path)
    gt = tmp_path / "ox"
    make_oxford(gt)
    with tarfile.open(tmp_path / "gt.tgz", "w:gz") as tf:
        tf.add(gt / "gt_files_170407", arcname=".")
    server.paths["/~vgg/data/oxbuildings/gt_files_170407.tgz"] = Behaviour(
        (tmp_path / "gt.tgz").read_bytes()
    )
    root = tmp_path / "root"
    opts = ["--root", str(root), "--mirror", server.base, "--accept-terms", "--no-progress"]
    assert run(capsys, "fetch", "roxford5k", *opts)[0] == 0
    images = server.paths["/~vgg/data/oxbuildings/oxbuild_images-v1.tgz"]
    served = images.served
    code, out, err = run(capsys, "fetch", "oxford5k", *opts)
    assert code == 0, err
    assert "reused from another dataset" in out and images.served == served  # not downloaded again
    a, b = (
        root / "roxford5k" / "jpg" / "all_souls_000001.jpg",
        root / "oxford5k" / "jpg" / "all_souls_000001.jpg",
    )
    assert a.stat().st_ino == b.stat().st_ino
    assert (root / "oxford5k" / "gt_files_170407" / "all_souls_1_query.txt").exists()
    from oxbench.datasets import load

    bench = load("oxford5k", root, strict=False)
    assert bench.gt.n_db == 10 and bench.gt.queries[0].name == "all_souls_000000"


def test_fetch_checksum_mismatch_against_lock(
    capsys: pytest.CaptureFixture[str], server: Server, tmp_path: Path
) -> None:
    _serve_roxford(server, tmp_path)
    root = tmp_path / "root"
    base = [
        "fetch",
        "roxford5k",
        "--root",
        str(root),
        "--mirror",
        server.base,
        "--accept-terms",
        "--no-progress",
    ]
    assert run(capsys, *base)[0] == 0
    # The owners' (mirror's) pickle changes: a forced re-fetch refuses it, keeps nothing that looks done.
    server.paths["/revisitop/data/datasets/roxford5k/gnd_roxford5k.pkl"].mode = "wrong"
    (root / "roxford5k" / "gnd_roxford5k.pkl").unlink()
    code, _, err = run(capsys, *base, "--force")
    assert (
        code == 2
        and "sha256" in err
        and "differs from the expected" in err
        and len(err.strip().splitlines()) == 1
    )
    assert not (root / "roxford5k" / "gnd_roxford5k.pkl").exists()
    assert not list((root / "roxford5k").rglob("*.part"))


def test_fetch_bad_input(
    capsys: pytest.CaptureFixture[str],
    server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _serve_roxford(server, tmp_path)
    root = tmp_path / "root"
    base = ["--mirror", server.base, "--accept-terms", "--no-progress"]
    # unknown id
    code, _, err = run(capsys, "fetch", "roxford6k", "--root", str(root), *base)
    assert code == 2 and "unknown dataset" in err
    # full disk (simulated through the free-space check): nothing downloaded
    monkeypatch.setattr(fetch_mod, "disk_free", lambda p: 1_000)
    code, _, err = run(capsys, "fetch", "roxford5k", "--root", str(root), *base)
    assert code == 2 and "not enough free disk space" in err and "--root" in err
    assert all(b.served == 0 for b in server.paths.values())
    monkeypatch.setattr(fetch_mod, "disk_free", lambda p: 10**13)
    # corrupt archive from the server: refused, nothing left looking installed
    server.paths["/~vgg/data/oxbuildings/oxbuild_images-v1.tgz"] = Behaviour(
        b"\x1f\x8b\x08 not really gzip" * 100
    )
    code, _, err = run(capsys, "fetch", "roxford5k", "--root", str(root), *base)
    assert code == 2 and "corrupt" in err and "fetch again" in err
    assert "oxbuild_images-v1.tgz" not in LockFile(root).installed("roxford5k")
    assert (
        "oxbuild_images-v1.tgz" not in LockFile(root).read()["files"]
    )  # a bad file is never recorded
    assert not (root / "roxford5k" / "downloads" / "oxbuild_images-v1.tgz").exists()
    assert not list((root / "roxford5k").glob(".extract-*"))
    assert not list(
        (root / "roxford5k").glob(".oxbench-tmp-*")
    )  # nor a temporary extraction folder
    # a connection that always drops half-way: exit 2, only a .part file (kept for resume)
    _serve_roxford(server, tmp_path)
    server.paths["/revisitop/data/datasets/roxford5k/gnd_roxford5k.pkl"].mode = "drop"
    server.paths["/revisitop/data/datasets/roxford5k/gnd_roxford5k.pkl"].drop_times = 10**6
    monkeypatch.setattr(fetch_mod.time, "sleep", lambda s: None)
    (root / "roxford5k" / "gnd_roxford5k.pkl").unlink()
    code, _, err = run(capsys, "fetch", "roxford5k", "--root", str(root), "--force", *base)
    assert code == 2 and "connection dropped" in err and "partial file kept" in err
    assert not (root / "roxford5k" / "gnd_roxford5k.pkl").exists()
    assert (root / "roxford5k" / "gnd_roxford5k.pkl.part").exists()
    # 404 everywhere
    server.paths.clear()
    code, _, err = run(capsys, "fetch", "roxford5k", "--root", str(root), "--force", *base)
    assert code == 2 and "HTTP 404" in err
    # oxford100k has no public download any more
    code, _, err = run(capsys, "fetch", "oxford100k", "--root", str(root), *base)
    assert code == 2 and "oxbench data import oxford100k" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_root(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, _, err = run(
            capsys, "fetch", "roxford5k", "--root", str(ro / "data"), "--accept-terms"
        )
        assert code == 2 and "not writable" in err
    finally:
        ro.chmod(0o700)


def test_unwritable_root_as_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run(
        capsys, "import", "roxford5k", "--root", str(blocker / "data"), "--from", str(tmp_path)
    )
    assert code == 2 and "data root is not writable" in err and "--root" in err


def test_import_and_verify_commands(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    have = tmp_path / "have"
    have.mkdir()
    make_paris_archives(have)
    root = tmp_path / "root"
    monkeypatch.setenv("OXBENCH_DATA", str(root))  # the data root from the environment
    code, out, err = run(capsys, "import", "paris6k", "--from", str(have))
    assert code == 0, err
    assert "11 file(s) laid out" in out and (root / "paris6k" / "jpg").is_dir()
    code, out, _ = run(capsys, "verify", "paris6k", "--no-progress")
    assert code == 1 and "known-corrupt (expected, not used): 2" in out
    assert (root / "paris6k" / "verify.json").exists()
    code, _, err = run(capsys, "verify", "rparis6k", "--no-progress")
    assert code == 2 and "oxbench data fetch rparis6k" in err


def test_synth_command_is_registered_when_present(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    code, out, _ = run(capsys, "--help")
    assert code == 0 and "verify" in out and "import" in out
    has_synth = importlib.util.find_spec("oxbench.cli.synth") is not None
    assert ("synth" in out) == has_synth


# --- what is on disk: list, info, path --------------------------------------------------------------


def _files_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_list_info_and_path_say_what_is_on_disk(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "root")
    make_revisited(root / "roxford5k")  # 10 of the 5,063 images: incomplete
    code, out, _ = run(capsys, "list", "--root", str(root), "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert code == 0 and rows["synthetic"]["state"] == "installed"
    assert rows["synthetic"]["path"] == str(root / "synthetic")
    assert rows["synthetic"]["size_on_disk"] == _files_size(root / "synthetic")
    assert rows["synthetic"]["image_files"] == 44
    assert rows["roxford5k"]["state"] == "incomplete" and rows["roxford5k"]["image_files"] == 10
    assert rows["oxford5k"]["state"] == "absent" and rows["oxford5k"]["size_on_disk"] == 0
    code, out, _ = run(capsys, "list", "--root", str(root))
    lines = {ln.split()[0]: ln for ln in out.splitlines()[2:]}
    assert out.splitlines()[0] == f"data root: {root}" and "on disk" in out.splitlines()[1]
    assert "partial" in lines["roxford5k"] and " - " in lines["oxford5k"]
    code, out, _ = run(capsys, "info", "synthetic", "--root", str(root))
    assert code == 0 and f"on disk:    installed in {root / 'synthetic'} (44 image files" in out
    code, out, _ = run(capsys, "info", "roxford5k", "--root", str(root))
    assert f"incomplete in {root / 'roxford5k'} (10 of 5,063 image files" in out
    (root / "roxford5k" / "gnd_roxford5k.pkl").unlink()
    code, out, _ = run(capsys, "info", "roxford5k", "--root", str(root))
    assert "missing gnd_roxford5k.pkl" in out
    code, out, _ = run(capsys, "info", "holidays", "--root", str(root))
    assert f"not installed (it goes in {root / 'holidays'})" in out
    # path: the folder for scripts; exit 2 with the remedy when it is not there
    code, out, err = run(capsys, "path", "synthetic", "--root", str(root))
    assert code == 0 and out == f"{root / 'synthetic'}\n" and err == ""
    code, out, err = run(capsys, "path", "roxford5k", "--root", str(root))
    assert code == 0 and out == f"{root / 'roxford5k'}\n" and "incomplete" in err
    code, out, err = run(capsys, "path", "holidays", "--root", str(root))
    assert code == 2 and out == "" and err.count("\n") == 1 and "oxbench data fetch holidays" in err
    code, out, _ = run(capsys, "path", "holidays", "--root", str(root), "--missing-ok")
    assert code == 0 and out == f"{root / 'holidays'}\n"
    assert not (root / "holidays").exists()


def test_import_leaves_out_files_that_are_none_of_the_datasets_images(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from test_datasets import write_jpeg

    src = tmp_path / "mine"
    make_revisited(src)
    write_jpeg(src / "jpg" / "all_souls_999999.jpg", seed=1)  # an Oxford-style name, not in the gnd
    write_jpeg(src / "jpg" / "holiday_snap.jpg", seed=2)
    root = tmp_path / "root"
    code, out, err = run(
        capsys, "import", "roxford5k", "--from", str(src), "--root", str(root), "--no-progress"
    )
    assert code == 0, err
    assert "11 file(s) laid out" in out  # 10 images + the pickle
    assert "left out: 2 file(s) that match no image of roxford5k (not copied)" in out
    assert "2 file(s) match no image of roxford5k and were not laid out" in caplog.text
    assert not (root / "roxford5k" / "jpg" / "holiday_snap.jpg").exists()
    assert not (root / "roxford5k" / "jpg" / "all_souls_999999.jpg").exists()
    # without the pickle, the naming scheme of the Oxford images decides
    strays = tmp_path / "strays"
    write_jpeg(strays / "holiday_snap.jpg", seed=3)
    write_jpeg(strays / "keble_000123.jpg", seed=4)
    code, out, _ = run(capsys, "import", "rparis6k", "--from", str(strays), "--root", str(root))
    assert code == 2 and "found no file of rparis6k" in _ and "2 .jpg file(s) match no image" in _
    assert not (root / "rparis6k" / "jpg").exists()
    code, out, _ = run(
        capsys,
        "import",
        "roxford5k",
        "--from",
        str(strays / "keble_000123.jpg"),
        "--root",
        str(root),
    )
    assert code == 2 and "found no file" in _  # keble_000123 is not in the gnd that is now there
    # UKBench: the names are known without a list (ukbench00000 .. ukbench10199)
    uk = tmp_path / "uk"
    for name in ("ukbench00004", "ukbench10200", "ukbench99999"):
        write_jpeg(uk / f"{name}.jpg", seed=5)
    code, out, err = run(
        capsys, "import", "ukbench", "--from", str(uk), "--root", str(root), "--no-progress"
    )
    assert code == 0 and "1 file(s) laid out" in out and "left out: 2 file(s)" in out
    assert sorted(p.name for p in (root / "ukbench" / "jpg").iterdir()) == ["ukbench00004.jpg"]


def test_verify_json_counts_what_was_found(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    make_revisited(root / "roxford5k")
    (root / "roxford5k" / "jpg" / "all_souls_000002.jpg").unlink()
    code, out, _ = run(capsys, "verify", "roxford5k", "--root", str(root), "--no-progress")
    counts = json.loads((root / "roxford5k" / "verify.json").read_text())["counts"]
    assert code == 1 and counts["database images"] == {"expected": 4993, "found": 7, "listed": 8}
    assert counts["query images"] == {"expected": 70, "found": 2, "listed": 2}
    assert "database images: found 7, expected 4993, 8 listed" in out


def test_verify_synthetic_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "root")
    code, out, err = run(capsys, "verify", "synthetic-train", "--root", str(root), "--no-progress")
    assert code == 0, out + err
    assert out.startswith("synthetic-train: OK (32 images decoded")
    jpg = root / "synthetic-train" / "jpg"
    victim = sorted(jpg.glob("*.jpg"))[5]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: still decodes, no longer what was generated
    victim.write_bytes(bytes(data))
    code, out, _ = run(
        capsys, "verify", "synthetic-train", "--root", str(root), "--no-progress", "--no-decode"
    )
    assert code == 1 and f"changed since generation: 1 image(s), e.g. {victim.stem}" in out
    report = json.loads((root / "synthetic-train" / "verify.json").read_text())
    assert report["changed"] == [victim.stem] and report["ok"] is False


@pytest.mark.parametrize(
    "content",
    [
        "[]",
        '{"files": []}',
        '{"files": {"gnd_roxford5k.pkl": 5}}',
        '{"files": {"gnd_roxford5k.pkl": {"size": "12"}}}',
        '{"files": {"gnd_roxford5k.pkl": {"size": -1}}}',
        '{"files": {"gnd_roxford5k.pkl": {"size": true}}}',
        '{"files": {"gnd_roxford5k.pkl": {"sha256": "zz"}}}',
        '{"files": {"gnd_roxford5k.pkl": {"md5": 5}}}',
        '{"installed": {"roxford5k": ["x"]}}',
        '{"terms_accepted": []}',
        '{"version": 2}',
        '{"files": {"gnd_roxford5k.pkl": {"size": 1' + "0" * 5000 + "}}}",
        "[" * 100_000,
        "not json",
        "\udcff\udcfe",  # bytes ff fe: not UTF-8
    ],
)
def test_verify_and_fetch_refuse_a_malformed_lock_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str
) -> None:
    root = tmp_path / "root"
    (root / "roxford5k").mkdir(parents=True)
    (root / "oxbench.lock.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    common = ["roxford5k", "--root", str(root), "--no-progress"]
    for args in (
        ["verify", *common, "--no-decode"],
        ["fetch", *common, "--accept-terms", "--mirror", "http://127.0.0.1:9"],
    ):
        code, _, err = run(capsys, *args)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and "lock file" in lines[-1] and "fix or delete it" in lines[-1], (
            args,
            err,
        )
        assert lines[-1].startswith("oxbench: error:") and "Traceback" not in err


def test_verify_refuses_a_fifo_as_lock_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "roxford5k").mkdir(parents=True)
    os.mkfifo(root / "oxbench.lock.json")
    code, _, err = run(
        capsys, "verify", "roxford5k", "--root", str(root), "--no-decode", "--no-progress"
    )
    assert code == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1


def test_a_ground_truth_only_root_is_reported_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """ROxford's pickle at the real counts and no image: import and verify say what is there and
    that the features presets need nothing more (exit 0); one image on disk makes it a partial
    copy again (PROBLEMS, verify exits 1)."""
    import pickle

    have = tmp_path / "have"
    have.mkdir()
    gnd = [{"bbx": [0.0, 0.0, 9.0, 9.0], "easy": [q], "hard": [], "junk": []} for q in range(70)]
    imlist = [f"all_souls_{i:06d}" for i in range(4993)]
    qimlist = [f"oxford_q{q:06d}" for q in range(70)]
    (have / "gnd_roxford5k.pkl").write_bytes(
        pickle.dumps({"imlist": imlist, "qimlist": qimlist, "gnd": gnd}, protocol=2)
    )
    root = tmp_path / "root"
    want = "roxford5k: ground truth for 70 queries; images: none, which the features presets do not need"
    code, out, err = run(capsys, "import", "roxford5k", "--from", str(have), "--root", str(root))
    assert code == 0 and want in out and "PROBLEMS" not in out and "import the rest" not in out, out
    code, out, _ = run(capsys, "verify", "roxford5k", "--root", str(root), "--no-progress")
    assert code == 0 and out.startswith(want) and "5,063 images" in out, out
    report = json.loads((root / "roxford5k" / "verify.json").read_text())
    assert report["ground_truth_only"] and not report["ok"]
    (root / "roxford5k" / "jpg").mkdir()
    (root / "roxford5k" / "jpg" / "all_souls_000000.jpg").write_bytes(b"")
    code, out, _ = run(
        capsys, "verify", "roxford5k", "--root", str(root), "--no-progress", "--no-decode"
    )
    assert code == 1 and out.startswith("roxford5k: PROBLEMS") and "missing: 5062" in out, out
