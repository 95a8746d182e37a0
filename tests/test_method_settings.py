"""Every setting of every preset, fed hostile text the way ``--set`` feeds it.

Each value is either accepted -- and then the resolved config holds a value its spec accepts -- or
refused with one :class:`InputError` line naming the setting. Nothing else may escape: no
``TypeError`` from deep inside a family, no NaN slipping past a range check.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.pipelines import list_methods, resolve_method
from oxbench.schema import SPEC_KEY

HOSTILE = (
    "NaN",
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e30",
    "10" * 20,
    "abc",
    "true",
    "",
    "1.5",
    "1_0",
    "[1, 2]",
    "none",
    " 3 ",
    "\x00",
)


def _settings(config: object, prefix: str = "") -> list[tuple[str, dataclasses.Field]]:
    """Every setting `--set` takes: fields (nested as dotted names), then each stage group's."""
    out = []
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if f.name == "name":
            continue
        if f.name == "stage_settings":  # the pipeline's stages own these: instance.setting
            for instance in config.stage_instances:  # type: ignore[attr-defined]
                out += _settings(config.stage(instance), f"{prefix}{instance}.")  # type: ignore[attr-defined]
        elif dataclasses.is_dataclass(value):  # a nested config: its settings, dotted
            if SPEC_KEY in f.metadata:  # a whole value too (a descriptor kind, local features)
                out.append((prefix + f.name, f))
            out += _settings(value, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, f))
    return out


def _value(config: object, dotted: str) -> object:
    head, _, rest = dotted.partition(".")
    if rest and head in getattr(config, "stage_instances", ()):
        return getattr(config.stage(head), rest)  # type: ignore[attr-defined]
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def test_every_setting_of_every_preset_takes_hostile_text_in_one_line() -> None:
    cases = refused = 0
    for preset in list_methods():
        base = resolve_method(preset)
        for name, f in _settings(base):
            spec = f.metadata.get(SPEC_KEY)
            assert spec is not None, f"{preset}: setting {name} declares no spec"
            for raw in HOSTILE:
                cases += 1
                try:
                    resolved = resolve_method(preset, **{name: raw})
                except InputError as exc:
                    refused += 1
                    message = str(exc)
                    assert "\n" not in message and name.rsplit(".", 1)[-1] in message, (
                        preset,
                        name,
                        raw,
                        message,
                    )
                    continue
                value = _value(resolved, name)
                assert spec.check(name, value) == value, (preset, name, raw)
                if isinstance(value, float):
                    assert math.isfinite(value), (preset, name, raw)
    # the count is in the issue note; most hostile texts are refused
    assert cases > 3000 and refused > cases // 2, (cases, refused)


@pytest.mark.parametrize(
    "setting",
    [
        "alpha-qe.alpha=abc",
        "whitening_power=abc",
        "dba=true",
        "alpha-qe.k=1.5",
        "whitening_dim=NaN",
        "descriptor.max_side=NaN",
        "diffusion.gamma=NaN",
        "dba.alpha=abc",
        "descriptor.gem_p=-50",
        "descriptor.scales=1,nan",
        "whitening_dim=1e30",
    ],
)
def test_the_reported_settings_are_one_line_exit_2(
    setting: str, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "run",
                "--method",
                "features-diffusion",
                "--root",
                str(tmp_path),
                "--set",
                setting,
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and setting.split("=")[0] in err, (
        err
    )
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_no_range_check_in_the_package_lets_nan_through() -> None:
    """The classic slip: ``if x <= 0: raise`` passes NaN. Ranges of settings live in the schema;
    what remains in the families are cross-setting checks."""
    import ast
    from pathlib import Path

    import oxbench

    root = Path(oxbench.__file__).parent / "pipelines"
    slips = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.If)
                and isinstance(node.test, ast.Compare)
                and isinstance(node.body[0], ast.Raise)
            ):
                test = node.test
                if any(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in test.ops):
                    names = [n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)]
                    if any(
                        n.startswith(("qe_", "diffusion_", "whitening_", "gem_", "dba"))
                        for n in names
                    ):
                        slips.append(f"{path.name}:{node.lineno}")
    assert not slips, f"range checks of float settings outside the schema: {slips}"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def test_methods_lists_every_setting_of_a_preset(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code, out, _ = _cli(capsys, "methods", "gem-r18-synthetic", "--json", "--all")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    config = resolve_method("gem-r18-synthetic")
    assert set(rows) == {name for name, _ in _settings(config)}
    # what a cnn preset reads: its kind's settings, not VLAD's codebook, local features or files
    code, out, _ = _cli(capsys, "methods", "gem-r18-synthetic", "--json")
    applying = {r["name"] for r in json.loads(out)}
    assert {"descriptor.backbone", "descriptor.gem_p", "descriptor.seed"} <= applying
    assert {"descriptor", "whitening", "search", "rerank"} <= applying
    assert not {r for r in applying if r.startswith("descriptor.features")}
    assert not applying & {
        "descriptor.vocabulary.size",
        "descriptor.db_features",
        "features.max_side",
    }
    assert applying == set(rows)  # nothing of another kind is hidden: it is not a setting here
    assert rows["descriptor.max_side"]["default"] == 160
    assert rows["descriptor.max_side"]["type"] == "int"
    assert (
        rows["descriptor"]["default"] == "cnn" and rows["descriptor"]["type"] == "descriptor kind"
    )
    assert rows["descriptor.fit_network"]["default"] is True and "diffusion.alpha" not in rows
    # a stage's settings are listed with the pipeline that runs it, under the stage's group
    code, out, _ = _cli(capsys, "methods", "features-diffusion", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["diffusion.alpha"]["accepts"] == "in (0, 1)" and rows["rerank"]["default"] == [
        "diffusion"
    ]
    code, out, _ = _cli(capsys, "methods", "rootsift-bow-sv-qe")
    assert code == 0 and "features.max_side" in out and "spatial.top_r" in out
    code, alias, _ = _cli(
        capsys, "settings", "rootsift-bow-sv-qe"
    )  # the earlier name of the command
    assert code == 0 and alias == out


def test_every_preset_setting_appears_in_methods_with_a_type_and_a_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`oxbench methods NAME` shows every setting `--set` takes, each with its type and the preset's value."""
    for preset in list_methods():
        code, out, _ = _cli(capsys, "methods", preset, "--all")
        assert code == 0
        listed = {line.split()[0]: line.split()[1:] for line in out.splitlines()[3:]}
        config = resolve_method(preset)
        for name, f in _settings(config):
            assert name in listed, (preset, name)
            kind, value = f.metadata[SPEC_KEY].kind, _value(config, name)
            default = (",".join(value) or "none") if kind == "names" else str(value)  # type: ignore[arg-type]
            words = " ".join(listed[name])
            assert words.startswith(f"{kind} {default}"), (preset, name, kind, default, words)


def test_a_global_preset_lists_and_takes_only_its_descriptor_kinds_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    listed = {}
    for preset in ("rootsift-vlad", "gem-r50-imagenet", "features"):
        code, out, _ = _cli(capsys, "methods", preset)
        assert code == 0
        listed[preset] = {line.split()[0] for line in out.splitlines()[3:]}
    vlad = {"descriptor.vocabulary.size", "descriptor.intra_norm", "descriptor.features.max_side"}
    cnn = {"descriptor.pooling", "descriptor.backbone", "descriptor.max_side"}
    files = {"descriptor.db_features", "descriptor.layout"}
    assert vlad <= listed["rootsift-vlad"] and not (cnn | files) & listed["rootsift-vlad"]
    assert cnn <= listed["gem-r50-imagenet"] and not (vlad | files) & listed["gem-r50-imagenet"]
    assert files <= listed["features"] and not (vlad | cnn) & listed["features"]
    assert {"whitening", "search", "rerank"} <= listed["rootsift-vlad"] & listed["features"]
    # a sub-setting of another kind: one line naming the kind that has it and the preset's kind
    for preset, key, kind in (("rootsift-vlad", "descriptor.pooling=gem", "cnn"),
                              ("gem-r50-imagenet", "descriptor.vocabulary.size=8", "vlad"),
                              ("gem-r50-imagenet", "descriptor.features.max_side=64", "vlad"),
                              ("features-alpha-qe", "descriptor.max_side=64", "cnn")):  # fmt: skip
        code, _, err = _cli(capsys, "run", "--method", preset, "--set", key, "--no-progress")
        name = key.split("=")[0]
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{name} is a setting of descriptor kind {kind}" in err and preset in err, err
    # switching the kind makes its settings apply (in either order on the command line)
    switched = resolve_method("rootsift-vlad", **{"descriptor.pooling": "mac", "descriptor": "cnn"})
    assert switched.descriptor.kind == "cnn" and switched.descriptor.pooling == "mac"  # type: ignore[attr-defined]
    assert switched.descriptor.backbone == "resnet50"  # the kind's defaults  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("preset", "setting", "words"),
    [
        ("rootsift-vlad", "descriptor=nosuch", "unknown descriptor kind 'nosuch'; known: cnn, "),
        ("rootsift-vlad", "descriptor.nosuch=1", "unknown setting 'descriptor.nosuch' of "),
        ("gem-r50-imagenet", "descriptor.gem_p=nan", "descriptor.gem_p: expected a finite"),
        ("gem-r50-imagenet", "descriptor.gem_p=0", "descriptor.gem_p: must be in (0, 100]"),
        ("rootsift-vlad", "descriptor.pooling=gem", "descriptor.pooling is a setting of "),
        (
            "rootsift-vlad",
            "descriptor.vocabulary.size=1",
            "descriptor.vocabulary.size: must be in [2, 16777216]",
        ),
        ("rootsift-vlad", "descriptor.features.max_side=abc", "features.max_side: expected a "),
        ("rootsift-vlad", "descriptor.features.nosuch=1", "descriptor.features.nosuch"),
        ("gem-r50-imagenet", "descriptor.pooling.x=1", "descriptor.pooling has no sub-settings"),
        ("rootsift-vlad", "pooling=gem", "pooling is descriptor.pooling of cnn"),
        ("rootsift-vlad", "vlad_k=8", "vlad_k is descriptor.vocabulary.size of vlad"),
        ("gem-r50-imagenet", "descriptor.model_whitening=true", "needs a model file"),
    ],
)
def test_a_bad_descriptor_setting_is_one_line_exit_2(
    preset: str, setting: str, words: str, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:  # noqa: ANN001
    """Unknown kinds and sub-settings name what is known; values are checked by the kind's spec."""
    code, _, err = _cli(
        capsys, "run", "--method", preset, "--root", str(tmp_path), "--set", setting,
        "--no-progress",
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_a_descriptor_kind_is_rebuilt_from_its_record() -> None:
    """``to_dict()`` of each kind (a ``kind`` plus its settings) gives the same config back, and a
    record of another kind or with a stray setting is refused in one line."""
    for preset in ("rootsift-vlad-w", "gem-r18-synthetic+w", "features-alpha-qe"):
        m = resolve_method(preset)
        record = m.to_dict()["descriptor"]
        again = resolve_method("rootsift-vlad", descriptor=record, whitening=m.whitening)  # type: ignore[attr-defined]
        assert again.descriptor == m.descriptor and again.to_dict()["descriptor"] == record  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="descriptor kind vlad has no setting 'pooling'"):
        resolve_method("rootsift-vlad", descriptor={"kind": "vlad", "pooling": "gem"})
    with pytest.raises(InputError, match="unknown descriptor kind 'sift'"):
        resolve_method("rootsift-vlad", descriptor={"kind": "sift"})
    with pytest.raises(InputError, match="descriptor settings without a kind"):
        resolve_method("rootsift-vlad", descriptor={"k": 8})


def test_methods_lists_the_families_and_their_presets(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code, out, _ = _cli(capsys, "methods", "--json")
    assert code == 0
    families = {f["family"]: f for f in json.loads(out)}
    assert {"bow", "global", "asmk"} <= set(families)
    assert sorted(p for f in families.values() for p in f["presets"]) == sorted(list_methods())
    assert all(f["about"] for f in families.values())
    code, text, _ = _cli(capsys, "methods")
    assert (
        code == 0 and "rootsift-bow-sv-qe" in text and text.startswith(f"{len(families)} families")
    )
    # one line per preset: its name, then what it is and its paper
    for f in families.values():
        for preset in f["presets"]:
            (line,) = [x for x in text.splitlines() if x.split()[:1] == [preset]]
            assert line.split(None, 1) == [preset, f["presets_about"][preset]]
    assert (
        "rootsift-bow-sv-qe  RootSIFT BoW + spatial verification + AQE from verified images "
        "(Chum et al. 2007)"
        in " ".join(text.split()).replace("rootsift-bow-sv-qe ", "rootsift-bow-sv-qe  ")
    )


def test_every_builtin_preset_says_what_it_is_and_a_plugin_can_say_it_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import re

    from oxbench.pipelines import presets as method

    builtin = [p for p in list_methods() if method.METHODS.origin(p).builtin]
    # every built-in preset registered with its line, beside it (register_method(..., about=))
    assert set(builtin) <= set(method._PRESET_ABOUT)
    for preset in builtin:
        about = method.preset_about(preset)
        # a paper ("(Chum et al. 2007)") or what the user brings / oxbench trains
        assert re.search(r"(19|20)\d\d\)$", about) or "your" in about or "synthetic" in about
        assert "\n" not in about and len(about) < 200, preset
    monkeypatch.setitem(method._PRESET_ABOUT, "rootsift-bow", "said by register_method (X 2020)")
    assert method.preset_about("rootsift-bow") == "said by register_method (X 2020)"


@pytest.mark.parametrize(("args", "words"), [
    (["run", "--method", "features-alpha-qe", "--set", "alpha-qe.alfa=3"], "did you mean alpha-qe.alpha?"),
    (["run", "--method", "rootsift-bow", "--set", "features.max_sid=3"], "did you mean features.max_side"),
    (["run", "--method", "rootsift-bow-sv-qee"], "did you mean rootsift-bow-sv-qe"),
    (["methods", "rootsift-bow-sv-qee"], "did you mean rootsift-bow-sv-qe"),
])  # fmt: skip
def test_an_unknown_name_lists_the_close_matches(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:  # noqa: ANN001
    code, out, err = (
        _cli(capsys, *args, "--root", str(tmp_path)) if args[0] == "run" else _cli(capsys, *args)
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, err
    assert not (tmp_path / "runs").exists()


def test_the_methods_listing_in_the_docs_is_the_commands_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/your-data.md shows `oxbench methods rootsift-bow-sv-qe` in full: it is what the command prints."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "your-data.md").read_text()
    m = re.search(
        r"```bash\noxbench methods rootsift-bow-sv-qe\n```\n\n```text\n(.*?)```", doc, re.S
    )
    assert m is not None, "docs/your-data.md: the methods block and its output"
    code, out, _ = _cli(capsys, "methods", "rootsift-bow-sv-qe")
    assert code == 0 and m.group(1) == out


def test_one_setting_name_has_one_spec_in_every_family() -> None:
    """A setting's name means one thing: wherever it appears -- any family, nested under a
    descriptor kind (``descriptor.vocabulary.size``), a local source, or a stage's second instance
    (``aqe#2.k``) -- it has the same spec (type and range)."""
    from oxbench.pipelines.presets import settings_rows
    from oxbench.schema import SPEC_KEY

    def spec_rows(config: object, prefix: str = "") -> list[tuple[str, object]]:
        out = []
        for f in dataclasses.fields(config):  # type: ignore[arg-type]
            value = getattr(config, f.name)
            if f.name in ("name", "stage_settings"):
                continue
            if SPEC_KEY in f.metadata:
                out.append((prefix + f.name, f.metadata[SPEC_KEY]))
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                out += spec_rows(value, f"{prefix}{f.name}.")
        for instance in getattr(config, "stage_instances", []) if not prefix else []:
            settings = config.stage(instance)  # type: ignore[attr-defined]
            if settings is not None:
                out += spec_rows(settings, f"{instance.split('#')[0]}.")
        return out

    def canonical(name: str) -> str:
        for nested, top in (("descriptor.features.", "features."), ("local_source.", "features.")):
            if name.startswith(nested):
                return top + name[len(nested) :]
        return name.removeprefix("descriptor.") if name.count(".") > 1 else name

    seen: dict[str, tuple[object, str]] = {}
    clashes = []
    for preset in list_methods():
        config = resolve_method(preset)
        rows = spec_rows(config)
        assert {r.name for r in settings_rows(config)} >= {n for n, _ in rows if "#" not in n}
        for name, spec in rows:
            key = canonical(name)
            if key in seen and seen[key][0] != spec:
                clashes.append(f"{key}: {seen[key][0]!r} in {seen[key][1]}, {spec!r} in {preset}")
            seen.setdefault(key, (spec, preset))
    assert not clashes, clashes
    assert {"vocabulary.size", "vocabulary.seed", "search.nlist", "assignment.k"} <= set(seen)


def test_methods_lists_every_stage_with_its_line_group_and_origin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`oxbench methods` ends with every re-ranking stage (a plugin's says where it comes from);
    `oxbench methods STAGE` lists the stage's settings as its schema declares them."""
    import json

    from oxbench.pipelines.rerankers import RERANKERS, Reranker, register_reranker, stage_about

    class Plugged(Reranker):
        """A stage from outside the package."""

        def rerank(self, ranking, space, ctx):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN201
            return ranking

    register_reranker("plugged-stage", Plugged)
    try:
        code, text, _ = _cli(capsys, "methods")
        assert code == 0
        listed = text.split("\nre-ranking stages (", 1)[1].splitlines()[1:]
        by_name = {line.split()[0]: line for line in listed}
        assert set(by_name) == set(RERANKERS.names())
        for stage in RERANKERS.names():
            assert stage_about(stage) in by_name[stage] and "\n" not in stage_about(stage)
        assert "(Zhong et al. 2017)  [k-reciprocal.*]" in by_name["k-reciprocal"]
        assert by_name["plugged-stage"].endswith(f"[no settings]  [from {__name__}]")
        assert "[from" not in by_name["superglobal"]
        code, text, _ = _cli(capsys, "methods", "k-reciprocal")
        assert code == 0 and text.startswith("k-reciprocal (re-ranking stage): k-reciprocal")
        rows = {line.split()[0]: line for line in text.splitlines()[3:]}
        assert set(rows) == {"setting"} | {
            f"k-reciprocal.{k}" for k in ("k1", "k2", "lambda_value", "graph", "top", "max_images")
        }
        assert rows["k-reciprocal.graph"].split()[1:3] == ["choice", "joint"]
        code, out, _ = _cli(capsys, "methods", "superglobal", "--json")
        entry = json.loads(out)
        assert code == 0 and entry["needs"] == ["dense"] and entry["phase"] == "query"
        assert [(s["name"], s["default"]) for s in entry["settings"]] == [
            ("superglobal.M", 400),
            ("superglobal.K", 9),
            ("superglobal.beta", 0.15),
        ]
        code, text, _ = _cli(capsys, "methods", "plugged-stage")
        assert code == 0 and "no settings" in text and f"[from {__name__}]" in text
    finally:
        RERANKERS.unregister("plugged-stage")


def test_every_stage_setting_takes_hostile_text_in_one_line() -> None:
    """Every setting of every registered stage a global method runs (the presets' fuzz above
    covers only the stages some preset names), fed the same hostile texts."""
    from oxbench.pipelines.rerankers import RERANKERS

    fuzzed = set()
    for stage in RERANKERS.names():
        try:
            base = resolve_method("features", rerank=stage)
        except InputError:  # a stage this family cannot serve (local features)
            continue
        settings = base.stage(stage)  # type: ignore[attr-defined]
        for f in dataclasses.fields(settings) if settings is not None else ():
            name = f"{stage}.{f.name}"
            spec = f.metadata[SPEC_KEY]
            for raw in HOSTILE:
                try:
                    resolved = resolve_method("features", rerank=stage, **{name: raw})
                except InputError as exc:
                    assert "\n" not in str(exc) and f.name in str(exc), (name, raw, str(exc))
                    continue
                value = getattr(resolved.stage(stage), f.name)  # type: ignore[attr-defined]
                assert spec.check(name, value) == value, (name, raw)
                assert not isinstance(value, float) or math.isfinite(value), (name, raw)
            fuzzed.add(stage)
    assert {"k-reciprocal", "superglobal", "egt", "cas", "diffusion", "alpha-qe"} <= fuzzed
