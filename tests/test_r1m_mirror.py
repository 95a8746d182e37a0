"""R1M as users get it: ``oxbench data fetch revisitop1m`` from a local mirror serving 100 tiny
archives in the revisitop1m layout (names list, ``revisitop1m.{1..100}.tar.gz``), a dropped
connection resumed, an archive missing from the mirror refused, then the loader and ``oxbench run
--dataset roxford5k --distractors revisitop1m``."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oxbench.datasets import fetch, load
from oxbench.datasets.verify import verify
from oxbench.errors import InputError
from test_datasets import make_revisited, write_jpeg
from test_fetch import Behaviour, Server

pytest.importorskip("PIL.Image")

R1M_PATH = "/revisitop/revisitop1m"  # the owners' path, kept below the mirror's base
N_ARCHIVES = 100


def _entry(i: int) -> str:
    return f"{i % 7}/{i:03d}/r1m_{i:07d}"  # list entries: relative to jpg/, without the extension


def _archive(i: int, tmp: Path) -> bytes:
    """revisitop1m.<i>.tar.gz: one image, as jpg/<entry>.jpg."""
    img = write_jpeg(tmp / f"src{i}.jpg", seed=1000 + i)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(img, arcname=f"jpg/{_entry(i)}.jpg")
    return buf.getvalue()


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setattr(
        fetch, "disk_free", lambda p: 10**13
    )  # the catalog's sizes are the real ones (300 GB)
    monkeypatch.delenv("OXBENCH_MIRROR", raising=False)
    s = Server()
    src = tmp_path / "archives"
    src.mkdir()
    s.paths[f"{R1M_PATH}/revisitop1m.txt"] = Behaviour(
        "\n".join(_entry(i) for i in range(1, N_ARCHIVES + 1)).encode()
    )
    for i in range(1, N_ARCHIVES + 1):
        s.paths[f"{R1M_PATH}/jpg/revisitop1m.{i}.tar.gz"] = Behaviour(_archive(i, src))
    yield s
    s.close()


def _fetch(capsys: pytest.CaptureFixture[str], root: Path, server: Server) -> tuple[int, str]:
    from oxbench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(
            [
                "data",
                "fetch",
                "revisitop1m",
                "--root",
                str(root),
                "--mirror",
                server.base,
                "--accept-terms",
                "--no-progress",
                "--jobs",
                "4",
            ]
        )
    return int(exc.value.code or 0), capsys.readouterr().err


def test_r1m_from_a_mirror_through_fetch_loader_and_run(
    mirror: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    missing = mirror.paths[f"{R1M_PATH}/jpg/revisitop1m.42.tar.gz"]
    missing.mode = "404"  # an archive the mirror lacks: one line, exit 2, the set not complete
    dropped = mirror.paths[f"{R1M_PATH}/jpg/revisitop1m.7.tar.gz"]
    dropped.mode, dropped.drop_times = "drop", 1  # cut half-way once: resumed with a Range request
    code, err = _fetch(capsys, root, mirror)
    errors = [ln for ln in err.splitlines() if ln.startswith("oxbench: error:")]
    assert (
        code == 2
        and len(errors) == 1
        and "revisitop1m.42.tar.gz" in errors[0]
        and "404" in errors[0]
    ), err
    assert (
        dropped.served == 2
        and dropped.ranges[1] is not None
        and dropped.ranges[1].startswith("bytes=")
    )
    make_revisited(root / "roxford5k")
    with pytest.raises(InputError, match="missing"):
        load("roxford5k", root, distractors="revisitop1m", strict=False)
    # the mirror gets the archive; a second fetch downloads only what is not installed
    missing.mode = "ok"
    served_before = {p: b.served for p, b in mirror.paths.items()}
    code, err = _fetch(capsys, root, mirror)
    assert code == 0, err
    again = [p for p, b in mirror.paths.items() if b.served != served_before[p]]
    assert again == [f"{R1M_PATH}/jpg/revisitop1m.42.tar.gz"], again
    listed = (root / "revisitop1m" / "revisitop1m.txt").read_text().split()
    assert len(listed) == N_ARCHIVES and all(
        (root / "revisitop1m" / "jpg" / f"{e}.jpg").is_file() for e in listed
    )
    assert not list(
        (root / "revisitop1m").glob("downloads/*.tar.gz")
    )  # archives removed once laid out
    rep = verify("revisitop1m", root, progress=False)
    assert not rep.missing and not rep.corrupt and rep.n_images_checked == N_ARCHIVES
    assert rep.count_problems == [
        f"images: found {N_ARCHIVES}, expected 1001001"
    ]  # a partial R1M, said so
    bench = load("roxford5k", root, distractors="revisitop1m", strict=False)
    assert bench.n_distractors == N_ARCHIVES and bench.distractors is not None
    assert [bench.distractors.name(j) for j in (0, 41, 99)] == [_entry(1), _entry(42), _entry(100)]
    assert bench.distractors.read(41).shape == (16, 24, 3)

    # oxbench run with R1M: the user's descriptors, one row per database image then per distractor
    rng = np.random.default_rng(0)
    db = rng.normal(size=(bench.gt.n_db + N_ARCHIVES, 8)).astype(np.float32)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", db[:2] + 0.01)
    from oxbench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--dataset",
                "roxford5k",
                "--distractors",
                "revisitop1m",
                "--allow-partial",
                "--root",
                str(root),
                "--method",
                "features",
                "--set",
                f"descriptor.db_features={tmp_path / 'db.npy'}",
                "--set",
                f"descriptor.query_features={tmp_path / 'q.npy'}",
                "--out",
                str(tmp_path / "run"),
                "--json",
                "--no-progress",
            ]
        )
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    payload = json.loads(out)
    run_dir = Path(payload["run_dir"])
    assert json.loads((run_dir / "config.json").read_text())["n_distractors"] == N_ARCHIVES
    assert payload["footprint"]["n_index"] == bench.gt.n_db + N_ARCHIVES
    assert payload["footprint"]["ram"]["vectors"] == (bench.gt.n_db + N_ARCHIVES) * 8 * 4
