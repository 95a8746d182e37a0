"""One cache-folder type (oxbench.storage) and the mapped lists it lets a rerun open (issue 42
item 2, issue 39 item 5, issue 43 case 5).

A mapped HE / ASMK / BoW folder is bound to its inputs by content and to its settings: a second
run opens it (the very files: same inodes; the step recorded as a hit) and ranks the same; a
folder whose binding or content check fails is rebuilt with one warning; a symlinked or foreign
folder is refused, never written through.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oxbench.cache import CorruptCache
from oxbench.errors import InputError
from oxbench.fileio import TEMP_PREFIX
from oxbench.storage import BUILDING_NAME, StoreFolder, meta_digest, open_or_build


def box(path: Path) -> StoreFolder:
    return StoreFolder(path, "test folder", 3, frozenset({"data.bin"}))


# --- the folder type -----------------------------------------------------------------------------


def test_a_folder_is_absent_empty_own_older_or_foreign(tmp_path: Path) -> None:
    f = box(tmp_path / "f")
    assert f.state() == "absent"
    f.path.mkdir()
    assert f.state() == "empty"
    (f.path / "data.bin").write_bytes(b"x")  # an earlier oxbench's files only
    assert f.state() == "older"
    (f.path / "theirs.txt").write_text("a user's file")
    assert f.state() == "foreign"
    with pytest.raises(InputError, match="not one oxbench wrote") as info:
        f.refuse_foreign()
    assert "\n" not in str(info.value)
    g = box(tmp_path / "g")
    g.create({"n": 1}, stands_for={"input": "abc"})
    assert g.state() == "own"
    assert g.meta(stands_for={"input": "abc"}) == {
        "n": 1,
        "format": 3,
        "stands_for": {"input": "abc"},
    }
    (tmp_path / "file").write_text("x")
    assert box(tmp_path / "file").state() == "foreign"


def test_meta_is_checked_for_its_digest_format_and_binding(tmp_path: Path) -> None:
    f = box(tmp_path / "f")
    f.create({"n": 1}, stands_for={"input": "abc", "settings": [1, 2]})
    assert f.meta(stands_for={"input": "abc", "settings": (1, 2)})["n"] == 1
    with pytest.raises(CorruptCache, match="stands for another input than the one asked for"):
        f.meta(stands_for={"input": "abd", "settings": [1, 2]})
    meta = json.loads((f.path / "meta.json").read_text())
    (f.path / "meta.json").write_text(json.dumps({**meta, "n": 2}))  # edited, digest kept
    with pytest.raises(CorruptCache, match="does not match its recorded digest"):
        f.meta()
    fields = {k: v for k, v in meta.items() if k != "digest"} | {"format": 2}
    (f.path / "meta.json").write_text(json.dumps({**fields, "digest": meta_digest(fields)}))
    with pytest.raises(CorruptCache, match="format 2"):
        f.meta()
    (f.path / "meta.json").write_text(json.dumps({"format": 3}))  # an earlier oxbench's
    with pytest.raises(CorruptCache, match="older oxbench"):
        f.meta()
    with pytest.raises(InputError, match="no test folder here"):
        box(tmp_path / "none").meta()


def test_a_build_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    f = box(tmp_path / "f")
    with pytest.raises(RuntimeError), f.building() as tmp:
        (tmp / "data.bin").write_bytes(b"half")
        assert tmp.parent == f.path.parent and tmp.name.startswith(TEMP_PREFIX + "f.")
        assert json.loads((tmp / BUILDING_NAME).read_text())["builds"] == "f"
        raise RuntimeError("killed")
    assert f.state() == "absent" and not list(tmp_path.iterdir())
    with f.building() as tmp:
        (tmp / "data.bin").write_bytes(b"one")
        StoreFolder(tmp, f.what, f.format).write_meta({})
    assert (f.path / "data.bin").read_bytes() == b"one" and f.state() == "own"
    assert sorted(p.name for p in f.path.iterdir()) == ["data.bin", "meta.json"]
    inode = os.stat(f.path).st_ino
    with f.building() as tmp:  # a rebuild replaces the whole folder
        (tmp / "data.bin").write_bytes(b"two")
        StoreFolder(tmp, f.what, f.format).write_meta({})
    assert (f.path / "data.bin").read_bytes() == b"two" and os.stat(f.path).st_ino != inode
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_a_linked_or_foreign_folder_is_never_written_or_cleaned(tmp_path: Path) -> None:
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    stale = foreign / f"{TEMP_PREFIX}not-ours"
    stale.write_bytes(b"theirs")
    os.utime(stale, (0, 0))
    (foreign / "notes.txt").write_text("mine")
    cache = tmp_path / "cache"
    (cache / "kind").mkdir(parents=True)
    link = cache / "kind" / "entry"
    link.symlink_to(foreign, target_is_directory=True)
    with pytest.raises(InputError, match="symbolic link"):
        box(link).guard(below=cache)
    for f in (box(link), box(foreign)):
        assert f.state() == "foreign"
        assert f.remove_temps(older_than_s=0) == 0
        with pytest.raises(InputError, match="not one oxbench wrote"), f.building():
            pass
        with pytest.raises(InputError, match="not one oxbench wrote"):
            open_or_build(f, open_folder=lambda: 1, build=lambda: 2)
    assert sorted(p.name for p in foreign.iterdir()) == sorted(["notes.txt", stale.name])
    own = box(tmp_path / "own")
    own.create({})
    mine = own.path / f"{TEMP_PREFIX}meta.json.dead"
    mine.write_text("x")
    os.utime(mine, (0, 0))
    assert own.remove_temps() == 1 and not mine.exists()


def test_open_or_build_opens_what_passes_and_rebuilds_what_fails_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = box(tmp_path / "f")
    built: list[int] = []

    def build() -> str:
        built.append(1)
        f.create({}, stands_for={"input": "a"})
        return "built"

    def open_folder() -> str:
        f.meta(stands_for={"input": "a"})
        return "opened"

    assert open_or_build(f, open_folder=open_folder, build=build) == ("built", False)
    assert open_or_build(f, open_folder=open_folder, build=build) == ("opened", True)
    assert len(built) == 1 and not caplog.records
    fields = {"format": 3, "stands_for": {"input": "b"}}
    (f.path / "meta.json").write_text(json.dumps({**fields, "digest": meta_digest(fields)}))
    with caplog.at_level(logging.WARNING):
        assert open_or_build(f, open_folder=open_folder, build=build) == ("built", False)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "stands for another input" in warning.getMessage()
    assert "building it again" in warning.getMessage()


def test_stale_builds_go_only_when_named_and_bound_to_this_folder(tmp_path: Path) -> None:
    f = box(tmp_path / "f")
    old = time.time() - 7200

    def temp(name: str, builds: str | None) -> Path:
        t = tmp_path / f"{TEMP_PREFIX}{name}"
        t.mkdir()
        if builds is not None:
            (t / BUILDING_NAME).write_text(json.dumps({"builds": builds}))
        os.utime(t, (old, old))
        return t

    ours, other, unbound = temp("f.1", "f"), temp("f.2", "g"), temp("f.3", None)
    assert f.remove_stale_builds() == 1
    assert not ours.exists() and other.exists() and unbound.exists()


# --- mapped lists reused by a rerun --------------------------------------------------------------

#: A mapped-list preset of each family and the folder kind its lists live in.
MAPPED = [
    ("rootsift-he", {"inverted_file": "mapped"}, "he-lists", "signatures.npy"),
    ("rootsift-asmk", {"inverted_file": "mapped"}, "asmk-lists", "codes.npy"),
    ("rootsift-bow-sv-compact", {}, "postings", "ids.bin"),  # the streamed build
    ("rootsift-bow-sv-qe", {"inverted_file": "mapped"}, "postings", "ids.bin"),  # compressed after
]


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "extra", "kind", "column"), MAPPED)
def test_a_second_run_opens_the_lists_it_built_and_ranks_the_same(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    preset: str,
    extra: dict[str, object],
    kind: str,
    column: str,
) -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    from oxbench.pipelines import RunContext, resolve_method
    from test_pipeline import load_tiny, make_tiny_root, tiny

    root = make_tiny_root(tmp_path / "data")
    bench, train = load_tiny(root), load_tiny(root, "synthetic-train")

    def run() -> tuple[object, RunContext]:
        ctx = RunContext(tmp_path / "cache", progress=False)
        settings = {"vocabulary.size": 100, **extra, **tiny(preset)}
        impl = resolve_method(preset, **settings).build().fit(train, ctx).index(bench, ctx)
        return impl.search(bench, ctx), ctx

    first, ctx = run()
    assert ctx.steps[kind] == "computed"
    [folder] = [p for p in (tmp_path / "cache").glob(f"*/{kind}/*") if p.is_dir()]
    files = sorted(p for p in folder.iterdir())
    inodes = {p.name: os.stat(p).st_ino for p in files}
    with caplog.at_level(logging.WARNING):
        second, ctx = run()
    assert ctx.steps[kind] == "hit"  # opened, not built
    assert {p.name: os.stat(p).st_ino for p in folder.iterdir()} == inodes
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    np.testing.assert_array_equal(second.ranks, first.ranks)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(second.scores, first.scores)  # type: ignore[attr-defined]

    # a mapped file written over (its bytes, its size kept): the content check fails, rebuilt
    data = (folder / column).read_bytes()
    (folder / column).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        third, ctx = run()
    assert ctx.steps[kind] == "computed"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "building it again" in warning and column in warning
    np.testing.assert_array_equal(third.ranks, first.ranks)  # type: ignore[attr-defined]

    # a binding of other inputs (meta.json edited, its digest recomputed): rebuilt
    meta = json.loads((folder / "meta.json").read_text())
    fields = {k: v for k, v in meta.items() if k != "digest"}
    fields["stands_for"] = {**fields["stands_for"], "vocabulary": "another"}
    (folder / "meta.json").write_text(json.dumps({**fields, "digest": meta_digest(fields)}))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        fourth, ctx = run()
    assert ctx.steps[kind] == "computed"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "stands for another" in warning
    np.testing.assert_array_equal(fourth.ranks, first.ranks)  # type: ignore[attr-defined]
    assert json.loads((folder / "meta.json").read_text())["stands_for"] == meta["stands_for"]

    # a foreign folder in its place: refused in one line, nothing written into it
    import shutil

    shutil.rmtree(folder)
    folder.mkdir()
    (folder / "notes.txt").write_text("a user's file")
    with pytest.raises(InputError, match="not one oxbench wrote") as info:
        run()
    assert "\n" not in str(info.value)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


# --- the stores on the same folder type ----------------------------------------------------------


def _stores() -> list[tuple[str, object]]:
    from oxbench.features.descstore import DescriptorStore
    from oxbench.features.sift import SiftConfig
    from oxbench.features.store import FeatureStore

    return [
        ("features", lambda p, **kw: FeatureStore.open(p, SiftConfig(n_features=10), **kw)),
        ("descriptors", lambda p, **kw: DescriptorStore.open(p, {"kind": "test"}, **kw)),
    ]


@pytest.mark.parametrize(("kind", "open_store"), _stores())
def test_a_store_is_created_whole_and_a_foreign_or_linked_one_refused(
    tmp_path: Path, kind: str, open_store: object
) -> None:
    """Issue 43 case 5 for the stores: a store path that holds someone's folder (or a link to
    it) is refused in one line; nothing is written into it and its old temporaries stay."""
    from oxbench.storage import META_NAME

    opener: Any = open_store
    opener(tmp_path / "s")
    assert [p.name for p in (tmp_path / "s").iterdir()] == [META_NAME]
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporary left beside
    assert json.loads((tmp_path / "s" / META_NAME).read_text())["digest"]
    opener(tmp_path / "s")  # its own: opened
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    stale = theirs / f"{TEMP_PREFIX}x"
    stale.write_text("theirs")
    os.utime(stale, (0, 0))
    (tmp_path / "link").symlink_to(theirs, target_is_directory=True)
    for path in (theirs, tmp_path / "link"):
        with pytest.raises(InputError, match="not one oxbench wrote") as info:
            opener(path)
        assert "\n" not in str(info.value)
    assert sorted(p.name for p in theirs.iterdir()) == sorted(["notes.txt", stale.name])


def test_a_feature_store_of_an_earlier_oxbench_opens_as_before(tmp_path: Path) -> None:
    """The store's meta.json keeps the layout and digest it had before the folder type, so
    the features of existing caches are not described again."""
    from oxbench.features.sift import SiftConfig
    from oxbench.features.store import STORE_FORMAT, FeatureStore
    from oxbench.fileio import json_digest

    cfg = SiftConfig(n_features=10)
    folder = tmp_path / "s"
    folder.mkdir()
    before = {"format": STORE_FORMAT, "config": cfg.to_dict(), "role": "database"}
    text = json.dumps({**before, "digest": json_digest(before)})
    (folder / "meta.json").write_text(text)
    store = FeatureStore.open(folder, cfg, extra={"role": "database"})
    assert store.meta == before and (folder / "meta.json").read_text() == text
    with pytest.raises(InputError, match="another config"):
        FeatureStore.open(folder, cfg, extra={"role": "queries"})
