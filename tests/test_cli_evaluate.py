"""``oxbench evaluate``: the CLI contract (JSON keys, exit codes, one-line errors, nothing written)."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.evaluation import evaluate, ranks_from_scores, to_revisitop
from oxbench.formats.revisitop import write_gnd
from oxbench.groundtruth import GroundTruth, make_query


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture
def rev(tmp_path, rng):
    n_db, nq = 40, 3
    queries = []
    for q in range(nq):
        perm = rng.permutation(n_db)
        queries.append(
            make_query(f"q{q}", [0, 0, 5, 5], easy=perm[:3], hard=perm[3:6], junk=perm[6:8])
        )
    gt = GroundTruth("roxford5k", "revisited", tuple(f"im{i}" for i in range(n_db)), tuple(queries))
    gnd = tmp_path / "gnd_roxford5k.pkl"
    write_gnd(gt, gnd)
    x = rng.standard_normal((n_db + 5, 8)).astype(np.float32)
    qf = rng.standard_normal((nq, 8)).astype(np.float32)
    scores = x @ qf.T
    ranks = to_revisitop(ranks_from_scores(scores))
    paths = {}
    for name, arr in {
        "x": x,
        "q": qf,
        "s": scores,
        "r": ranks,
        "r_db": ranks_from_scores(scores[:n_db]).T,
    }.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], arr)
    return types.SimpleNamespace(gt=gt, gnd=gnd, paths=paths, ranks=ranks, tmp=tmp_path)


def test_revisited_json_contract_all_inputs(rev, capsys):
    p = rev.paths
    expected = evaluate(rev.gt, rev.ranks.T, n_distractors=5)
    outs = []
    for extra in (
        ["--ranks", p["r"]],
        ["--scores", p["s"]],
        ["--db-features", p["x"], "--query-features", p["q"]],
    ):
        code, out, err = run(
            [
                "evaluate",
                "revisited",
                "--gnd",
                str(rev.gnd),
                *map(str, extra),
                "--distractors",
                "5",
                "--json",
            ],
            capsys,
        )
        assert code == 0, err
        outs.append(json.loads(out))
    assert outs[0] == outs[1] == outs[2]
    d = outs[0]
    assert set(d) == {"setups"} and list(d["setups"]) == ["easy", "medium", "hard"]
    for name, s in d["setups"].items():
        assert set(s) == {"map", "mp@1", "mp@5", "mp@10", "ap"}
        assert s["map"] == expected.setups[name].map  # full precision, fractions
        assert len(s["ap"]) == 3


def test_revisited_text_output_and_ks(rev, capsys):
    code, out, err = run(
        [
            "evaluate",
            "revisited",
            "--gnd",
            str(rev.gnd),
            "--ranks",
            str(rev.paths["r_db"]),
            "--ks",
            "1,3",
        ],
        capsys,
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("roxford5k: mAP E: ") and ", M: " in lines[0] and ", H: " in lines[0]
    assert lines[1].startswith("roxford5k: mP@k[1 3] E: [")
    assert "mP@3" in out and "medium" in out
    code, out, _ = run(
        [
            "evaluate",
            "revisited",
            "--gnd",
            str(rev.gnd),
            "--ranks",
            str(rev.paths["r_db"]),
            "--ks",
            "1,3",
            "--json",
        ],
        capsys,
    )
    assert set(json.loads(out)["setups"]["hard"]) == {"map", "mp@1", "mp@3", "ap"}


def test_per_query_csv(rev, capsys):
    csv_path = rev.tmp / "pq.csv"
    code, _, err = run(
        [
            "evaluate",
            "revisited",
            "--gnd",
            str(rev.gnd),
            "--ranks",
            str(rev.paths["r_db"]),
            "--per-query",
            str(csv_path),
        ],
        capsys,
    )
    assert code == 0, err
    text = csv_path.read_text().splitlines()
    assert text[0].startswith("setup,query_index,query,n_positives,ap,p@1")
    assert len(text) == 1 + 3 * 3


def _bad(rev, tmp):
    p = rev.paths
    r = np.load(p["r_db"])
    dup = r.copy()
    dup[5, 1] = dup[0, 1]
    np.save(tmp / "dup.npy", dup)
    np.save(tmp / "oned.npy", r[:, 0])
    np.save(tmp / "cols.npy", r[:, :2])
    np.save(tmp / "neg.npy", np.where(r == 7, -3, r))
    np.save(tmp / "frac.npy", r.astype(float) + 0.5)
    (tmp / "junk.npy").write_bytes(b"not an array")
    gnd = str(rev.gnd)
    return [
        (["--gnd", gnd, "--ranks", str(tmp / "dup.npy")], "query 1 (q1): image"),
        (["--gnd", gnd, "--ranks", str(tmp / "oned.npy")], "2-D"),
        (
            ["--gnd", gnd, "--ranks", str(tmp / "cols.npy")],
            "2 columns but the ground truth has 3 queries",
        ),
        (["--gnd", gnd, "--ranks", str(tmp / "neg.npy")], "holds index -3"),
        (["--gnd", gnd, "--ranks", str(tmp / "frac.npy")], "these look like scores: use --scores"),
        (
            ["--gnd", gnd, "--ranks", str(p["r"])],
            "but database indices are 0..39",
        ),  # distractors undeclared
        (["--gnd", gnd, "--ranks", str(tmp / "missing.npy")], "ranks file not found"),
        (["--gnd", gnd, "--ranks", str(tmp / "junk.npy")], "not a readable .npy"),
        (["--gnd", str(tmp / "nope.pkl"), "--ranks", str(p["r_db"])], "nope.pkl"),
        (["--gnd", gnd], "give exactly one of --ranks"),
        (
            ["--gnd", gnd, "--ranks", str(p["r_db"]), "--scores", str(p["s"])],
            "give exactly one of --ranks",
        ),
        (["--ranks", str(p["r_db"])], "give exactly one of --gnd or --dataset"),
        (["--gnd", gnd, "--scores", str(p["s"])], "45 rows but the database has 40 images"),
        (["--gnd", gnd, "--ranks", str(p["r_db"]), "--ks", "1,x"], "--ks"),
        (["--gnd", gnd, "--db-features", str(p["x"])], "go together"),
        (
            ["--gnd", gnd, "--ranks", str(p["r_db"]), "--distractors", "-3"],
            "--distractors must be >= 0",
        ),
    ]


def test_bad_input_exit_2_one_line_nothing_written(rev, capsys):
    for args, needle in _bad(rev, rev.tmp):
        out_csv = rev.tmp / "never.csv"
        code, out, err = run(
            ["evaluate", "revisited", *args, "--per-query", str(out_csv), "--json"], capsys
        )
        assert code == 2, (args, out, err)
        assert out == ""
        assert len(err.strip().splitlines()) == 1, err
        assert needle in err, (needle, err)
        assert "Traceback" not in err
        assert not out_csv.exists()


def test_protocol_mismatch(rev, capsys, tmp_path):
    old = GroundTruth(
        "oxford5k", "original", tuple("abcd"), (make_query("a", ok=[0, 1], junk=[2]),)
    )
    write_gnd(old, tmp_path / "gnd_oxford5k.pkl")
    np.save(tmp_path / "r1.npy", np.array([[0], [2], [1], [3]]))
    code, _, err = run(
        [
            "evaluate",
            "revisited",
            "--gnd",
            str(tmp_path / "gnd_oxford5k.pkl"),
            "--ranks",
            str(tmp_path / "r1.npy"),
        ],
        capsys,
    )
    assert code == 2 and "use 'oxbench evaluate oxford'" in err
    code, out, err = run(
        [
            "evaluate",
            "oxford",
            "--gnd",
            str(tmp_path / "gnd_oxford5k.pkl"),
            "--ranks",
            str(tmp_path / "r1.npy"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out) == {"map": 1.0, "ap": {"a": 1.0}}
    code, _, err = run(
        ["evaluate", "oxford", "--gnd", str(rev.gnd), "--ranks", str(rev.paths["r_db"])], capsys
    )
    assert code == 2 and "use 'oxbench evaluate revisited'" in err


@pytest.mark.shared_data
def test_dataset_option_reads_installed_ground_truth(shared_data, capsys, tmp_path):
    """--dataset ID --root DIR scores against <root>/<id>/gnd_<id>.pkl; no images are needed."""
    from oxbench.formats.revisitop import read_gnd

    root = tmp_path / "data"
    (root / "roxford5k").mkdir(parents=True)
    real = shared_data / "roxford5k" / "gnd_roxford5k.pkl"
    (root / "roxford5k" / "gnd_roxford5k.pkl").symlink_to(real)
    gt = read_gnd(real)
    rng = np.random.default_rng(3)
    ranks = np.stack([rng.permutation(gt.n_db) for _ in range(gt.n_queries)])  # internal layout
    path = tmp_path / "ranks.npy"
    np.save(path, ranks.T)
    code, out, err = run(
        [
            "evaluate",
            "revisited",
            "--dataset",
            "roxford5k",
            "--root",
            str(root),
            "--ranks",
            str(path),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out)["setups"]["hard"]["map"] == evaluate(gt, ranks).setups["hard"].map


def test_dataset_option_missing_dataset_is_one_line(rev, capsys, tmp_path):
    code, out, err = run(
        [
            "evaluate",
            "revisited",
            "--dataset",
            "rparis6k",
            "--root",
            str(tmp_path),
            "--ranks",
            str(rev.paths["r_db"]),
        ],
        capsys,
    )
    assert code == 2 and "rparis6k" in err and len(err.strip().splitlines()) == 1
    assert out == ""


def _write_oxford_gt(d):
    """A tiny original-protocol folder: one landmark, two queries."""
    d.mkdir()
    files = {
        "tower_1": (
            "oxc1_tower_000001 1 2 30 40",
            ["tower_000002", "tower_000003"],
            ["tower_000001"],
            ["tower_000004"],
        ),
        "tower_2": ("oxc1_tower_000002 0 0 10 10", ["tower_000001"], ["tower_000003"], []),
    }
    for qid, (qline, good, ok, junk) in files.items():
        (d / f"{qid}_query.txt").write_text(qline + "\n")
        (d / f"{qid}_good.txt").write_text("".join(n + "\n" for n in good))
        (d / f"{qid}_ok.txt").write_text("".join(n + "\n" for n in ok))
        (d / f"{qid}_junk.txt").write_text("".join(n + "\n" for n in junk))


def test_oxford_text_files(tmp_path, capsys):
    _write_oxford_gt(tmp_path / "gt")
    ranked = tmp_path / "ranked"
    ranked.mkdir()
    # query 1: positives 1,2,3 (junk 4); query 2: positives 1,3
    (ranked / "tower_000001.txt").write_text(
        "tower_000004\ntower_000001\nother_1\ntower_000002\ntower_000003\n"
    )
    (ranked / "tower_000002.txt").write_text("tower_000003\ntower_000001\n")
    code, out, err = run(
        [
            "evaluate",
            "oxford",
            "--gt-dir",
            str(tmp_path / "gt"),
            "--ranked-dir",
            str(ranked),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    d = json.loads(out)
    ap1 = (1.0 + 1.0) / 2 / 3 + (1 / 2 + 2 / 3) / 2 / 3 + (2 / 3 + 3 / 4) / 2 / 3
    assert d["ap"] == {
        "tower_1": pytest.approx(ap1, abs=1e-12),
        "tower_2": 1.0,
    }  # keyed by query id
    assert d["map"] == pytest.approx((ap1 + 1.0) / 2, abs=1e-12)
    (ranked / "tower_000002.txt").write_text("tower_000003\ntower_000001\ntower_000003\n")
    code, out, err = run(
        ["evaluate", "oxford", "--gt-dir", str(tmp_path / "gt"), "--ranked-dir", str(ranked)],
        capsys,
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_holidays_and_ukbench(tmp_path, capsys):
    (tmp_path / "images.dat").write_text(
        "100000.jpg\n100001.jpg\n100002.jpg\n100100.jpg\n100101.jpg\n"
    )
    (tmp_path / "res.txt").write_text(
        "100000.jpg 0 100000.jpg 1 100101.jpg 2 100002.jpg 3 100001.jpg\n100100.jpg 0 100101.jpg\n"
    )
    code, out, err = run(
        [
            "evaluate",
            "holidays",
            "--results",
            str(tmp_path / "res.txt"),
            "--images",
            str(tmp_path / "images.dat"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    d = json.loads(out)
    # query 100000: itself ignored; 100101 negative at rank 0, positives at ranks 1, 2
    ap0 = ((0 + 1 / 2) / 2 + (1 / 2 + 2 / 3) / 2) / 2
    assert d["ap"] == {"100000": pytest.approx(ap0, abs=1e-12), "100100": 1.0}
    assert set(d) == {"map", "ap"}

    r = np.array([[i, *[j for j in range(8) if j != i]] for i in range(8)]).T
    np.save(tmp_path / "uk.npy", r)
    code, out, err = run(
        ["evaluate", "ukbench", "--ranks", str(tmp_path / "uk.npy"), "--json"], capsys
    )
    assert code == 0, err
    exp = np.mean([sum(1 for j in r[:4, i] if j // 4 == i // 4) for i in range(8)])
    assert json.loads(out) == {"score": pytest.approx(exp)}
    np.save(tmp_path / "uk3.npy", r[:3])
    code, _, err = run(["evaluate", "ukbench", "--ranks", str(tmp_path / "uk3.npy")], capsys)
    assert code == 2 and "top 4" in err
    np.save(tmp_path / "uk6.npy", r[:, :6][:6])
    code, _, err = run(["evaluate", "ukbench", "--ranks", str(tmp_path / "uk6.npy")], capsys)
    assert code == 2 and "multiple of 4" in err


@pytest.mark.shared_data
def test_real_oxford_gt_dir_and_pickle_agree(shared_data, tmp_path, capsys):
    """Ranked text files from the real 128-D descriptors: 40.29 through both ground-truth forms."""
    from oxbench.formats.revisitop import read_gnd

    old = read_gnd(shared_data / "oxford5k/gnd_oxford5k.pkl")
    raw = np.fromfile(shared_data / "oxford5k/lopq_features/oxford_features.fvecs", dtype=np.int32)
    x = raw.reshape(-1, int(raw[0]) + 1)[:, 1:].view(np.float32)
    row = {n: i for i, n in enumerate(sorted(old.db_names))}
    x = x[[row[n] for n in old.db_names]]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    pos = {n: i for i, n in enumerate(old.db_names)}
    ranks = ranks_from_scores(x @ x[[pos[n] for n in old.query_names]].T)
    ranked = tmp_path / "ranked"
    ranked.mkdir()
    for q, name in enumerate(old.query_names):
        (ranked / f"{name}.txt").write_text("\n".join(old.db_names[i] for i in ranks[q]) + "\n")
    np.save(tmp_path / "r.npy", ranks.T)
    code, out, err = run(
        [
            "evaluate",
            "oxford",
            "--gt-dir",
            str(shared_data / "oxford5k/gt_files_170407"),
            "--ranked-dir",
            str(ranked),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    a = json.loads(out)
    code, out, err = run(
        [
            "evaluate",
            "oxford",
            "--gnd",
            str(shared_data / "oxford5k/gnd_oxford5k.pkl"),
            "--ranks",
            str(tmp_path / "r.npy"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    b = json.loads(out)
    assert round(100 * a["map"], 2) == round(100 * b["map"], 2) == 40.29
    assert a["ap"] == pytest.approx(b["ap"], abs=1e-12)


@pytest.mark.shared_data
def test_real_holidays_result_file(shared_data, capsys):
    """The real (truncated, top-10) Holidays result file: our trapezoid AP gives about 0.689."""
    code, out, err = run(
        [
            "evaluate",
            "holidays",
            "--results",
            str(shared_data / "holidays/peng_result.txt"),
            "--images",
            str(shared_data / "holidays/holidays_images.dat"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    d = json.loads(out)
    assert len(d["ap"]) == 500
    assert round(d["map"], 3) == 0.689


# ---------------------------------------------------------------------------------------------
# Inputs as users have them (issue 8), bounded numbers and safe outputs (issue 10)


def _one_line_error(code, out, err, needle):
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, (needle, err)
    assert "Traceback" not in err


def test_faiss_padding_only_when_asked_and_recorded(rev, capsys):
    internal = np.load(rev.paths["r_db"]).T  # [n_queries, n_db]
    padded = internal.copy()
    padded[1, 30:] = -1  # FAISS: fewer results than k for query 1
    np.save(rev.tmp / "pad.npy", padded.T)
    base = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--ranks",
        str(rev.tmp / "pad.npy"),
        "--json",
    ]
    _one_line_error(*run(base, capsys), "query 1 (q1): rank position 30 holds index -1")
    code, out, err = run([*base, "--padding", "-1"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["padding"] == -1
    assert d["setups"]["hard"]["map"] == evaluate(rev.gt, padded, padding=-1).setups["hard"].map
    inner = padded.copy()
    inner[0, 3] = -1
    np.save(rev.tmp / "inner.npy", inner.T)
    args = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--ranks",
        str(rev.tmp / "inner.npy"),
        "--padding",
        "-1",
    ]
    _one_line_error(*run(args, capsys), "padding may only end a list")


def test_short_lists_reported_once_on_stderr(rev, capsys):
    np.save(rev.tmp / "top5.npy", np.load(rev.paths["r_db"])[:5])
    code, out, err = run(
        ["evaluate", "revisited", "--gnd", str(rev.gnd), "--ranks", str(rev.tmp / "top5.npy")],
        capsys,
    )
    assert code == 0, err
    assert err.strip().splitlines() == [f"{rev.tmp / 'top5.npy'}: ranks cover top 5 of 40 images"]
    assert out.startswith("roxford5k: mAP E: ")


def test_text_ranks_and_revisitop_mat_features(rev, capsys):
    import scipy.io

    internal = np.load(rev.paths["r_db"]).T
    (rev.tmp / "r.txt").write_text(
        "".join(" ".join(map(str, row[: 40 - 5 * i])) + "\n" for i, row in enumerate(internal))
    )
    code, out, err = run(
        [
            "evaluate",
            "revisited",
            "--gnd",
            str(rev.gnd),
            "--ranks",
            str(rev.tmp / "r.txt"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    ragged = np.full_like(internal, -1)
    for i, row in enumerate(internal):
        ragged[i, : 40 - 5 * i] = row[: 40 - 5 * i]
    assert (
        json.loads(out)["setups"]["medium"]["map"]
        == evaluate(rev.gt, ragged, padding=-1).setups["medium"].map
    )

    x, q = np.load(rev.paths["x"])[:40], np.load(rev.paths["q"])
    scipy.io.savemat(rev.tmp / "feats.mat", {"X": x.T, "Q": q.T})  # revisitop: d x n
    mat = str(rev.tmp / "feats.mat")
    base = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--db-features",
        mat,
        "--query-features",
        mat,
        "--key",
        "X",
        "--query-key",
        "Q",
        "--json",
    ]
    code, out, err = run([*base, "--layout", "d-n", "--normalize"], capsys)
    assert code == 0, err
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    want = evaluate(rev.gt, ranks_from_scores(xn @ qn.T))
    assert json.loads(out)["setups"]["hard"]["ap"] == pytest.approx(
        list(want.setups["hard"].ap), abs=1e-12
    )
    _one_line_error(*run(base, capsys), "the file is transposed, use --layout d-n")
    _one_line_error(
        *run(
            [
                "evaluate",
                "revisited",
                "--gnd",
                str(rev.gnd),
                "--db-features",
                mat,
                "--query-features",
                mat,
                "--layout",
                "d-n",
            ],
            capsys,
        ),
        "holds Q, X: choose one with --key",
    )
    (rev.tmp / "feats.csv").write_text("1,2\n")
    _one_line_error(
        *run(
            [
                "evaluate",
                "revisited",
                "--gnd",
                str(rev.gnd),
                "--db-features",
                str(rev.tmp / "feats.csv"),
                "--query-features",
                mat,
            ],
            capsys,
        ),
        "features are read from .npy, .npz, .mat, .h5, .fvecs, .bvecs",
    )


def test_malformed_new_inputs_exit_2_and_write_nothing(rev, capsys):
    t = rev.tmp
    (t / "empty.txt").write_text("")
    (t / "word.txt").write_text("0 1 x\n")
    (t / "trunc.fvecs").write_bytes(np.int32(8).tobytes() + b"\0" * 10)
    (t / "trunc.npz").write_bytes(b"PK\x03\x04broken")
    (t / "trunc.mat").write_bytes(b"MATLAB 5.0 MAT-file" + b"\0" * 20)
    (t / "trunc.ivecs").write_bytes(np.int32(3).tobytes() + b"\0" * 5)
    gnd = str(rev.gnd)
    cases = [
        (["--ranks", str(t / "empty.txt")], "empty file"),
        (["--ranks", str(t / "word.txt")], "'x' is not an integer index"),
        (["--ranks", str(t / "trunc.ivecs")], "not a multiple of the record size"),
        (["--ranks", str(t / "trunc.npz")], "not a readable .npz"),
        (["--scores", str(t / "trunc.mat")], "not a readable MATLAB"),
        (
            ["--db-features", str(t / "trunc.fvecs"), "--query-features", str(rev.paths["q"])],
            "not a multiple",
        ),
    ]
    for args, needle in cases:
        out_csv = t / "never.csv"
        code, out, err = run(
            ["evaluate", "revisited", "--gnd", gnd, *args, "--per-query", str(out_csv)], capsys
        )
        _one_line_error(code, out, err, needle)
        assert out == "" and not out_csv.exists()


@pytest.mark.parametrize("n", ["9223372036854775807", "99999999999999999999999"])
def test_absurd_distractor_counts_are_one_line(rev, capsys, n):
    args = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--ranks",
        str(rev.paths["r_db"]),
        "--distractors",
        n,
    ]
    _one_line_error(*run(args, capsys), "is beyond any collection")


def test_memory_does_not_grow_with_the_declared_distractor_count(rev, capsys):
    import tracemalloc

    args = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--ranks",
        str(rev.paths["r_db"]),
        "--json",
    ]
    for accel in ("1", "0"):
        import os

        os.environ["OXBENCH_NO_ACCEL"] = accel
        try:
            tracemalloc.start()
            code, out, err = run([*args, "--distractors", "2147483648"], capsys)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        finally:
            del os.environ["OXBENCH_NO_ACCEL"]
        assert code == 0, err
        assert peak < 20 << 20, peak  # 2 GB before (a table over every declared index)
        assert (
            json.loads(out)["setups"]["easy"]["map"]
            == evaluate(rev.gt, np.load(rev.paths["r_db"]).T).setups["easy"].map
        )


def test_products_overflowing_to_inf_are_refused(rev, capsys):
    big = np.full((40, 8), 1e20, np.float32)  # finite, but every product is inf: all scores tied
    np.save(rev.tmp / "big.npy", big)
    np.save(rev.tmp / "bigq.npy", np.full((3, 8), 1e20, np.float32))
    args = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--db-features",
        str(rev.tmp / "big.npy"),
        "--query-features",
        str(rev.tmp / "bigq.npy"),
    ]
    _one_line_error(*run(args, capsys), "overflows float32")


def test_per_query_output_refuses_links_and_special_files(rev, capsys, tmp_path):
    import os

    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    for path, needle in ((link, "symbolic link"), (fifo, "special file"), (tmp_path, "folder")):
        args = [
            "evaluate",
            "revisited",
            "--gnd",
            str(rev.gnd),
            "--ranks",
            str(rev.paths["r_db"]),
            "--per-query",
            str(path),
        ]
        code, out, err = run(args, capsys)
        _one_line_error(code, out, err, needle)
    assert target.read_text() == "keep me\n" and link.is_symlink()
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_metrics_are_printed_before_a_failed_write(rev, capsys, monkeypatch):
    import oxbench.fileio

    def fail(path, text):
        raise oxbench.errors.InputError("cannot write: No space left on device", path)

    monkeypatch.setattr(oxbench.fileio, "atomic_write_text", fail)
    args = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--ranks",
        str(rev.paths["r_db"]),
        "--per-query",
        str(rev.tmp / "pq.csv"),
        "--json",
    ]
    code, out, err = run(args, capsys)
    _one_line_error(code, out, err, "No space left on device")
    assert (
        json.loads(out)["setups"]["easy"]["map"]
        == evaluate(rev.gt, np.load(rev.paths["r_db"]).T).setups["easy"].map
    )


def test_holidays_and_ukbench_report_capped_mpk_only_when_asked(tmp_path, capsys):
    (tmp_path / "images.dat").write_text(
        "100000.jpg\n100001.jpg\n100002.jpg\n100100.jpg\n100101.jpg\n"
    )
    (tmp_path / "res.txt").write_text(
        "100000.jpg 0 100001.jpg 2 100002.jpg\n100100.jpg 0 100101.jpg\n"
    )
    base = [
        "evaluate",
        "holidays",
        "--results",
        str(tmp_path / "res.txt"),
        "--images",
        str(tmp_path / "images.dat"),
    ]
    code, out, err = run(base, capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith("holidays: mAP ") and "mP@" not in out
    code, out, err = run([*base, "--ks", "1,5"], capsys)
    assert code == 0, err
    assert "mP@k[1 5]" in out.splitlines()[0] and "mP@5" in out
    r = np.array([[i, *[j for j in range(8) if j != i]] for i in range(8)]).T
    np.save(tmp_path / "uk.npy", r)
    code, out, err = run(["evaluate", "ukbench", "--ranks", str(tmp_path / "uk.npy")], capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith("ukbench: score ") and "mP@" not in out
    from oxbench.cli import cli

    helps = [
        cli.get_command(None, "evaluate")
        .get_command(None, c)
        .get_help(__import__("click").Context(cli))
        for c in ("holidays", "ukbench", "revisited")
    ]
    for h in helps:
        assert "capped mP@K" in h and "min(K, rank of the last retrieved" in " ".join(h.split())


def test_oxford_per_query_csv_has_query_id_and_image(tmp_path, capsys):
    _write_oxford_gt(tmp_path / "gt")
    ranked = tmp_path / "ranked"
    ranked.mkdir()
    (ranked / "tower_1.txt").write_text(
        "tower_000002\ntower_000003\n"
    )  # files may be named by query id
    (ranked / "tower_000002.txt").write_text("tower_000003\ntower_000001\n")
    csv_path = tmp_path / "pq.csv"
    code, out, err = run(
        [
            "evaluate",
            "oxford",
            "--gt-dir",
            str(tmp_path / "gt"),
            "--ranked-dir",
            str(ranked),
            "--per-query",
            str(csv_path),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert set(json.loads(out)["ap"]) == {"tower_1", "tower_2"}
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("setup,query_index,query_id,query,")
    assert lines[1].startswith("original,0,tower_1,tower_000001,")


# -- warnings where users fall (issue 24) --------------------------------------------------------


def test_features_that_are_not_unit_norm_get_one_warning_line(rev, capsys):
    p = rev.paths
    args = [
        "evaluate",
        "revisited",
        "--gnd",
        str(rev.gnd),
        "--db-features",
        str(p["x"]),
        "--query-features",
        str(p["q"]),
        "--distractors",
        "5",
    ]
    code, out, err = run(args, capsys)
    assert code == 0 and out.startswith("roxford5k: mAP E: ")
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all("not unit-norm" in ln and "--normalize" in ln for ln in lines), (
        err
    )
    code, _, err = run([*args, "--normalize"], capsys)
    assert code == 0 and err == ""
    unit = np.load(p["x"])
    np.save(rev.tmp / "unit.npy", unit / np.linalg.norm(unit, axis=1, keepdims=True))
    qf = np.load(p["q"])
    np.save(rev.tmp / "qunit.npy", qf / np.linalg.norm(qf, axis=1, keepdims=True))
    code, _, err = run(
        [
            "evaluate",
            "revisited",
            "--gnd",
            str(rev.gnd),
            "--db-features",
            str(rev.tmp / "unit.npy"),
            "--query-features",
            str(rev.tmp / "qunit.npy"),
            "--distractors",
            "5",
        ],
        capsys,
    )
    assert code == 0 and err == ""


def test_an_index_beyond_the_database_hints_at_distractors_and_minus_one_only_with_padding(
    rev, capsys
):
    """R1M-sized ranks without --distractors: the hint names --distractors; the -1 remark appears only
    where -1 is accepted (--padding -1)."""
    ranks = np.load(rev.paths["r"])  # database + 5 distractors
    np.save(rev.tmp / "r1m.npy", ranks)
    args = ["evaluate", "revisited", "--gnd", str(rev.gnd), "--ranks", str(rev.tmp / "r1m.npy")]
    code, out, err = run(args, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert (
        "database indices are 0..39" in err
        and "--distractors N" in err
        and "-1 marks a gap" not in err
    ), err
    code, _, err = run([*args, "--padding", "-1"], capsys)
    assert code == 2 and "(-1 marks a gap)" in err and "--distractors N" in err, err
    code, _, err = run([*args, "--distractors", "2"], capsys)  # too few declared
    assert code == 2 and "distractors 40..41" in err and "more than the 2 distractors" in err, err
    code, _, err = run([*args, "--distractors", "5"], capsys)
    assert code == 0, err


def _write_oxford_dataset(root):
    """``<root>/oxford5k``: 5,063 (empty) images in jpg/ and 55 queries' gt files naming a few of them."""
    from oxbench.formats.oxford_gt import LANDMARKS

    d = root / "oxford5k"
    (d / "jpg").mkdir(parents=True)
    names = [f"img_{i:05d}" for i in range(5063)]
    for n in names:
        (d / "jpg" / f"{n}.jpg").touch()
    gt = d / "gt_files_170407"
    gt.mkdir()
    for li, landmark in enumerate(LANDMARKS["oxford5k"]):
        for n in range(1, 6):
            base = 100 * li + 10 * n
            (gt / f"{landmark}_{n}_query.txt").write_text(f"oxc1_{names[base]} 1 1 20 20\n")
            (gt / f"{landmark}_{n}_good.txt").write_text(f"{names[base + 1]}\n{names[base + 2]}\n")
            (gt / f"{landmark}_{n}_ok.txt").write_text(f"{names[base + 3]}\n")
            (gt / f"{landmark}_{n}_junk.txt").write_text(f"{names[base + 4]}\n")
    return names, gt


def test_original_protocol_coverage_counts_the_datasets_images_not_the_gt_files_names(
    tmp_path, capsys
):
    from oxbench.formats.oxford_gt import LANDMARKS

    names, gt = _write_oxford_dataset(tmp_path / "data")
    ranked = tmp_path / "ranked"
    ranked.mkdir()
    for li, _ in enumerate(LANDMARKS["oxford5k"]):
        for n in range(1, 6):
            base = 100 * li + 10 * n
            (ranked / f"{names[base]}.txt").write_text(
                "".join(f"{names[base + i]}\n" for i in (1, 2, 3, 7, 8))
            )
    code, out, err = run(
        [
            "evaluate",
            "oxford",
            "--dataset",
            "oxford5k",
            "--root",
            str(tmp_path / "data"),
            "--ranked-dir",
            str(ranked),
        ],
        capsys,
    )
    assert code == 0, err
    assert err.strip().splitlines() == [f"{ranked}: ranks cover top 5 of 5,063 images"]
    assert out.startswith("oxford5k: mAP")
    code, out2, err = run(
        [
            "evaluate",
            "oxford",
            "--dataset",
            "oxford5k",
            "--root",
            str(tmp_path / "data"),
            "--gt-dir",
            str(gt),
            "--ranked-dir",
            str(ranked),
        ],
        capsys,
    )
    assert code == 0 and out2 == out and "of 5,063 images" in err
    code, out3, err = run(
        ["evaluate", "oxford", "--gt-dir", str(gt), "--ranked-dir", str(ranked)], capsys
    )
    assert code == 0 and out3.split("mAP")[1] == out.split("mAP")[1]
    assert "images" not in err  # the gt files name 275 images: no database size is claimed
