"""Benchmarks as plugins: every built-in family passes ``check_dataset``; a dataset (with a protocol
of its own) written here as a package of its own -- its pyproject declaring the entry points,
installed by pip into a target folder -- is listed by ``oxbench data list``, passes the check and
runs with ``oxbench run``; GLDv2 retrieval and ILIAS run on descriptor files with no image on disk;
the datasets import no module in a circle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import oxbench
from oxbench.datasets import DATASETS
from oxbench.testing import check_dataset
from test_architecture import import_edges
from test_plugins import _write, install_into
from test_protocols import TOY_PROTOCOL

SRC = Path(oxbench.__file__).resolve().parents[1]


@pytest.mark.parametrize("dataset", DATASETS.names())
def test_every_built_in_family_passes_the_check(dataset: str, tmp_path: Path) -> None:
    if dataset.startswith("synthetic"):
        pytest.importorskip("cv2")
    check_dataset(dataset, root=tmp_path)


def test_the_check_finds_what_a_family_gets_wrong(tmp_path: Path) -> None:
    from oxbench.datasets.families.holidays import Holidays
    from oxbench.datasets.spec import DatasetSpec

    class NoExample(Holidays):
        def write_example(self, spec, ddir):  # noqa: ANN001, ANN202 - the test's deliberate gap
            super().write_example(spec, ddir)
            (ddir / "holidays_images.dat").unlink()

    spec = DatasetSpec(
        id="holidays-broken",
        title="t",
        homepage="",
        description="",
        n_images=1,
        n_queries=1,
        counts_note="",
        protocols=("holidays",),
        files=(),
        terms="",
        family=NoExample(),
    )
    with pytest.raises(AssertionError, match="not in the catalog under its id"):
        check_dataset(spec, root=tmp_path)
    DATASETS.register(spec.id, spec)
    try:
        with pytest.raises(AssertionError, match="the example copy lacks"):
            check_dataset(spec, root=tmp_path)
    finally:
        DATASETS.unregister(spec.id)


# --- a plugin of its own ------------------------------------------------------------------------

PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "oxtoy"
version = "0.1"
requires-python = ">=3.11"

[project.entry-points."oxbench.datasets"]
toyland = "oxtoy.dataset"

[project.entry-points."oxbench.protocols"]
first-hit = "oxtoy.protocol"
"""

DATASET = '''
"""Toyland: truth.json ({"database": [names], "queries": {name: [positive names]}}) plus jpg/."""
import json
from dataclasses import dataclass

from oxbench.datasets.catalog import register
from oxbench.datasets.ondisk import (
    IMAGE_DIR, OnDisk, image_files, require_file, write_tiny_jpegs,
)
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth, make_query

TRUTH = "truth.json"


@dataclass(frozen=True)
class Toyland(OnDisk):
    def layout(self, spec):
        return (Placement(TRUTH, "."), Placement("*.jpg", IMAGE_DIR))

    def required_files(self, spec):
        return (TRUTH,)

    def expected_image_files(self, spec, ddir):
        return spec.n_images + spec.n_queries

    def ground_truth(self, spec, ddir, *, strict):
        path = require_file(spec, ddir, TRUTH, "the ground truth")
        try:
            data = json.loads(path.read_text())
            db = tuple(data["database"])
            where = {n: i for i, n in enumerate(db)}
            queries = tuple(
                make_query(q, good=[where[p] for p in positives])
                for q, positives in data["queries"].items()
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"malformed ground truth ({exc})", path) from None
        return GroundTruth(spec.id, "first-hit", db, queries, str(path)).validate()

    def verify_plan(self, spec, ddir):
        gt = self.ground_truth(spec, ddir, strict=False)
        files = image_files((*gt.db_names, *gt.query_names))
        return VerifyPlan(files, counts=(CountCheck("images", spec.n_images, files),))

    def write_example(self, spec, ddir):
        ddir.mkdir(parents=True, exist_ok=True)
        db = [f"house{i}" for i in range(6)]
        truth = {"database": db, "queries": {"qa": ["house1", "house4"], "qb": ["house2"]}}
        (ddir / TRUTH).write_text(json.dumps(truth))
        write_tiny_jpegs(ddir / IMAGE_DIR, [*db, "qa", "qb"])


register(DatasetSpec(
    id="toyland", title="Toyland (a plugin)", homepage="", description="Six houses.",
    n_images=6, n_queries=2, counts_note="6 houses, 2 queries", protocols=("first-hit",),
    files=(), terms="none", family=Toyland(),
))
'''


def _python(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SRC)])}
    env.pop("OXBENCH_CLUSTER", None)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The oxtoy package, built and installed by pip into a target folder (returned)."""
    pytest.importorskip("setuptools")
    pytest.importorskip("PIL.Image")
    tmp = tmp_path_factory.mktemp("oxtoy")
    package = _write(
        tmp / "oxtoy",
        {
            "pyproject.toml": PYPROJECT,
            "src/oxtoy/__init__.py": '"""A toy benchmark and its protocol."""\n',
            "src/oxtoy/protocol.py": TOY_PROTOCOL,
            "src/oxtoy/dataset.py": DATASET,
        },
    )
    target = install_into(package, tmp / "site")
    assert (target / "oxtoy-0.1.dist-info" / "entry_points.txt").is_file()
    return target


def test_the_plugin_dataset_is_listed_with_its_origin(site: Path, tmp_path: Path) -> None:
    done = _python(site, "-m", "oxbench", "data", "list", "--root", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("toyland ")]
    assert "first-hit" in line and line.endswith("Toyland (a plugin) [from oxtoy 0.1]")
    listed = _python(site, "-m", "oxbench", "data", "list", "--json", cwd=tmp_path)
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows["toyland"]["origin"] == "oxtoy 0.1"
    assert rows["roxford5k"]["origin"].startswith("oxbench.")  # a built-in


def test_the_plugin_dataset_passes_the_check(site: Path, tmp_path: Path) -> None:
    code = "from oxbench.testing import check_dataset; check_dataset('toyland'); print('passed')"
    done = _python(site, "-c", code, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "passed", done.stderr[-3000:]


def _features(base: Path, db: list[str], queries: list[str], close: dict[str, str]) -> list[str]:
    """Descriptor files named by image: each query's descriptor is its ``close`` image's."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((len(db), 16)).astype(np.float32)
    q = np.stack([x[db.index(close[n])] + 0.01 for n in queries]).astype(np.float32)
    np.save(base / "db.npy", x)
    np.save(base / "q.npy", q)
    (base / "db.txt").write_text("".join(f"{n}\n" for n in db))
    (base / "q.txt").write_text("".join(f"{n}\n" for n in queries))
    return [
        "--set", f"descriptor.db_features={base / 'db.npy'}",
        "--set", f"descriptor.db_names={base / 'db.txt'}",
        "--set", f"descriptor.query_features={base / 'q.npy'}",
        "--set", f"descriptor.query_names={base / 'q.txt'}",
    ]  # fmt: skip


def _no_images(root: Path) -> None:
    for path in root.rglob("*.jpg"):
        path.unlink()


def test_the_plugin_dataset_runs_with_oxbench_run(site: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    write = (
        "from pathlib import Path; from oxbench.datasets import get_spec; "
        f"s = get_spec('toyland'); s.family.write_example(s, Path({str(root / 'toyland')!r}))"
    )
    assert _python(site, "-c", write, cwd=tmp_path).returncode == 0
    _no_images(root)
    db = [f"house{i}" for i in range(6)]
    sets = _features(tmp_path, db, ["qa", "qb"], {"qa": "house1", "qb": "house3"})
    done = _python(
        site, "-m", "oxbench", "run", "--dataset", "toyland", "--method", "features",
        "--root", str(root), "--out", str(tmp_path / "runs" / "toy"), "--json", *sets,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / json.loads(done.stdout)["run_dir"]
    assert (run_dir / "summary.txt").read_text().startswith("toyland: success@1 50.00")
    listed = _python(site, "-m", "oxbench", "runs", str(tmp_path / "runs"), cwd=tmp_path)
    assert listed.returncode == 0 and "success@1 50.00" in listed.stdout, listed.stderr


def _run_builtin(dataset: str, root: Path, tmp_path: Path, sets: list[str]) -> Path:
    from oxbench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(
            ["run", "--dataset", dataset, "--method", "features", "--root", str(root),
             "--out", str(tmp_path / "runs" / dataset), "--engine", "serial", "--allow-partial",
             *sets]
        )  # fmt: skip
    assert exc.value.code == 0
    (summary,) = (tmp_path / "runs" / dataset).glob("*/summary.txt")
    return summary


def test_gldv2_runs_on_descriptor_files_with_no_image_on_disk(tmp_path: Path, capsys) -> None:
    spec = DATASETS.get("gldv2-retrieval")
    root = tmp_path / "data"
    spec.family.write_example(spec, root / spec.id)
    _no_images(root)
    gt = spec.family.ground_truth(spec, root / spec.id, strict=False)
    # each query's descriptor sits on its first relevant index image
    close = {q.name: gt.db_names[int(q.good[0])] for q in gt.queries}
    summary = _run_builtin(
        spec.id, root, tmp_path, _features(tmp_path, list(gt.db_names), list(gt.query_names), close)
    )
    first = summary.read_text().splitlines()[0]
    assert first.startswith("gldv2-retrieval: mAP@100 public ")
    capsys.readouterr()


def test_ilias_runs_on_descriptor_files_with_no_image_on_disk(tmp_path: Path, capsys) -> None:
    spec = DATASETS.get("ilias")
    root = tmp_path / "data"
    spec.family.write_example(spec, root / spec.id)
    _no_images(root)
    gt = spec.family.ground_truth(spec, root / spec.id, strict=False)
    assert gt.db_names[-3:] == ("00000/aa01", "00000/aa02", "00001/bb03")  # the listed distractors
    close = {q.name: gt.db_names[int(q.good[0])] for q in gt.queries}
    summary = _run_builtin(
        spec.id, root, tmp_path, _features(tmp_path, list(gt.db_names), list(gt.query_names), close)
    )
    assert summary.read_text().startswith("ilias: mAP@1000 ")
    capsys.readouterr()


def test_no_dataset_family_imports_another() -> None:
    """Imports, and importlib.import_module of a literal name, are both edges (the circles of the
    whole package: test_architecture)."""
    edges = import_edges("datasets")
    # no family imports another family (what two share is content: _oxford_paris)
    families = [m for m in edges if ".families." in m and not m.rsplit(".", 1)[-1].startswith("_")]
    for m in families:
        assert not (edges[m] & set(families)), f"{m} imports another family"


# --- a hostile entry ----------------------------------------------------------------------------


def _entry(**change: object) -> dict[str, object]:
    from oxbench.datasets.families.holidays import Holidays

    fields: dict[str, object] = dict(
        id="toy", title="t", homepage="", description="", n_images=1, n_queries=1,
        counts_note="", protocols=("holidays",), files=(), terms="", family=Holidays(),
    )  # fmt: skip
    fields.update(change)
    return fields


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda S, F, P: S(**_entry(id="../../etc")), "dataset id must be"),
        (lambda S, F, P: S(**_entry(id="Toy Land")), "dataset id must be"),
        (lambda S, F, P: S(**_entry(n_images=-1)), "n_images must be a whole number"),
        (lambda S, F, P: S(**_entry(n_queries=float("nan"))), "n_queries must be a whole number"),
        (lambda S, F, P: F("../x.tgz", ("https://127.0.0.1/x",)), "file name must be a plain"),
        (lambda S, F, P: F("a/x.tgz", ("https://127.0.0.1/x",)), "file name must be a plain"),
        (
            lambda S, F, P: F("x", ("https://127.0.0.1/x",), dest="/etc/x"),
            "dest must be a relative",
        ),
        (lambda S, F, P: F("x", ("https://127.0.0.1/x",), dest="a/../../x"), "dest must be"),
        (lambda S, F, P: F("x", ("file:///etc/passwd",)), "urls must be"),
        (lambda S, F, P: F("x", ()), "urls must be"),
        (lambda S, F, P: F("x", ("https://127.0.0.1/x",), size=float("nan")), "size must be"),
        (lambda S, F, P: F("x", ("https://127.0.0.1/x",), sha256="zz"), "sha256 must be"),
        (lambda S, F, P: P("*.jpg", "../jpg"), "into must be a relative path"),
        (lambda S, F, P: P("*.jpg", "C:/jpg"), "into must be a relative path"),
    ],
)
def test_an_entry_that_could_reach_outside_its_folder_is_refused(make, message) -> None:
    # A plugin's entry is declarative: each path it declares stays inside <root>/<id>/, each
    # count is a count, each address a download address (issue 43's pass over dataset plugins).
    from oxbench.datasets.spec import DatasetSpec, Placement, RemoteFile
    from oxbench.errors import InputError

    with pytest.raises(InputError, match=message):
        make(DatasetSpec, RemoteFile, Placement)


HOSTILE_PYPROJECT = PYPROJECT.replace('name = "oxtoy"', 'name = "oxbad"').replace(
    'toyland = "oxtoy.dataset"', 'badland = "oxbad.dataset"'
)
HOSTILE_DATASET = """
from oxbench.datasets.catalog import register
from oxbench.datasets.families.holidays import Holidays
from oxbench.datasets.spec import DatasetSpec

register(DatasetSpec(
    id="../../outside", title="t", homepage="", description="", n_images=1, n_queries=1,
    counts_note="", protocols=("holidays",), files=(), terms="", family=Holidays(),
))
"""


def test_a_plugin_entry_with_a_path_outside_is_one_warning_and_the_rest_works(
    tmp_path: Path,
) -> None:
    pytest.importorskip("setuptools")
    package = _write(
        tmp_path / "oxbad",
        {
            "pyproject.toml": HOSTILE_PYPROJECT,
            "src/oxbad/__init__.py": "",
            "src/oxbad/dataset.py": HOSTILE_DATASET,
        },
    )
    site = install_into(package, tmp_path / "site")
    done = _python(site, "-m", "oxbench", "data", "list", "--root", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "roxford5k" in done.stdout and "outside" not in done.stdout
    warned = [ln for ln in done.stderr.splitlines() if "badland" in ln]
    assert len(warned) == 1 and "dataset id must be" in warned[0], done.stderr
    assert not (tmp_path.parent / "outside").exists()


# A plugin's dataset family that fails while the command runs (hostile pass of issue 43): the error
# raised in the plugin's code, or what it returns instead of a ground truth / a layout, is one line
# naming the plugin, exit 2 -- not a traceback from deep inside oxbench.

FAILING_FAMILIES = """
from oxbench.datasets.catalog import register
from oxbench.datasets.families.holidays import Holidays
from oxbench.datasets.spec import DatasetSpec


class Raises(Holidays):
    def ground_truth(self, spec, ddir, *, strict):
        return {}["no such key"]


class GivesNone(Holidays):
    def ground_truth(self, spec, ddir, *, strict):
        return None


class BadLayout(Holidays):
    def layout(self, spec):
        return ("*.jpg",)


for name, family in (("raising", Raises()), ("noneland", GivesNone()), ("badlayout", BadLayout())):
    register(DatasetSpec(
        id=name, title="t", homepage="", description="", n_images=2, n_queries=1,
        counts_note="", protocols=("holidays",), files=(), terms="", family=family,
    ))
"""


def _dist_info_plugin(site: Path, package: str, source: str) -> Path:
    """``package`` with an ``oxbench.datasets`` entry point, laid out as an installed
    distribution (a dist-info folder beside it) in ``site``."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(source)
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[oxbench.datasets]\n{package} = {package}\n")
    return site


@pytest.mark.parametrize(
    ("dataset", "command", "message"),
    [
        ("raising", "run", "plugin oxfail 0.1 failed: KeyError: 'no such key' (oxfail, line 9, in ground_truth"),
        ("noneland", "run", "dataset noneland: its family's ground_truth() gave a NoneType, not a GroundTruth"),
        ("badlayout", "import", "dataset badlayout: its family's layout() must give Placement entries"),
    ],
)  # fmt: skip
def test_a_plugin_family_failing_at_run_time_is_one_line_naming_it(
    tmp_path: Path, dataset: str, command: str, message: str
) -> None:
    site = _dist_info_plugin(tmp_path / "site", "oxfail", FAILING_FAMILIES)
    root = tmp_path / "data"
    (root / dataset).mkdir(parents=True)
    np.save(tmp_path / "x.npy", np.eye(2, dtype=np.float32))
    args = {
        "run": ["run", "--dataset", dataset, "--root", str(root), "--method", "features",
                "--set", f"descriptor.db_features={tmp_path / 'x.npy'}",
                "--set", f"descriptor.query_features={tmp_path / 'x.npy'}",
                "--out", str(tmp_path / "runs"), "--no-progress"],
        "import": ["data", "import", dataset, "--root", str(root), "--from", str(tmp_path / "site"),
                   "--no-progress"],
    }[command]  # fmt: skip
    done = _python(site, "-m", "oxbench", *args, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("oxbench: error:")]
    assert message in line, line
    assert not (tmp_path / "runs").exists()
