"""Revisitop ground-truth pickles: safe loading, both protocols, round trip, malformed input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.formats.revisitop import read_gnd, write_gnd
from oxbench.formats.safe_pickle import load_plain_pickle


def _write(tmp_path, obj, name="gnd_toy.pkl"):
    p = tmp_path / name
    p.write_bytes(pickle.dumps(obj, protocol=3))
    return p


def _toy():
    return {
        "imlist": ["a", "b", "c", "d"],
        "qimlist": ["q0", "q1"],
        "gnd": [
            {"bbx": [1.0, 2.0, 30.5, 40.0], "easy": [0], "hard": [2, 2], "junk": [3]},
            {"bbx": [0.0, 0.0, 5.0, 5.0], "easy": [], "hard": [1], "junk": []},
        ],
    }


def test_read_revisited_and_round_trip(tmp_path):
    gt = read_gnd(_write(tmp_path, _toy()))
    assert gt.dataset == "toy" and gt.protocol == "revisited" and gt.n_db == 4
    assert gt.queries[0].hard.tolist() == [2]  # duplicates folded
    assert gt.queries[1].easy.size == 0
    out = write_gnd(gt, tmp_path / "gnd_copy.pkl")
    again = read_gnd(out, dataset="toy")
    for a, b in zip(gt.queries, again.queries, strict=True):
        for f in ("easy", "hard", "junk"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert a.bbox == b.bbox


def test_refuses_code_in_pickle(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "gnd_evil.pkl"
    p.write_bytes(pickle.dumps({"imlist": [Evil()]}))
    with pytest.raises(InputError, match="only plain containers"):
        load_plain_pickle(p)


def test_refuses_numpy_arrays(tmp_path):
    obj = _toy()
    obj["gnd"][0]["easy"] = np.array([0])
    with pytest.raises(InputError, match="gnd_toy.pkl"):
        read_gnd(_write(tmp_path, obj))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("imlist"), "missing key 'imlist'"),
        (lambda o: o["gnd"][0].pop("junk"), "missing key"),
        (lambda o: o["gnd"][0].update(junk=[0]), "labelled both"),
        (lambda o: o["gnd"][1].update(hard=[9]), "outside the database"),
        (lambda o: o["gnd"][1].update(hard=[-1]), "outside the database"),
        (lambda o: o["gnd"][1].update(hard=[1.5]), "integer"),
        (lambda o: o["qimlist"].append("q2"), "'gnd' has 2 entries"),
        (lambda o: o["imlist"].__setitem__(0, "a.jpg"), "malformed image name"),
        (lambda o: o["imlist"].__setitem__(0, "a "), "malformed image name"),
    ],
)
def test_malformed_ground_truth(tmp_path, mutate, message):
    obj = _toy()
    mutate(obj)
    with pytest.raises(InputError, match=message):
        read_gnd(_write(tmp_path, obj))


def test_missing_and_garbage_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_gnd(tmp_path / "gnd_nope.pkl")
    junk = tmp_path / "gnd_junk.pkl"
    junk.write_bytes(b"this is not a pickle")
    with pytest.raises(InputError, match="gnd_junk.pkl"):
        read_gnd(junk)


@pytest.mark.parametrize(
    ("rel", "protocol", "n_db", "n_q", "field", "total"),
    [
        ("roxford5k/gnd_roxford5k.pkl", "revisited", 4993, 70, "easy", 3029),
        ("rparis6k/gnd_rparis6k.pkl", "revisited", 6322, 70, "hard", 10350),
        ("oxford5k/gnd_oxford5k.pkl", "original", 5063, 55, "ok", 2840),
        ("paris6k/gnd_paris6k.pkl", "original", 6392, 55, "junk", 8245),
    ],
)
@pytest.mark.shared_data
def test_real_ground_truth(shared_data, rel, protocol, n_db, n_q, field, total):
    gt = read_gnd(shared_data / rel)
    assert (gt.protocol, gt.n_db, gt.n_queries) == (protocol, n_db, n_q)
    assert sum(getattr(q, field).size for q in gt.queries) == total
