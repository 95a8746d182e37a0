"""Protocols as objects: the registry, a protocol written in one new module, the one headline writer,
no protocol-name branches outside the protocol modules, and the cross-protocol map@k view."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oxbench
from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.evaluation import evaluate
from oxbench.evaluation.views import map_at_k, parse_view
from oxbench.formats.revisitop import write_gnd
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.protocol import PROTOCOLS, Protocol, get_protocol, number_text

SRC = Path(oxbench.__file__).resolve().parent


def test_the_built_in_protocols_are_registered_objects_equal_to_their_names():
    assert set(PROTOCOLS.names()) >= {
        "revisited",
        "original",
        "holidays",
        "ukbench",
        "gldv2",
        "ilias",
    }
    for name in PROTOCOLS.names():
        p = get_protocol(name)
        assert isinstance(p, Protocol) and p == name and hash(p) == hash(name)
        assert p.setups and set(p.setup_labels) == set(p.setups) and p.command
        assert pickle.loads(pickle.dumps(p)) is p
        assert json.dumps({"protocol": p}) == json.dumps({"protocol": name})
    with pytest.raises(
        InputError, match="unknown protocol 'revisted'; known: .*did you mean revisited"
    ):
        get_protocol("revisted")


def test_ground_truth_holds_its_protocol_object():
    gt = GroundTruth("t", "original", ("a", "b"), (make_query("q", good=[1]),))
    assert gt.protocol is get_protocol("original")
    with pytest.raises(InputError, match="unknown protocol"):
        GroundTruth("t", "no-such-protocol", ("a",), ())


@pytest.mark.parametrize(
    ("name", "means", "expected"),
    [
        ("revisited", {"easy": 0.8481, "medium": 0.6467, "hard": 0.3847}, "mAP E 84.81 M 64.67 H 38.47"),
        ("original", {"original": 0.8}, "mAP 80.00"),
        ("ukbench", {"ukbench": 3.5}, "score 3.5000"),
        ("gldv2", {"public": 0.123, "private": 0.119}, "mAP@100 public 12.30 private 11.90"),
        ("ilias", {"ilias": float("nan")}, "mAP@1k nan"),
    ],
)  # fmt: skip
def test_one_headline_writer(name, means, expected):
    assert get_protocol(name).headline(number_text(lambda s, _m: means[s])) == expected


TOY_PROTOCOL = '''
"""A protocol in one module: success@1 (is the first result a positive?), one setup."""
import numpy as np

from oxbench.evaluation.result import EvaluationResult, SetupResult
from oxbench.protocol import Headline, Protocol, register_protocol


class FirstHit(Protocol):
    setups = ("first",)
    labels = ("positive", "negative")
    setup_labels = {"first": (frozenset({"positive"}), frozenset())}
    command = "first-hit"
    headline_metric = Headline("success@1", "ap")

    def evaluate(self, gt, ranks, **options):
        ranks = np.asarray(ranks)
        hit = np.array([float(r[0] in q.good) for r, q in zip(ranks, gt.queries)])
        setup = SetupResult(map=float(hit.mean()), mp_at_k={}, ap=hit, p_at_k=np.zeros((len(hit), 0)))
        return EvaluationResult(gt.dataset, self, {"first": setup}, ks=(), query_names=gt.query_names)

    def lines(self, result):
        return [f"{result.dataset}: success@1 {100 * result['first'].map:.2f}"]

    def table(self, result):
        return ["setup", "success@1"], [["first", f"{100 * result['first'].map:.2f}"]]

    def result_dict(self, result):
        return {"success@1": result["first"].map}

    def stored_means(self, metrics, per_query):
        yield "success@1", metrics["success@1"], "first", "ap"


register_protocol(FirstHit("first-hit"))
'''


def test_a_new_protocol_is_one_module(tmp_path, monkeypatch):
    (tmp_path / "toy_first_hit.py").write_text(TOY_PROTOCOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_first_hit  # noqa: F401

    try:
        gt = GroundTruth(
            "toy",
            "first-hit",
            ("a", "b", "c"),
            (make_query("q0", good=[2]), make_query("q1", good=[0])),
        )
        result = evaluate(gt, [[2, 0, 1], [1, 0, 2]])
        assert result.lines() == ["toy: success@1 50.00"] and result.to_dict() == {"success@1": 0.5}
        assert gt.protocol.headline(number_text(lambda s, m: 0.5)) == "success@1 50.00"
    finally:
        PROTOCOLS.unregister("first-hit")


def _protocol_name_branches(tree: ast.AST) -> list[int]:
    """Lines comparing something named ``*protocol*`` with a string (or strings) by ==, !=, in."""

    def names_protocol(node: ast.AST) -> bool:
        return any(
            "protocol" in (n.attr if isinstance(n, ast.Attribute) else n.id).lower()
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute | ast.Name)
        )

    def is_text(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
        )

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            ops = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)
            if any(isinstance(op, ops) for op in node.ops) and any(map(names_protocol, sides)):
                if any(map(is_text, sides)):
                    out.append(node.lineno)
    return out


def test_no_protocol_name_is_compared_outside_the_protocol_modules():
    allowed = {SRC / "protocol.py"} | set((SRC / "evaluation" / "protocols").glob("*.py"))
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path in allowed:
            continue
        for line in _protocol_name_branches(ast.parse(path.read_text())):
            found.append(f"{path.relative_to(SRC)}:{line}")
    assert found == []
    # the scan finds what it looks for
    assert _protocol_name_branches(ast.parse('if gt.protocol == "ukbench": pass')) == [1]
    assert _protocol_name_branches(ast.parse('x = protocol in ("a", "b")')) == [1]


# --- the cross-protocol view ------------------------------------------------------------------


def slow_map_at_k(
    labels: list[str], positive: set[str], ignored: set[str], k: int, n: int
) -> float:
    """trec_eval's map_cut.k over the list with the ignored images deleted: precision at each
    positive in the top k, summed, over all n positives."""
    kept = [lab for lab in labels if lab not in ignored]
    hits, total = 0, 0.0
    for rank, lab in enumerate(kept[:k], 1):
        if lab in positive:
            hits += 1
            total += hits / rank
    return total / n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("ehjn"), min_size=1, max_size=40), st.integers(1, 45))
def test_map_at_k_equals_the_slow_definition(labels, k):
    """A ranked list of easy (e), hard (h), junk (j) and negative (n) images."""
    easy = [i for i, c in enumerate(labels) if c == "e"]
    hard = [i for i, c in enumerate(labels) if c == "h"]
    junk = [i for i, c in enumerate(labels) if c == "j"]
    gt = GroundTruth(
        "x", "revisited", tuple(f"i{i}" for i in range(len(labels))),
        (make_query("q", easy=easy, hard=hard, junk=junk),),
    )  # fmt: skip
    if not easy or not hard:
        return  # a setup without positives is refused (tested below)
    view = map_at_k(gt, [list(range(len(labels)))], k)
    setups = {
        "easy": ({"e"}, {"h", "j"}, len(easy)),
        "medium": ({"e", "h"}, {"j"}, len(easy) + len(hard)),
        "hard": ({"h"}, {"e", "j"}, len(hard)),
    }
    for name, (pos, ign, n) in setups.items():
        assert view.means[name] == pytest.approx(slow_map_at_k(labels, pos, ign, k, n), rel=1e-12)
        assert 0 <= view.means[name] <= 1


def test_parse_view_refuses_anything_but_map_at_k():
    assert parse_view("map@5") == ("map@k", 5)
    for bad in ("map@0", "map@1e30", "ndcg@5", "map", "map@nan"):
        with pytest.raises(InputError):
            parse_view(bad)


def test_cli_also_prints_map_at_k_apart_from_the_official_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n_db = 30
    queries = []
    for q in range(3):
        perm = rng.permutation(n_db)
        queries.append(make_query(f"q{q}", easy=perm[:3], hard=perm[3:6], junk=perm[6:8]))
    gt = GroundTruth("roxford5k", "revisited", tuple(f"im{i}" for i in range(n_db)), tuple(queries))
    write_gnd(gt, tmp_path / "gnd.pkl")
    ranks = np.stack([rng.permutation(n_db) for _ in range(3)])
    np.save(tmp_path / "r.npy", ranks.T)
    argv = ["evaluate", "revisited", "--gnd", tmp_path / "gnd.pkl", "--ranks", tmp_path / "r.npy"]
    with pytest.raises(SystemExit):
        main([str(a) for a in argv])
    plain = capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in [*argv, "--also", "map@5"]])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert out.startswith(plain)  # the official lines and table unchanged
    extra = out[len(plain) :].strip().splitlines()
    expected = map_at_k(gt, ranks, 5).means
    assert extra[0] == (
        "gnd: map@5 (not official) "
        f"E: {100 * expected['easy']:.2f}, M: {100 * expected['medium']:.2f}, H: {100 * expected['hard']:.2f}"
    )
    assert extra[1].startswith("note: map@5 is MIEB/MTEB's") and "not the official mAP" in extra[1]
    with pytest.raises(SystemExit):
        main([str(a) for a in [*argv, "--also", "map@5", "--json"]])
    data = json.loads(capsys.readouterr().out)
    assert data["also"]["map@5"]["setups"]["easy"] == expected["easy"]
    assert data["setups"]["easy"]["map"] == evaluate(gt, ranks)["easy"].map
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in [*argv, "--also", "map@0"]])
    assert exc.value.code == 2
