"""Archive extraction against hostile archives: nothing outside the target is created or changed.

The class of attack: links. A per-link lexical check cannot see that ``a/b/c/d/e/u -> ../../../..``
makes ``a/b/c/d/e/u/b/c/d/e`` really ``a/b/c/d/e``, so a second link placed there climbs further
than it seems, and a regular file (or a hard link) written through it lands anywhere. No dataset
archive needs links, so every link, device and FIFO member is refused, in tar and zip alike.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxbench.datasets import archive
from oxbench.errors import InputError
from oxbench.fileio import TEMP_PREFIX, file_mode

# --- building archives ---------------------------------------------------------------------------


def _tar(
    path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz"
) -> Path:
    with tarfile.open(path, mode) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


def _zip(path: Path, members: list[tuple[str, bytes, int | None]]) -> Path:
    """Members ``(name, data, unix mode or None)``; a symlink is mode S_IFLNK with the target as data."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.create_system = 3  # Unix: external_attr's high 16 bits are st_mode
                info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


# The chain: u climbs 4 of its 5 folders (lexically inside); v, written *through* u, climbs 9
# levels from a place that is really 5 deep: 4 levels above the extraction folder.
_U = "a/b/c/d/e/u"
_V = "a/b/c/d/e/u/b/c/d/e/v"
_U_TARGET = "../../../.."
_V_TARGET = "../" * 9


def _chain_tar(path: Path, *, hardlink: bool = False) -> Path:
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_link(_U, _U_TARGET, tarfile.SYMTYPE), None),
        (_link(_V, _V_TARGET, tarfile.SYMTYPE), None),
        (_file(f"{_V}/escaped.txt"), b"pwned"),
    ]
    if hardlink:  # a hard link to the victim through the chain, then a file of the same name
        members += [
            (_link("hard", f"{_V}/victim.txt", tarfile.LNKTYPE), None),
            (_file("hard"), b"overwritten"),
        ]
    return _tar(path, members, mode="w")


def _chain_zip(path: Path) -> Path:
    lnk = stat.S_IFLNK | 0o777
    return _zip(
        path,
        [
            (_U, _U_TARGET.encode(), lnk),
            (_V, _V_TARGET.encode(), lnk),
            (f"{_V}/escaped.txt", b"pwned", stat.S_IFREG | 0o644),
        ],
    )


def _snapshot(base: Path, skip: Path | None = None) -> dict[str, tuple[str, int, str]]:
    """Every path below ``base`` (not following links): kind, size, content hash; ``skip`` excluded."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if skip is not None and (p == skip or skip in p.parents):
                continue
            st = os.lstat(p)
            kind = (
                "dir"
                if stat.S_ISDIR(st.st_mode)
                else "link"
                if stat.S_ISLNK(st.st_mode)
                else "file"
            )
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if kind == "file" else ""
            out[str(p.relative_to(base))] = (kind, st.st_size if kind == "file" else 0, digest)
    return out


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(base, extraction parent 3 levels below it, a victim file in base)."""
    parent = tmp_path / "r1" / "r2" / "root"
    parent.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    yield tmp_path, parent, victim


# --- good archives -------------------------------------------------------------------------------


def test_extract_good_tar_and_zip(tmp_path: Path) -> None:
    t = _tar(
        tmp_path / "ok.tgz",
        [(_file("a/b.jpg"), b"123"), (_file("a/sub/"), None), (_file("c.jpg"), b"")],
    )
    out = archive.extract_archive(t, tmp_path / "out")
    assert (out / "a" / "b.jpg").read_bytes() == b"123" and (out / "c.jpg").read_bytes() == b""
    # the private folder became the target with the user's umask, not 0700
    assert stat.S_IMODE(out.stat().st_mode) == archive._dir_mode()
    assert stat.S_IMODE((out / "a" / "b.jpg").stat().st_mode) == file_mode()
    z = _zip(
        tmp_path / "ok.zip",
        [("full/ukbench00000.jpg", b"zz", None), ("full/x.jpg", b"y", stat.S_IFREG | 0o600)],
    )
    out2 = archive.extract_archive(z, tmp_path / "out2")
    assert (out2 / "full" / "ukbench00000.jpg").read_bytes() == b"zz"
    assert (out2 / "full" / "x.jpg").read_bytes() == b"y"


def test_a_file_given_twice_in_a_tar_keeps_the_later_copy(tmp_path: Path) -> None:
    t = _tar(
        tmp_path / "twice.tar", [(_file("x.jpg"), b"first"), (_file("x.jpg"), b"second")], mode="w"
    )
    out = archive.extract_archive(t, tmp_path / "out")
    assert (out / "x.jpg").read_bytes() == b"second"


# --- hostile archives ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tar", "zip", "tar-hardlink"])
def test_chained_links_cannot_write_outside(site: tuple[Path, Path, Path], kind: str) -> None:
    base, parent, victim = site
    src = base.parent / f"{base.name}-chain.{kind}"  # the archive itself lies outside the snapshot
    if kind == "zip":
        _chain_zip(src)
    else:
        _chain_tar(src, hardlink=kind == "tar-hardlink")
    before = _snapshot(base)
    with pytest.raises(InputError, match="symbolic link.*refusing to extract") as exc:
        archive.extract_archive(src, parent / "out")
    assert str(exc.value).count("\n") == 0 and repr(_U) in str(exc.value)
    assert _snapshot(base) == before  # nothing outside created or changed, and no temp folder left
    assert victim.read_text() == "original"


def test_the_chain_really_escapes_without_the_fix(site: tuple[Path, Path, Path]) -> None:
    """The archive used above is a real attack: tar(1)-style extraction writes outside the root."""
    base, parent, victim = site
    src = _chain_tar(base.parent / f"{base.name}-chain.tar", hardlink=True)
    out = parent / "naive"
    out.mkdir()
    with tarfile.open(src) as tf:
        for (
            m
        ) in tf.getmembers():  # what the old code did: links created, files written through them
            dest = out / m.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if m.issym():
                os.symlink(m.linkname, dest)
            elif m.islnk():
                os.link(out / m.linkname, dest)
            else:
                f = tf.extractfile(m)
                assert f is not None
                with open(dest, "wb") as fh:
                    fh.write(f.read())
    assert (base / "escaped.txt").read_bytes() == b"pwned"
    assert victim.read_text() == "overwritten"


@pytest.mark.parametrize(
    "member, match",
    [
        ((_file("/etc/evil"), b"x"), "absolute path"),
        ((_file("C:/evil"), b"x"), "absolute path"),
        ((_file("../evil"), b"x"), r"'\.\.'"),
        ((_file("a/../../evil"), b"x"), r"'\.\.'"),
        (
            (_link("a/ln", "b", tarfile.SYMTYPE), None),
            "symbolic link",
        ),  # even one that stays inside
        ((_link("ln", "/etc/passwd", tarfile.SYMTYPE), None), "symbolic link"),
        ((_link("a/hard", "ok.jpg", tarfile.LNKTYPE), None), "hard link"),
        ((_link("a/hard", "../outside", tarfile.LNKTYPE), None), "hard link"),
        ((_special("dev/null", tarfile.CHRTYPE), None), "device node"),
        ((_special("dev/sda", tarfile.BLKTYPE), None), "device node"),
        ((_special("fifo", tarfile.FIFOTYPE), None), "FIFO"),
    ],
)
def test_malicious_tar_is_refused_and_nothing_written(
    site: tuple[Path, Path, Path], member: tuple, match: str
) -> None:
    base, parent, _ = site
    t = _tar(base.parent / f"{base.name}-evil.tgz", [(_file("ok.jpg"), b"fine"), member])
    before = _snapshot(base)
    with pytest.raises(InputError, match=match):
        archive.extract_archive(t, parent / "out")
    assert _snapshot(base) == before
    assert not (Path("/etc/evil").exists() and Path("/etc/evil").read_bytes() == b"x")


@pytest.mark.parametrize(
    "name, mode, match",
    [
        ("../../evil.txt", None, r"'\.\.'"),
        ("/abs.txt", None, "absolute path"),
        ("ln", stat.S_IFLNK | 0o777, "symbolic link"),
        ("fifo", stat.S_IFIFO | 0o644, "FIFO"),
        ("dev", stat.S_IFCHR | 0o644, "device node"),
        ("blk", stat.S_IFBLK | 0o644, "device node"),
        ("sock", stat.S_IFSOCK | 0o644, "special member"),
    ],
)
def test_malicious_zip_is_refused(
    site: tuple[Path, Path, Path], name: str, mode: int | None, match: str
) -> None:
    base, parent, _ = site
    z = _zip(
        base.parent / f"{base.name}-evil.zip", [("ok.jpg", b"fine", None), (name, b"target", mode)]
    )
    before = _snapshot(base)
    with pytest.raises(InputError, match=match):
        archive.extract_archive(z, parent / "out")
    assert _snapshot(base) == before


def test_a_folder_given_as_a_file_is_refused(tmp_path: Path) -> None:
    t = _tar(tmp_path / "x.tar", [(_file("a"), b"file"), (_file("a/b.jpg"), b"x")], mode="w")
    with pytest.raises(InputError, match="gives as a file"):
        archive.extract_archive(t, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tar"]


def test_corrupt_and_truncated_archives(tmp_path: Path) -> None:
    good = _tar(tmp_path / "g.tgz", [(_file(f"img{i}.jpg"), os.urandom(20_000)) for i in range(5)])
    data = good.read_bytes()
    trunc = tmp_path / "t.tgz"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="corrupt or truncated"):
        archive.extract_archive(trunc, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    junk = tmp_path / "junk.tgz"
    junk.write_bytes(b"<html>not found</html>")
    with pytest.raises(InputError, match="not a tar or zip"):
        archive.extract_archive(junk, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --- the private folder --------------------------------------------------------------------------


def test_extraction_goes_through_a_fresh_private_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int, list[str]]] = []
    real = archive._extract_tar

    def spy(path: Path, out: Path) -> int:
        seen.append((out.name, stat.S_IMODE(out.stat().st_mode), os.listdir(out)))
        return real(path, out)

    monkeypatch.setattr(archive, "_extract_tar", spy)
    t = _tar(tmp_path / "a.tar", [(_file("x.jpg"), b"1")], mode="w")
    archive.extract_archive(t, tmp_path / "out1")
    archive.extract_archive(t, tmp_path / "out2")
    (n1, mode1, listing1), (n2, _, _) = seen
    assert mode1 == 0o700 and listing1 == [] and n1 != n2
    assert n1.startswith(f"{TEMP_PREFIX}out1.{os.getpid()}.") and n1.endswith(".extracting")


def test_stale_private_folders_of_killed_processes_are_removed(tmp_path: Path) -> None:
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)  # that process has exited (its pid is not reused this quickly)
    stale = tmp_path / f"{TEMP_PREFIX}out.{dead_pid}.abcd1234.extracting"
    live = tmp_path / f"{TEMP_PREFIX}out.{os.getppid()}.abcd1234.extracting"
    old_live = tmp_path / f"{TEMP_PREFIX}other.{os.getppid()}.zzzz1234.extracting"
    other = tmp_path / ".extract-something"  # not ours to judge
    for d in (stale, live, old_live, other):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f.jpg").write_bytes(b"x")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old_live, (two_days_ago, two_days_ago))
    t = _tar(tmp_path / "a.tar", [(_file("x.jpg"), b"1")], mode="w")
    archive.extract_archive(t, tmp_path / "out")
    assert not stale.exists() and not old_live.exists()
    assert live.exists() and other.exists() and (tmp_path / "out" / "x.jpg").exists()


# --- property: any mix of member names and kinds ---------------------------------------------------

_parts = st.lists(st.sampled_from(["a", "b", "..", ".", "", "u"]), min_size=1, max_size=6)
_kinds = st.sampled_from(["file", "dir", "sym", "hard"])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(members=st.lists(st.tuples(_parts, _kinds, _parts), min_size=1, max_size=6))
def test_any_archive_extracts_inside_or_is_refused(
    tmp_path_factory: pytest.TempPathFactory, members: list
) -> None:
    base = tmp_path_factory.mktemp("prop")
    parent = base / "p1" / "p2"
    parent.mkdir(parents=True)
    (base / "victim.txt").write_text("original")
    entries = []
    for name_parts, kind, target_parts in members:
        name, target = "/".join(name_parts), "/".join(target_parts)
        if kind == "file":
            entries.append((_file(name), b"data"))
        elif kind == "dir":
            entries.append((_special(name, tarfile.DIRTYPE), None))
        else:
            entries.append(
                (_link(name, target, tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE), None)
            )
    src = base.parent / f"{base.name}.tar"
    _tar(src, entries, mode="w")
    before = _snapshot(base, skip=parent / "out")
    try:
        out = archive.extract_archive(src, parent / "out")
    except InputError:
        assert not (parent / "out").exists()
    else:
        assert all(k in ("file", "dir") for _, k, _ in members)
        for p in out.rglob("*"):
            assert not p.is_symlink() and p.resolve().is_relative_to(out.resolve())
    assert _snapshot(base, skip=parent / "out") == before


# --- the same archives served by a malicious mirror, through `oxbench data fetch` -------------------


@pytest.mark.parametrize("kind", ["tar", "tar-hardlink", "zip"])
def test_fetch_from_a_malicious_mirror_writes_nothing_outside_the_root(
    site: tuple[Path, Path, Path],
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from oxbench.cli import main
    from oxbench.datasets import fetch as fetch_mod
    from oxbench.datasets.lock import LockFile
    from test_datasets import make_revisited
    from test_fetch import Behaviour, Server

    base, _, victim = site
    # The private extraction folder is <root>/roxford5k/<private>: the chain climbs 4 levels from
    # there, i.e. to `base`.
    root = base / "d1" / "root"
    root.mkdir(parents=True)
    src = base.parent / f"{base.name}-src"
    make_revisited(src)
    evil = base.parent / f"{base.name}-evil"
    _chain_zip(evil) if kind == "zip" else _chain_tar(evil, hardlink=kind == "tar-hardlink")
    monkeypatch.setattr(fetch_mod, "disk_free", lambda p: 10**13)
    monkeypatch.delenv("OXBENCH_MIRROR", raising=False)
    server = Server()
    try:
        server.paths["/~vgg/data/oxbuildings/oxbuild_images-v1.tgz"] = Behaviour(evil.read_bytes())
        server.paths["/revisitop/data/datasets/roxford5k/gnd_roxford5k.pkl"] = Behaviour(
            (src / "gnd_roxford5k.pkl").read_bytes()
        )
        before = _snapshot(base, skip=root)
        with pytest.raises(SystemExit) as exc:
            main(
                [
                    "data",
                    "fetch",
                    "roxford5k",
                    "--root",
                    str(root),
                    "--mirror",
                    server.base,
                    "--accept-terms",
                    "--no-progress",
                ]
            )
    finally:
        server.close()
    err = capsys.readouterr().err
    assert exc.value.code == 2
    last = err.strip().splitlines()[-1]
    assert "symbolic link" in last and "oxbuild_images-v1.tgz" in last and "Traceback" not in err
    assert _snapshot(base, skip=root) == before and victim.read_text() == "original"
    ddir = root / "roxford5k"
    assert not [p for p in ddir.rglob("*") if p.is_symlink()]
    assert not list(ddir.glob(f"{TEMP_PREFIX}*")) and not list(ddir.glob(".extract-*"))
    lock = LockFile(root)
    assert "oxbuild_images-v1.tgz" not in lock.read()["files"]  # a hostile archive is never trusted
    assert "oxbuild_images-v1.tgz" not in lock.installed("roxford5k")
