"""Fuzzing every parser through the CLI: exit 2 with one line, or a valid result -- never a traceback.

Each test builds hostile inputs with hypothesis (pickled dicts of the revisitop layout with wrong
types, nested, ragged, boolean, float and out-of-int64 values, and random bytes; Oxford ground-truth
folders and ranked lists; Holidays image lists and result files; ``.npy`` arrays of every dtype and
shape, and random bytes) and runs ``oxbench evaluate`` in-process (``oxbench.cli.main``). Asserted
every time:

- the command either succeeds with a valid result (JSON, every AP in [0, 1]) or exits with code 2
  and exactly one line ``oxbench: error: ...`` on stderr and nothing on stdout;
- no exception escapes (a traceback would);
- nothing is written except the ``--per-query`` file named on the command line.

Runs derandomized (the same cases every time). The number of cases per test is ``max_examples``
(the sum is reported in the issue note); the whole file stays under a minute on one core.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxbench.cli import main

FUZZ = settings(
    deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


def fuzz(max_examples: int) -> settings:
    """The fuzzing settings with ``max_examples`` cases."""
    return settings(FUZZ, max_examples=max_examples)


# --- running the CLI -------------------------------------------------------------------------------


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (a FIFO read by a path that bypasses the checks would block)."""

    def handler(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the command did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
        for p in sorted(folder.rglob("*"))
    }


def run_cli(args: list[str], workdir: Path, output: Path | None = None) -> tuple[int, str, str]:
    """Run ``oxbench ARGS`` in-process; check the exit-2 contract and that nothing else is written."""
    before = _snapshot(workdir)
    out, err = io.StringIO(), io.StringIO()
    with _alarm(20), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    stdout, stderr = out.getvalue(), err.getvalue()
    after = _snapshot(workdir)
    written = {k for k in after if before.get(k, b"\0missing") != after[k]}
    allowed = {str(output.relative_to(workdir))} if output is not None else set()
    assert written <= allowed, (args, written)
    assert not {k for k in before if k not in after}, (args, "deleted an input")
    if code == 2:
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("oxbench: error: "), (args, stderr)
        assert stdout == "", (args, stdout)
    else:
        assert code == 0, (args, code, stderr)
        result = json.loads(stdout)
        _check_result(result)
    return code, stdout, stderr


def _check_result(result: Any) -> None:
    """Every AP / mAP / precision / N-S score in a JSON result is a finite number in range."""
    if isinstance(result, dict):
        for key, value in result.items():
            if isinstance(value, float) and any(
                w in key.lower() for w in ("ap", "precision", "p@")
            ):
                assert 0.0 <= value <= 1.0 or np.isnan(value), (key, value)
            _check_result(value)
    elif isinstance(result, list):
        for value in result:
            _check_result(value)


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="oxbench-fuzz-") as d:
        yield Path(d)


def _case_dir(workdir: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=workdir))


# --- hostile values --------------------------------------------------------------------------------

_huge_ints = st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -1, 10**400])
_scalars = st.one_of(
    st.integers(-3, 12),
    _huge_ints,
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2.0, 1.5, -0.0, 1e308]),
    st.text(max_size=4),
    st.none(),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=2),
    ),
    max_leaves=12,
)
_index_lists = st.one_of(
    st.lists(st.integers(0, 7), max_size=6, unique=True),  # mostly valid
    st.lists(st.integers(-2, 9), max_size=6),
    st.lists(_scalars, max_size=5),
    st.lists(st.lists(st.integers(0, 7), max_size=3), max_size=3),  # 2-D or ragged
    _values,
)
_bbx = st.one_of(
    st.lists(st.floats(0, 100), min_size=4, max_size=4),
    st.lists(_scalars, min_size=0, max_size=6),
    _values,
)
_names = st.sampled_from([f"img{i}" for i in range(8)])


def _split(draw: st.DrawFn, n: int, parts: int) -> list[list[int]]:
    """A random permutation of ``range(n)`` cut into ``parts`` disjoint lists (the rest unlabelled)."""
    perm = draw(st.permutations(range(n)))
    if n > parts and draw(st.booleans()):  # every list non-empty (so every setup has queries)
        inner = sorted(
            draw(
                st.lists(st.integers(1, n - 1), min_size=parts - 1, max_size=parts - 1, unique=True)
            )
        )
        cuts = [0, *inner, draw(st.integers((inner or [0])[-1] + 1, n))]
    else:
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=parts + 1, max_size=parts + 1)))
    return [list(perm[cuts[i] : cuts[i + 1]]) for i in range(parts)]


@st.composite
def revisitop_dicts(draw: st.DrawFn) -> Any:
    """A valid revisitop dict, then (five times in six) one hostile change."""
    n_db, n_q = draw(st.integers(1, 8)), draw(st.integers(1, 3))
    keys = draw(st.sampled_from([("easy", "hard", "junk"), ("ok", "junk")]))
    entries: list[Any] = []
    for _ in range(n_q):
        entry: dict[str, Any] = dict(zip(keys, _split(draw, n_db, len(keys)), strict=True))
        x, y = draw(st.floats(0, 500)), draw(st.floats(0, 500))
        entry["bbx"] = [x, y, x + draw(st.floats(0, 100)), y + draw(st.floats(0, 100))]
        entries.append(entry)
    obj: Any = {
        "imlist": [f"img{i}" for i in range(n_db)],
        "qimlist": [f"q{i}" for i in range(n_q)],
        "gnd": entries,
    }
    qi, key = draw(st.integers(0, n_q - 1)), draw(st.sampled_from(keys))
    mutation = draw(st.integers(0, 11))
    if mutation == 1:
        entries[qi][key] = draw(_index_lists)
    elif mutation == 2:
        entries[qi][key].append(draw(_scalars))  # one hostile label among good ones
    elif mutation == 3:
        entries[qi]["bbx"] = draw(_bbx)
    elif mutation == 4:
        entries[qi]["bbx"][draw(st.integers(0, 3))] = draw(_scalars)
    elif mutation == 5:
        del entries[qi][key]
    elif mutation == 6:
        entries[qi] = draw(_values)
    elif mutation == 7:
        obj[draw(st.sampled_from(["imlist", "qimlist"]))] = draw(
            st.one_of(_values, st.lists(st.one_of(_names, st.text(max_size=4)), max_size=4))
        )
    elif mutation == 8:
        obj["gnd"] = draw(_values)
    elif mutation == 9:
        obj = draw(_values)
    elif mutation == 10:
        entries[qi][key] = tuple(entries[qi][key])  # tuples are fine
    return obj


def _ranks_for(obj: Any, draw_seed: int) -> np.ndarray:
    """A ranks array that fits the dict when it can (so the parser's result is also scored)."""
    rng = np.random.default_rng(draw_seed)
    try:
        n_db, n_q = len(obj["imlist"]), len(obj["qimlist"])
    except Exception:  # noqa: BLE001 - any hostile shape: an arbitrary small array
        n_db, n_q = 3, 2
    n_db, n_q = max(1, min(n_db, 50)), max(1, min(n_q, 50))
    return np.stack([rng.permutation(n_db) for _ in range(n_q)], axis=1).astype(np.int64)


# --- revisitop pickles -----------------------------------------------------------------------------


@fuzz(800)
@given(
    obj=revisitop_dicts(),
    protocol=st.integers(0, pickle.HIGHEST_PROTOCOL),
    seed=st.integers(0, 2**16),
)
def test_fuzz_revisitop_pickles(workdir: Path, obj: Any, protocol: int, seed: int) -> None:
    case = _case_dir(workdir)
    try:
        data = pickle.dumps(obj, protocol=protocol)
    except (RecursionError, ValueError):
        return
    (case / "gnd_x.pkl").write_bytes(data)
    np.save(case / "ranks.npy", _ranks_for(obj, seed))
    per_query = case / "per_query.csv"
    entries = obj.get("gnd") if isinstance(obj, dict) else None
    old_protocol = isinstance(entries, list) and any(
        isinstance(e, dict) and "ok" in e for e in entries
    )
    cmd = "oxford" if old_protocol else "revisited"
    run_cli(
        [
            "evaluate",
            cmd,
            "--gnd",
            str(case / "gnd_x.pkl"),
            "--ranks",
            str(case / "ranks.npy"),
            "--json",
            "--per-query",
            str(per_query),
        ],
        case,
        per_query,
    )


@fuzz(400)
@given(
    data=st.one_of(
        st.binary(max_size=200),
        st.builds(
            lambda b, p: pickle.dumps({"imlist": ["a"], "qimlist": ["q"], "gnd": [{}]}, protocol=p)[
                :b
            ],
            st.integers(0, 60),
            st.integers(0, 5),
        ),  # truncated pickles
        st.builds(
            lambda pre, b: pre + b,
            st.sampled_from([b"\x80\x04\x95", b"\x80\x02}q\x00(", b"(lp0\n", b"cos\nsystem\n"]),
            st.binary(max_size=60),
        ),
    )
)
def test_fuzz_pickle_bytes(workdir: Path, data: bytes) -> None:
    case = _case_dir(workdir)
    (case / "gnd_x.pkl").write_bytes(data)
    np.save(case / "ranks.npy", np.zeros((3, 1), dtype=np.int64))
    code, _, _ = run_cli(
        [
            "evaluate",
            "revisited",
            "--gnd",
            str(case / "gnd_x.pkl"),
            "--ranks",
            str(case / "ranks.npy"),
            "--json",
        ],
        case,
    )
    assert code == 2  # random bytes never make a valid ground truth with these ranks


# --- Oxford text ground truth and ranked lists -----------------------------------------------------

_line_pieces = st.one_of(
    _names,
    st.sampled_from(
        [
            "",
            " ",
            "\t",
            "img1.jpg",
            "oxc1_img0",
            "img 1",
            "\r",
            "\x00",
            "é",
            "٣",
            "1" * 5000,
            ".jpg",
        ]
    ),
    st.text(max_size=6),
)
_lines = st.lists(_line_pieces, max_size=6).map(lambda parts: "\n".join(parts))
_numbers = st.one_of(
    st.sampled_from(
        [
            "0",
            "1.5",
            "100",
            "-3",
            "nan",
            "inf",
            "1e400",
            "1" * 5000,
            "0x10",
            "١٢",
            "",
            "1,5",
            "True",
        ]
    ),
    st.floats(allow_nan=True).map(repr),
    st.integers(-(2**70), 2**70).map(str),
)


@st.composite
def oxford_folders(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, str]]:
    """A valid ground-truth folder and ranked lists, then (mostly) one hostile file."""
    n_db = draw(st.integers(2, 8))
    names = [f"img{i}" for i in range(n_db)]
    gt: dict[str, str] = {}
    ranked: dict[str, str] = {}
    for qi in range(1, draw(st.integers(1, 3)) + 1):
        stem = f"land_{qi}"
        query = draw(st.sampled_from(names))
        good, ok, junk = _split(draw, n_db, 3)
        for kind, labels in (("good", good), ("ok", ok), ("junk", junk)):
            gt[f"{stem}_{kind}.txt"] = "".join(f"{names[i]}\n" for i in labels)
        x, y = draw(st.integers(0, 500)), draw(st.integers(0, 500))
        gt[f"{stem}_query.txt"] = (
            f"oxc1_{query} {x}.0 {y}.0 {x + draw(st.integers(0, 99))}.5 {y + 1}.0\n"
        )
        order = draw(st.permutations(names))[: draw(st.integers(0, n_db))]
        ranked[f"{stem}.txt"] = "\n".join(order)
    mutation = draw(st.integers(0, 5))
    target = gt if mutation in (1, 2) else ranked
    if mutation in (1, 3) and target:
        name = draw(st.sampled_from(sorted(target)))
        target[name] = draw(_lines)
    elif mutation == 2:
        name = draw(st.sampled_from(sorted(k for k in gt if k.endswith("_query.txt"))))
        tokens = [draw(st.sampled_from(["oxc1_img0", "img1", "img 2", "q"]))]
        tokens += [draw(_numbers) for _ in range(draw(st.sampled_from([4, 4, 4, 3, 5])))]
        gt[name] = " ".join(tokens) + draw(st.sampled_from(["\n", "", "\r\n", "\n\nx"]))
    elif mutation == 4:
        del gt[draw(st.sampled_from(sorted(gt)))]
    elif mutation == 5 and ranked:
        ranked[draw(st.sampled_from(sorted(ranked)))] += "\n" + draw(_line_pieces)
    return gt, ranked


@fuzz(500)
@given(folders=oxford_folders(), encoding=st.sampled_from(["utf-8", "utf-16", "latin-1"]))
def test_fuzz_oxford_gt_and_ranked_lists(
    workdir: Path, folders: tuple[dict[str, str], dict[str, str]], encoding: str
) -> None:
    case = _case_dir(workdir)
    gt, ranked = folders
    for sub, files in (("gt", gt), ("ranked", ranked)):
        (case / sub).mkdir()
        for name, text in files.items():
            (case / sub / name).write_bytes(
                text.encode(encoding, "replace" if encoding == "latin-1" else "surrogatepass")
            )
    per_query = case / "pq.csv"
    run_cli(
        [
            "evaluate",
            "oxford",
            "--gt-dir",
            str(case / "gt"),
            "--ranked-dir",
            str(case / "ranked"),
            "--json",
            "--per-query",
            str(per_query),
        ],
        case,
        per_query,
    )


# --- Holidays image lists and result files ---------------------------------------------------------

_holiday_names = st.one_of(
    st.sampled_from(
        [
            "100000.jpg",
            "100001.jpg",
            "100002",
            "100100.jpg",
            "100101.jpg",
            "100000.JPG",
            "100000.png",
        ]
    ),
    st.sampled_from(
        [
            "1" * 5000,
            "1" * 5000 + ".jpg",
            "0" * 4400 + "100000.jpg",
            "٣٣٣٣٣٣.jpg",
            "-100000.jpg",
            "",
        ]
    ),
    st.integers(0, 10**7).map(lambda n: f"{n}.jpg"),
    st.text(max_size=8),
)
_holiday_ranks = st.one_of(
    st.integers(0, 12).map(str),
    st.sampled_from(["-1", "1.0", "1e3", "9" * 5000, "٣", "+1", "0x1", "", "00", "1_0"]),
    st.integers(2**62, 2**70).map(str),
)


_HOLIDAYS = ["100000", "100001", "100002", "100100", "100101", "100200"]


@st.composite
def holidays_files(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    """A valid image list and result file, then (mostly) one hostile token, line or name."""
    images = [f"{n}.jpg" for n in _HOLIDAYS]
    lines: list[list[str]] = []
    for q in (n for n in _HOLIDAYS if int(n) % 100 == 0):
        order = draw(st.permutations(_HOLIDAYS))[: draw(st.integers(0, len(_HOLIDAYS)))]
        ranks = sorted(
            draw(
                st.lists(
                    st.integers(0, len(_HOLIDAYS) - 1),
                    min_size=len(order),
                    max_size=len(order),
                    unique=True,
                )
            )
        )
        lines.append(
            [f"{q}.jpg"]
            + [t for r, n in zip(ranks, order, strict=True) for t in (str(r), f"{n}.jpg")]
        )
    mutation = draw(st.integers(0, 6))
    li = draw(st.integers(0, len(lines) - 1))
    if mutation == 1:
        pos = draw(st.integers(0, len(lines[li]) - 1))
        lines[li][pos] = draw(st.one_of(_holiday_names, _holiday_ranks))
    elif mutation == 2:
        lines[li] += [draw(_holiday_ranks), draw(_holiday_names)]
    elif mutation == 3:
        lines.append(draw(st.lists(st.one_of(_holiday_names, _holiday_ranks), max_size=8)))
    elif mutation == 4:
        images[draw(st.integers(0, len(images) - 1))] = draw(_holiday_names)
    elif mutation == 5:
        images = draw(st.lists(_holiday_names, max_size=7))
    elif mutation == 6:
        del lines[li]
    return images, lines


@fuzz(800)
@given(files=holidays_files())
def test_fuzz_holidays_files(workdir: Path, files: tuple[list[str], list[list[str]]]) -> None:
    case = _case_dir(workdir)
    images, lines = files
    (case / "images.dat").write_text("\n".join(images), encoding="utf-8", errors="surrogatepass")
    (case / "results.dat").write_text(
        "\n".join(" ".join(t) for t in lines), encoding="utf-8", errors="surrogatepass"
    )
    per_query = case / "pq.csv"
    run_cli(
        [
            "evaluate",
            "holidays",
            "--images",
            str(case / "images.dat"),
            "--results",
            str(case / "results.dat"),
            "--json",
            "--per-query",
            str(per_query),
        ],
        case,
        per_query,
    )


# --- .npy inputs -----------------------------------------------------------------------------------

_dtypes = st.sampled_from(
    [
        "int64",
        "int32",
        "int8",
        "uint64",
        "uint8",
        "float64",
        "float32",
        "float16",
        "bool",
        "complex64",
        "U3",
        "S2",
        "datetime64[s]",
        "timedelta64[s]",
        "V4",
        "i4,f4",
        ">i8",
        "<f8",
    ]
)
_shapes = st.one_of(
    st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple),
    st.sampled_from([(5, 0), (0, 5), (12, 12), (4, 12), (12, 1), (1, 12)]),
)


@st.composite
def npy_arrays(draw: st.DrawFn) -> np.ndarray:
    """Half the time a valid input (ranks of 12 images x 2 queries, or scores), else anything."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if draw(st.booleans()):
        k = draw(st.integers(1, 12))
        good = np.stack([rng.permutation(12)[:k] for _ in range(2)], axis=1)
        kind = draw(st.sampled_from(["ranks", "scores", "ukbench"]))
        if kind == "scores":
            good = rng.normal(size=(12, 2)).astype(draw(st.sampled_from(["float32", "float64"])))
        elif kind == "ukbench":
            good = np.stack([rng.permutation(12)[:k] for _ in range(12)], axis=1)
        if draw(st.booleans()):  # one hostile value
            flat = good.reshape(-1).astype(np.float64)
            flat[draw(st.integers(0, flat.size - 1))] = draw(
                st.sampled_from([-1, 12, 15, 2**62, np.nan, 0.5])
            )
            with np.errstate(all="ignore"):
                good = flat.reshape(good.shape).astype(
                    good.dtype if draw(st.booleans()) else np.float64
                )
        return good
    dtype = np.dtype(draw(_dtypes))
    shape = draw(_shapes)
    size = int(np.prod(shape)) if shape else 1
    raw = rng.integers(-3, 15, size=size)
    special = draw(st.sampled_from([None, "huge", "nan", "inf"]))
    arr = np.zeros(shape, dtype=dtype)
    with contextlib.suppress(TypeError, ValueError, OverflowError):
        vals = raw.astype(np.float64)
        if special == "huge":
            vals[:: max(1, size // 2)] = 9.3e18 if dtype.kind in "iu" else 1e300
        elif special in ("nan", "inf") and dtype.kind in "fc":
            vals[:: max(1, size // 3)] = np.nan if special == "nan" else np.inf
        with np.errstate(all="ignore"):
            arr = (
                vals.astype(dtype).reshape(shape) if dtype.kind not in "VUS" or dtype.names else arr
            )
    return arr


def _good_gnd(case: Path, n_db: int = 12, n_q: int = 2) -> Path:
    from oxbench.formats.revisitop import write_gnd
    from oxbench.groundtruth import GroundTruth, make_query

    queries = tuple(
        make_query(f"q{i}", (0.0, 0.0, 5.0, 5.0), easy=[i], hard=[i + 2], junk=[i + 4])
        for i in range(n_q)
    )
    gt = GroundTruth("x", "revisited", tuple(f"img{i}" for i in range(n_db)), queries)
    return write_gnd(gt, case / "gnd_x.pkl")


@fuzz(800)
@given(
    arr=npy_arrays(),
    option=st.sampled_from(
        ["--ranks", "--scores", "features", "ukbench-ranks", "ukbench-scores", "raw"]
    ),
    raw=st.binary(max_size=120),
    distractors=st.sampled_from(["0", "0", "3"]),
)
def test_fuzz_npy_inputs(
    workdir: Path, arr: np.ndarray, option: str, raw: bytes, distractors: str
) -> None:
    case = _case_dir(workdir)
    npy = case / "input.npy"
    if option == "raw":  # bytes that start like a .npy file, then anything
        npy.write_bytes(b"\x93NUMPY\x01\x00" + raw)
        option = "--ranks"
    else:
        np.save(npy, arr, allow_pickle=False)
    gnd = _good_gnd(case)
    if option.startswith("ukbench"):
        args = [
            "evaluate",
            "ukbench",
            "--ranks" if option.endswith("ranks") else "--scores",
            str(npy),
            "--json",
        ]
    elif option == "features":
        q = case / "q.npy"
        np.save(q, arr[:2] if arr.ndim else arr)
        args = [
            "evaluate",
            "revisited",
            "--gnd",
            str(gnd),
            "--db-features",
            str(npy),
            "--query-features",
            str(q),
            "--json",
            "--distractors",
            distractors,
        ]
    else:
        args = [
            "evaluate",
            "revisited",
            "--gnd",
            str(gnd),
            option,
            str(npy),
            "--json",
            "--distractors",
            distractors,
        ]
    run_cli(args, case)


# --- special files as inputs -----------------------------------------------------------------------


def _special_inputs(case: Path) -> dict[str, Path]:
    fifo = case / "fifo"
    os.mkfifo(fifo)
    return {"fifo": fifo, "zero": Path("/dev/zero"), "folder": case}


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder"])
@pytest.mark.parametrize(
    "where", ["gnd", "ranks", "scores", "images", "results", "gt-file", "ranked-file"]
)
def test_special_files_as_inputs_are_refused(workdir: Path, kind: str, where: str) -> None:
    case = _case_dir(workdir)
    special = _special_inputs(case)[kind]
    gnd = _good_gnd(case)
    ranks = case / "ranks.npy"
    np.save(ranks, np.arange(24).reshape(12, 2) % 12)
    images = case / "images.dat"
    images.write_text("100000.jpg\n100001.jpg\n")
    results = case / "results.dat"
    results.write_text("100000.jpg 0 100001.jpg\n")
    gt_dir, ranked_dir = case / "gt", case / "ranked"
    gt_dir.mkdir()
    ranked_dir.mkdir()
    for k in ("good", "ok", "junk"):
        (gt_dir / f"land_1_{k}.txt").write_text("img1\n")
    (gt_dir / "land_1_query.txt").write_text("oxc1_img0 0 0 5 5\n")
    (ranked_dir / "img0.txt").write_text("img1\nimg0\n")
    if where == "gt-file":
        (gt_dir / "land_1_junk.txt").unlink()
        (gt_dir / "land_1_junk.txt").symlink_to(special)
    if where == "ranked-file":
        (ranked_dir / "img0.txt").unlink()
        (ranked_dir / "img0.txt").symlink_to(special)
    args = {
        "gnd": ["evaluate", "revisited", "--gnd", str(special), "--ranks", str(ranks)],
        "ranks": ["evaluate", "revisited", "--gnd", str(gnd), "--ranks", str(special)],
        "scores": ["evaluate", "revisited", "--gnd", str(gnd), "--scores", str(special)],
        "images": ["evaluate", "holidays", "--images", str(special), "--results", str(results)],
        "results": ["evaluate", "holidays", "--images", str(images), "--results", str(special)],
        "gt-file": ["evaluate", "oxford", "--gt-dir", str(gt_dir), "--ranked-dir", str(ranked_dir)],
        "ranked-file": [
            "evaluate",
            "oxford",
            "--gt-dir",
            str(gt_dir),
            "--ranked-dir",
            str(ranked_dir),
        ],
    }[where]
    code, _, err = run_cli([*args, "--json"], case)
    assert code == 2, err
