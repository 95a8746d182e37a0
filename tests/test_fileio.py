"""The one I/O module: atomic writes, refused output paths, bounded input reads, digests, locks."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from oxbench import fileio
from oxbench.errors import InputError


def test_atomic_writes_round_trip(tmp_path: Path) -> None:
    fileio.atomic_write_json(tmp_path / "a" / "b.json", {"x": 1})
    assert json.loads((tmp_path / "a" / "b.json").read_text()) == {"x": 1}
    fileio.atomic_write_npy(tmp_path / "r.npy", np.arange(5))
    assert np.load(tmp_path / "r.npy").tolist() == [0, 1, 2, 3, 4]
    fileio.atomic_write_npz(tmp_path / "z.npz", {"a": np.ones(3)}, compress=True)
    assert np.load(tmp_path / "z.npz")["a"].sum() == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(fileio.TEMP_PREFIX)]


def test_failed_write_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), fileio.atomic_open(target) as fh:
        fh.write(b"half")
        raise RuntimeError("crash")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_written_files_follow_the_umask(tmp_path: Path) -> None:
    fileio.atomic_write_text(tmp_path / "t.txt", "x")
    mode = stat.S_IMODE(os.stat(tmp_path / "t.txt").st_mode)
    assert mode == fileio.file_mode()
    assert mode & 0o044  # readable by others under the usual 022 umask, not mkstemp's 0600


def test_symlink_fifo_and_folder_are_never_replaced(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    for path, words in (
        (link, "symbolic link"),
        (fifo, "special file"),
        (tmp_path / "dir", "folder"),
    ):
        with pytest.raises(InputError, match=words):
            fileio.atomic_write_text(path, "new")
    assert link.is_symlink() and victim.read_text() == "keep"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_parent_is_a_file_and_read_only_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="parent of this path is a file"):
        fileio.atomic_write_text(tmp_path / "f" / "x.txt", "x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores permissions
            pytest.skip("running as a user that can write to read-only folders")
        with pytest.raises(InputError, match="Permission denied"):
            fileio.atomic_write_text(ro / "x.txt", "x")
    finally:
        ro.chmod(0o700)


def test_read_input_refuses_special_and_huge_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a regular file"):
        fileio.read_input_bytes("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        fileio.read_input_bytes(fifo)  # must not block waiting for a writer
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="limit"):
        fileio.read_input_bytes(big, limit=100)
    assert fileio.read_input_bytes(big, limit=101) == b"x" * 101
    with pytest.raises(InputError, match="file not found"):
        fileio.read_input_bytes(tmp_path / "missing")
    with pytest.raises(InputError, match="folder"):
        fileio.read_input_bytes(tmp_path)


def test_digests_and_checksum_comparison(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    d = fileio.file_digests(p, ("sha256", "md5"))
    assert d["sha256"].startswith("ba7816bf") and d["md5"] == "900150983cd24fb0d6963f7d28e17f72"
    assert (
        fileio.checksum_mismatch({"size": 3, "sha256": d["sha256"].upper()}, {"size": 3, **d})
        is None
    )
    assert "size" in (fileio.checksum_mismatch({"size": 4}, {"size": 3}) or "")
    assert "md5" in (fileio.checksum_mismatch({"md5": "0" * 32}, d) or "")
    assert fileio.checksum_mismatch({"sha256": None}, d) is None
    before = fileio.sampled_digest(p)
    p.write_bytes(b"abd")
    assert fileio.sampled_digest(p) != before


def _hold(path: str, ready: mp.synchronize.Event, release: mp.synchronize.Event) -> None:
    with fileio.file_lock(path):
        ready.set()
        release.wait(10)


def test_file_lock_excludes_a_second_process(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    lock = tmp_path / "x.lock"
    proc = ctx.Process(target=_hold, args=(str(lock), ready, release))
    proc.start()
    try:
        assert ready.wait(30)
        with (
            pytest.raises(fileio.LockBusy, match="another oxbench process"),
            fileio.file_lock(lock, wait=0.2),
        ):
            pass
    finally:
        release.set()
        proc.join(30)
    with fileio.file_lock(lock):  # released when the holder exits
        pass


def test_stale_temps_are_removed_fresh_ones_kept(tmp_path: Path) -> None:
    old = tmp_path / f"{fileio.TEMP_PREFIX}a.json.xyz"
    new = tmp_path / f"{fileio.TEMP_PREFIX}b.json.xyz"
    keep = tmp_path / "c.json"
    for p in (old, new, keep):
        p.write_text("")
    os.utime(old, (1, 1))
    assert fileio.remove_stale_temps(tmp_path) == 1
    assert not old.exists() and new.exists() and keep.exists()


def test_an_input_replaced_by_a_rename_while_opened_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock file is replaced atomically by other threads' updates: a reader that stat'ed the
    old file and opened the new one reads the new one whole (it used to say 'file grew')."""
    path = tmp_path / "lock.json"
    path.write_bytes(b"{}")
    real_stat = fileio.require_regular_file

    def stat_then_replace(p):  # noqa: ANN001, ANN202
        st = real_stat(p)
        (tmp_path / "new").write_bytes(b'{"a": 1}')
        os.replace(tmp_path / "new", path)
        return st

    monkeypatch.setattr(fileio, "require_regular_file", stat_then_replace)
    assert fileio.read_input_bytes(path) == b'{"a": 1}'


def test_remove_stale_temps_never_deletes_through_a_linked_folder(tmp_path: Path) -> None:
    """Issue 43 case 5: a cache folder replaced by a symlink keeps the target's old temporaries."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    old = target / f"{fileio.TEMP_PREFIX}theirs"
    old.write_bytes(b"x")
    os.utime(old, (0, 0))
    link = tmp_path / "cache"
    link.symlink_to(target, target_is_directory=True)
    assert fileio.remove_stale_temps(link) == 0
    assert old.exists()
    assert fileio.remove_stale_temps(target) == 1  # the same file in a real folder is removed


def test_refuse_linked_folder_names_the_link(tmp_path: Path) -> None:
    """Issue 43 case 5: a link anywhere below the cache root is refused in one line; the root may be one."""
    real = tmp_path / "real"
    (real / "ds" / "he-lists").mkdir(parents=True)
    root = tmp_path / "root"
    root.symlink_to(real, target_is_directory=True)
    ok = root / "ds" / "he-lists" / "abc"
    assert fileio.refuse_linked_folder(ok, below=root) == ok
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (real / "ds" / "he-lists" / "abc").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InputError, match="symbolic link") as info:
        fileio.refuse_linked_folder(ok, below=root)
    assert "\n" not in str(info.value) and "abc" in str(info.value)
    (real / "ds" / "postings").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InputError, match="postings"):
        fileio.refuse_linked_folder(root / "ds" / "postings" / "k", below=root)
