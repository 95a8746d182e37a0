"""``oxbench train``'s arguments through the settings schema, and a training that diverges: one line,
exit 2, the last good checkpoint kept (issue 21, item 2)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.schema import describe
from oxbench.train.loop import TrainConfig
from test_train import toy_training_set


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--lr", "nan"], "option --lr: expected a finite number, got 'nan'"),
        (["--lr", "0"], "option --lr: must be in (0, 10], got 0.0"),
        (["--lr", "abc"], "option --lr: expected a finite number, got 'abc'"),
        (["--margin", "nan"], "option --margin: expected a finite number"),
        (["--margin", "-1"], "option --margin: must be in (0, 2]"),
        (["--weight-decay", "nan"], "option --weight-decay: expected a finite number"),
        (["--lr-decay", "inf"], "option --lr-decay: expected a finite number, got 'inf'"),
        (
            ["--neg-num", "1000000000"],
            "option --neg-num: must be in [1, 1000] (a bound that keeps memory in reach)",
        ),
        (["--tuples", "1e30"], "option --tuples: expected a whole number, got '1e30'"),
        (["--epochs", "1.5"], "option --epochs: expected a whole number, got '1.5'"),
        (["--epochs", "1_0"], "option --epochs: expected a whole number, got '1_0'"),
        (["--epochs", "0"], "option --epochs: must be in [1, 100000]"),
        (["--batch-size", "1000", "--neg-num", "1000"], "images per step; at most 4,096"),
        (["--image-size", "-1"], "option --image-size: must be in [32, 2048]"),
        (
            ["--random-negative-epochs", "nan"],
            "option --random-negative-epochs: expected a whole number",
        ),
        (["--seed", "-1"], "option --seed: must be in"),
        (["--threads", "abc"], "option --threads: expected a whole number"),
        (
            ["--backbone", "timm:hf-hub:timm/resnet18"],
            "unknown backbone 'timm:hf-hub:timm/resnet18'",
        ),
    ],
)
def test_bad_training_arguments_are_one_line_before_anything_is_loaded(
    tmp_path, capsys, argv, expect
):
    root = tmp_path / "root"
    code, out, err = _cli(
        ["train", "--root", str(root), "--out", str(tmp_path / "m.pt"), *argv], capsys
    )
    assert code == 2 and out == "", (code, err)
    assert len(err.strip().splitlines()) == 1 and expect in err, err
    assert "Traceback" not in err
    assert not root.exists()  # refused before any data was loaded or generated


def test_the_schema_describes_every_training_option():
    rows = {r.name: r for r in describe(TrainConfig)}
    assert set(rows) == {f.name for f in TrainConfig.__dataclass_fields__.values()}
    assert rows["lr"].range == "in (0, 10]" and rows["neg_num"].kind == "size"


def test_library_config_refuses_nan_and_inf_too():
    for field in ("lr", "margin", "weight_decay", "lr_decay", "p"):
        for value in (math.nan, math.inf, -math.inf):
            with pytest.raises(InputError, match=f"option --{field.replace('_', '-')}:"):
                TrainConfig(**{field: value})


def test_a_nan_loss_stops_the_epoch_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from oxbench.train import loop

    torch.set_num_threads(1)
    cfg = TrainConfig(
        epochs=3, tuples=4, neg_num=2, batch_size=2, image_size=32, random_negative_epochs=3
    )
    ts = toy_training_set()
    out = tmp_path / "m.pt"
    real_loss = loop.contrastive_loss
    calls = {"n": 0}

    def nan_in_epoch_2(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls["n"] += 1
        loss = real_loss(*args, **kwargs)
        return loss * float("nan") if calls["n"] > 2 else loss  # 2 batches per epoch

    monkeypatch.setattr(loop, "contrastive_loss", nan_in_epoch_2)
    with pytest.raises(InputError) as exc:
        loop.train(cfg, ts, out, progress=False)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(
        "training diverged in epoch 2: the loss is nan at batch 1"
    ), msg
    assert "the checkpoint of epoch 1" in msg and "is kept" in msg
    assert not out.exists()
    state = torch.load(tmp_path / "m.pt.partial", weights_only=True)
    assert state["epoch"] == 0 and all(
        bool(torch.isfinite(v).all()) for v in state["model"].values() if v.is_floating_point()
    )
    monkeypatch.setattr(loop, "contrastive_loss", real_loss)
    record = loop.train(cfg, ts, out, progress=False)  # the rerun resumes from the good epoch
    assert [h["epoch"] for h in record["history"]] == [1, 2, 3]


def test_a_truncated_partial_training_suggests_restart(tmp_path):
    pytest.importorskip("torch")
    from oxbench.train import loop

    cfg = TrainConfig(epochs=1, tuples=2, neg_num=1, batch_size=2, image_size=32)
    out = tmp_path / "m.pt"
    (tmp_path / "m.pt.partial").write_bytes(b"PK\x03\x04truncated")
    with pytest.raises(InputError) as exc:
        loop.train(cfg, toy_training_set(), out, progress=False)
    msg = str(exc.value)
    assert "\n" not in msg and "m.pt.partial" in msg and "rerun with --restart" in msg, msg


def test_init_with_nan_weights_is_refused_before_data_is_loaded(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from oxbench.features.deep.model import build_net, save_model

    net = build_net("resnet18", "gem", weights="random").net
    with torch.no_grad():
        next(net.parameters()).fill_(float("nan"))
    save_model(tmp_path / "nan.pt", net)
    root = tmp_path / "root"
    code, out, err = _cli(
        [
            "train",
            "--root",
            str(root),
            "--init",
            str(tmp_path / "nan.pt"),
            "--out",
            str(tmp_path / "m.pt"),
        ],
        capsys,
    )
    assert (
        code == 2 and len(err.strip().splitlines()) == 1 and "holds NaN or infinite values" in err
    ), err
    assert not root.exists() and not Path(tmp_path / "m.pt").exists()
