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
        queries.append(make_query(f"q{q}", [0, 0, 5, 5], easy=perm[:3], hard=perm[3:6], junk=perm[6:8]))
    gt = GroundTruth("roxford5k", "revisited", tuple(f"im{i}" for i in range(n_db)), tuple(queries))
    gnd = tmp_path / "gnd_roxford5k.pkl"
    write_gnd(gt, gnd)
    x = rng.standard_normal((n_db + 5, 8)).astype(np.float32)
    qf = rng.standard_normal((nq, 8)).astype(np.float32)
    scores = x @ qf.T
    ranks = to_revisitop(ranks_from_scores(scores))
    paths = {}
    for name, arr in {"x": x, "q": qf, "s": scores, "r": ranks, "r_db": ranks_from_scores(scores[:n_db]).T}.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], arr)
    return types.SimpleNamespace(gt=gt, gnd=gnd, paths=paths, ranks=ranks, tmp=tmp_path)


def test_revisited_json_contract_all_inputs(rev, capsys):
    p = rev.paths
    expected = evaluate(rev.gt, rev.ranks.T, n_distractors=5)
    outs = []
    for extra in (["--ranks", p["r"]], ["--scores", p["s"]], ["--db-features", p["x"], "--query-features", p["q"]]):
        code, out, err = run(["evaluate", "revisited", "--gnd", str(rev.gnd), *map(str, extra), "--distractors", "5", "--json"], capsys)
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
    code, out, err = run(["evaluate", "revisited", "--gnd", str(rev.gnd), "--ranks", str(rev.paths["r_db"]), "--ks", "1,3"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("roxford5k: mAP E: ") and ", M: " in lines[0] and ", H: " in lines[0]
    assert lines[1].startswith("roxford5k: mP@k[1 3] E: [")
    assert "mP@3" in out and "medium" in out
    code, out, _ = run(["evaluate", "revisited", "--gnd", str(rev.gnd), "--ranks", str(rev.paths["r_db"]), "--ks", "1,3", "--json"], capsys)
    assert set(json.loads(out)["setups"]["hard"]) == {"map", "mp@1", "mp@3", "ap"}


def test_per_query_csv(rev, capsys):
    csv_path = rev.tmp / "pq.csv"
    code, _, err = run(
        ["evaluate", "revisited", "--gnd", str(rev.gnd), "--ranks", str(rev.paths["r_db"]), "--per-query", str(csv_path)],
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
        (["--gnd", gnd, "--ranks", str(tmp / "cols.npy")], "2 columns but the ground truth has 3 queries"),
        (["--gnd", gnd, "--ranks", str(tmp / "neg.npy")], "holds index -3"),
        (["--gnd", gnd, "--ranks", str(tmp / "frac.npy")], "not an integer index"),
        (["--gnd", gnd, "--ranks", str(p["r"])], "but database indices are 0..39"),  # distractors undeclared
        (["--gnd", gnd, "--ranks", str(tmp / "missing.npy")], "ranks file not found"),
        (["--gnd", gnd, "--ranks", str(tmp / "junk.npy")], "not a readable .npy"),
        (["--gnd", str(tmp / "nope.pkl"), "--ranks", str(p["r_db"])], "nope.pkl"),
        (["--gnd", gnd], "give exactly one of --ranks"),
        (["--gnd", gnd, "--ranks", str(p["r_db"]), "--scores", str(p["s"])], "give exactly one of --ranks"),
        (["--ranks", str(p["r_db"])], "give exactly one of --gnd or --dataset"),
        (["--gnd", gnd, "--scores", str(p["s"])], "45 rows but the database has 40 images"),
        (["--gnd", gnd, "--ranks", str(p["r_db"]), "--ks", "1,x"], "--ks"),
        (["--gnd", gnd, "--db-features", str(p["x"])], "go together"),
        (["--gnd", gnd, "--ranks", str(p["r_db"]), "--distractors", "-3"], "--distractors must be >= 0"),
    ]


def test_bad_input_exit_2_one_line_nothing_written(rev, capsys):
    for args, needle in _bad(rev, rev.tmp):
        out_csv = rev.tmp / "never.csv"
        code, out, err = run(["evaluate", "revisited", *args, "--per-query", str(out_csv), "--json"], capsys)
        assert code == 2, (args, out, err)
        assert out == ""
        assert len(err.strip().splitlines()) == 1, err
        assert needle in err, (needle, err)
        assert "Traceback" not in err
        assert not out_csv.exists()


def test_protocol_mismatch(rev, capsys, tmp_path):
    old = GroundTruth("oxford5k", "original", tuple("abcd"), (make_query("a", ok=[0, 1], junk=[2]),))
    write_gnd(old, tmp_path / "gnd_oxford5k.pkl")
    np.save(tmp_path / "r1.npy", np.array([[0], [2], [1], [3]]))
    code, _, err = run(["evaluate", "revisited", "--gnd", str(tmp_path / "gnd_oxford5k.pkl"), "--ranks", str(tmp_path / "r1.npy")], capsys)
    assert code == 2 and "use 'oxbench evaluate oxford'" in err
    code, out, err = run(["evaluate", "oxford", "--gnd", str(tmp_path / "gnd_oxford5k.pkl"), "--ranks", str(tmp_path / "r1.npy"), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out) == {"map": 1.0, "ap": {"a": 1.0}}
    code, _, err = run(["evaluate", "oxford", "--gnd", str(rev.gnd), "--ranks", str(rev.paths["r_db"])], capsys)
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
        ["evaluate", "revisited", "--dataset", "roxford5k", "--root", str(root), "--ranks", str(path), "--json"],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out)["setups"]["hard"]["map"] == evaluate(gt, ranks).setups["hard"].map


def test_dataset_option_missing_dataset_is_one_line(rev, capsys, tmp_path):
    code, out, err = run(
        ["evaluate", "revisited", "--dataset", "rparis6k", "--root", str(tmp_path), "--ranks", str(rev.paths["r_db"])],
        capsys,
    )
    assert code == 2 and "rparis6k" in err and len(err.strip().splitlines()) == 1
    assert out == ""


def _write_oxford_gt(d):
    """A tiny original-protocol folder: one landmark, two queries."""
    d.mkdir()
    files = {
        "tower_1": ("oxc1_tower_000001 1 2 30 40", ["tower_000002", "tower_000003"], ["tower_000001"], ["tower_000004"]),
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
    (ranked / "tower_000001.txt").write_text("tower_000004\ntower_000001\nother_1\ntower_000002\ntower_000003\n")
    (ranked / "tower_000002.txt").write_text("tower_000003\ntower_000001\n")
    code, out, err = run(["evaluate", "oxford", "--gt-dir", str(tmp_path / "gt"), "--ranked-dir", str(ranked), "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    ap1 = (1.0 + 1.0) / 2 / 3 + (1 / 2 + 2 / 3) / 2 / 3 + (2 / 3 + 3 / 4) / 2 / 3
    assert d["ap"] == {"tower_000001": pytest.approx(ap1, abs=1e-12), "tower_000002": 1.0}
    assert d["map"] == pytest.approx((ap1 + 1.0) / 2, abs=1e-12)
    (ranked / "tower_000002.txt").write_text("tower_000003\ntower_000001\ntower_000003\n")
    code, out, err = run(["evaluate", "oxford", "--gt-dir", str(tmp_path / "gt"), "--ranked-dir", str(ranked)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_holidays_and_ukbench(tmp_path, capsys):
    (tmp_path / "images.dat").write_text("100000.jpg\n100001.jpg\n100002.jpg\n100100.jpg\n100101.jpg\n")
    (tmp_path / "res.txt").write_text(
        "100000.jpg 0 100000.jpg 1 100101.jpg 2 100002.jpg 3 100001.jpg\n100100.jpg 0 100101.jpg\n"
    )
    code, out, err = run(["evaluate", "holidays", "--results", str(tmp_path / "res.txt"), "--images", str(tmp_path / "images.dat"), "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    # query 100000: itself ignored; 100101 negative at rank 0, positives at ranks 1, 2
    ap0 = ((0 + 1 / 2) / 2 + (1 / 2 + 2 / 3) / 2) / 2
    assert d["ap"] == {"100000": pytest.approx(ap0, abs=1e-12), "100100": 1.0}
    assert set(d) == {"map", "ap"}

    r = np.array([[i, *[j for j in range(8) if j != i]] for i in range(8)]).T
    np.save(tmp_path / "uk.npy", r)
    code, out, err = run(["evaluate", "ukbench", "--ranks", str(tmp_path / "uk.npy"), "--json"], capsys)
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
    code, out, err = run(["evaluate", "oxford", "--gt-dir", str(shared_data / "oxford5k/gt_files_170407"), "--ranked-dir", str(ranked), "--json"], capsys)
    assert code == 0, err
    a = json.loads(out)
    code, out, err = run(["evaluate", "oxford", "--gnd", str(shared_data / "oxford5k/gnd_oxford5k.pkl"), "--ranks", str(tmp_path / "r.npy"), "--json"], capsys)
    assert code == 0, err
    b = json.loads(out)
    assert round(100 * a["map"], 2) == round(100 * b["map"], 2) == 40.29
    assert a["ap"] == pytest.approx(b["ap"], abs=1e-12)


@pytest.mark.shared_data
def test_real_holidays_result_file(shared_data, capsys):
    """The real (truncated, top-10) Holidays result file: our trapezoid AP gives about 0.689."""
    code, out, err = run(
        ["evaluate", "holidays", "--results", str(shared_data / "holidays/peng_result.txt"),
         "--images", str(shared_data / "holidays/holidays_images.dat"), "--json"],
        capsys,
    )
    assert code == 0, err
    d = json.loads(out)
    assert len(d["ap"]) == 500
    assert round(d["map"], 3) == 0.689
