"""Every ``bash`` and ``python`` block of README.md and docs/*.md runs as written.

Each document's blocks run in order, in a fresh folder that holds small stand-ins for the files the
docs name (:data:`STAND_INS`: a file name -> a function that writes it), with an ``oxbench`` on
``PATH`` that runs this interpreter's package, ``$OXBENCH_DATA`` pointing at a stand-in data root
and ``$HOME`` inside the folder. Output samples are fenced as ``text``. A block that cannot run on
small data is preceded by ``<!-- docs-test: skip (reason) -->``, visible in the source of the page.

To document a command on a new file name, add a maker to :data:`STAND_INS`.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = {"bash", "python"}
KNOWN_LANGS = RUN_LANGS | {"text"}
SKIP_RE = re.compile(r"^<!--\s*docs-test:\s*skip\s*\((?P<why>[^)]+)\)\s*-->$")
BLOCK_TIMEOUT_S = 120


# --------------------------------------------------------------------------------------------
# Reading the blocks


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the reason given in a docs-test skip comment just before the block

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, with their language and docs-test skip reason."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(`{3,})(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{start + 1}: code block is never closed")
        prev = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
        skip = SKIP_RE.match(prev)
        blocks.append(
            Block(
                path,
                start + 1,
                lang,
                "\n".join(lines[start + 1 : j]) + "\n",
                skip.group("why") if skip else None,
            )
        )
        i = j + 1
    return blocks


def newcomer_block(blocks: list[Block]) -> Block:
    """README's first block: the two newcomer lines that create venvs (CI runs the test one)."""
    first = blocks[0]
    assert first.path.name == "README.md" and first.line == 3, first.where
    assert all("-m venv" in ln for ln in first.code.splitlines()), first.code
    return first


# --------------------------------------------------------------------------------------------
# Stand-in inputs, named as the docs name them

N_ROX, NQ_ROX = 4993, 70  # ROxford's real sizes: --dataset roxford5k checks them
OXFORD_QUERIES = [("all_souls", 1), ("all_souls", 2), ("ashmolean", 1), ("ashmolean", 2)]


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(name.encode()))


def _tiny_jpeg(path: Path, size: tuple[int, int] = (64, 48)) -> None:
    from PIL import Image

    rgb = _rng(path.name).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path, quality=80)


def _rox_gnd() -> dict[str, object]:
    rng = _rng("roxford")
    gnd = []
    for q in range(NQ_ROX):
        idx = rng.choice(N_ROX, size=30, replace=False).tolist()
        easy = [] if q < 2 else idx[:10]  # as in ROxford: two queries without Easy images
        gnd.append(
            {"bbx": [4.0, 3.0, 50.0, 40.0], "easy": easy, "hard": idx[10:22], "junk": idx[22:]}
        )
    return {
        "imlist": [f"rox_{i:06d}" for i in range(N_ROX)],
        "qimlist": [f"rox_query_{q:02d}" for q in range(NQ_ROX)],
        "gnd": gnd,
    }


def make_gnd_roxford5k(path: Path) -> None:
    path.write_bytes(pickle.dumps(_rox_gnd()))


def make_revisited_ranks(path: Path) -> None:
    rng = _rng(path.name)
    np.save(path, np.stack([rng.permutation(N_ROX) for _ in range(NQ_ROX)], axis=1))


def make_revisited_scores(path: Path) -> None:
    np.save(path, _rng(path.name).standard_normal((N_ROX, NQ_ROX)).astype(np.float32))


def make_db_features(path: Path) -> None:
    np.save(path, _rng(path.name).standard_normal((N_ROX, 16)).astype(np.float32))


def make_oxford_fvecs(path: Path) -> None:
    """A texmex file of every ROxford image (database and queries) in sorted-name order."""
    x = _rng(path.name).standard_normal((N_ROX + NQ_ROX, 16)).astype(np.float32)
    rows = np.hstack([np.full((len(x), 1), 16, dtype=np.int32), x.view(np.int32)])
    rows.tofile(path)


def make_query_features(path: Path) -> None:
    np.save(path, _rng(path.name).standard_normal((NQ_ROX, 16)).astype(np.float32))


def _oxford() -> tuple[list[str], list[dict[str, object]]]:
    """A small original-protocol set: 2 landmarks x 2 queries, 40 images (sorted, as the old-protocol
    pickles), the query images in the database."""
    names = sorted(
        [f"all_souls_{i:06d}" for i in range(12)]
        + [f"ashmolean_{i:06d}" for i in range(12)]
        + [f"oxford_{i:06d}" for i in range(16)]
    )
    queries = []
    for landmark, n in OXFORD_QUERIES:
        own = [i for i, s in enumerate(names) if s.startswith(landmark)]
        good, ok, junk = own[:5], own[5:8], own[8:10]
        queries.append(
            {
                "id": f"{landmark}_{n}",
                "image": names[good[n - 1]],
                "bbx": [10.0, 12.0, 300.0, 400.0],
                "good": good,
                "ok": ok,
                "junk": junk,
            }
        )
    return names, queries


def make_gnd_oxford5k(path: Path) -> None:
    names, queries = _oxford()
    path.write_bytes(
        pickle.dumps(
            {
                "imlist": names,
                "qimlist": [q["image"] for q in queries],
                "gnd": [
                    {"bbx": q["bbx"], "ok": sorted(q["good"] + q["ok"]), "junk": q["junk"]}
                    for q in queries
                ],
            }
        )
    )


def make_oxford_ranks(path: Path) -> None:
    rng = _rng(path.name)
    names, queries = _oxford()
    np.save(path, np.stack([rng.permutation(len(names)) for _ in queries], axis=1))


def make_gt_files(folder: Path) -> None:
    names, queries = _oxford()
    folder.mkdir()
    for q in queries:
        for label in ("good", "ok", "junk"):
            lines = "".join(f"{names[i]}\n" for i in q[label])  # type: ignore[attr-defined]
            (folder / f"{q['id']}_{label}.txt").write_text(lines)
        x1, y1, x2, y2 = q["bbx"]  # type: ignore[misc]
        (folder / f"{q['id']}_query.txt").write_text(f"oxc1_{q['image']} {x1} {y1} {x2} {y2}\n")


def make_ranked_lists(folder: Path) -> None:
    names, queries = _oxford()
    folder.mkdir()
    for q in queries:
        order = _rng(str(q["id"])).permutation(len(names))
        (folder / f"{q['id']}.txt").write_text("".join(f"{names[i]}\n" for i in order))


def _holidays_names() -> list[str]:
    """1,491 names in 500 groups, as the real list: ``<group><nn>.jpg``, ``nn == 00`` the query."""
    sizes = [3] * 491 + [2] * 9
    return [f"{(1000 + g) * 100 + i}.jpg" for g, n in enumerate(sizes) for i in range(n)]


def make_holidays_images(path: Path) -> None:
    path.write_text("\n".join(_holidays_names()))  # the real file has no final newline


def make_holidays_results(path: Path) -> None:
    names = _holidays_names()
    rng = _rng(path.name)
    lines = []
    for q in (n for n in names if n[-6:-4] == "00"):
        group = [n for n in names if n[:4] == q[:4]]
        others = [
            names[i] for i in rng.choice(len(names), 8, replace=False) if names[i][:4] != q[:4]
        ]
        ranked = group[:1] + others[:3] + group[1:] + others[3:]
        lines.append(" ".join([q] + [f"{r} {n}" for r, n in enumerate(ranked)]))
    path.write_text("\n".join(lines) + "\n")


def make_ukbench_ranks(path: Path) -> None:
    n = 10200
    rng = _rng(path.name)
    own = (np.arange(n) // 4) * 4
    top = np.stack([own + (np.arange(n) + s) % 4 for s in range(4)])  # the object's 4 images
    swap = rng.random(n) < 0.3  # some columns lose their last image to a random other one
    top[3, swap] = rng.integers(0, n, swap.sum())
    top[3, swap] = np.where(
        top[3, swap] // 4 == own[swap] // 4, (top[3, swap] + 4) % n, top[3, swap]
    )
    np.save(path, top)


def make_gldv2_solution(path: Path) -> None:
    path.write_text("id,images,Usage\nq1,a b,Public\nq2,c,Public\nq3,d,Private\nq4,,Ignored\n")


def make_gldv2_submission(path: Path) -> None:
    path.write_text("id,images\nq1,a b\nq3,d\nq4,a\n")  # q2 has no prediction


_ILIAS_INSTANCES = ("brisk_zip_000", "cozy_pop_001")


def make_ilias_ids(folder: Path) -> None:
    ids = folder / "image_ids"
    ids.mkdir(parents=True)
    a, b = _ILIAS_INSTANCES
    (ids / "image_query_ids.txt").write_text(
        f"{a}/query/Q000_00.jpg,{a}\n{b}/query/Q001_00.jpg,{b}\n"
    )
    (ids / "text_query_ids.txt").write_text(f"{a}/query/T000.txt\n{b}/query/T001.txt\n")
    (ids / "positive_ids.txt").write_text(
        f"{a}/pos/P000_00.jpg,0.05,10\n{a}/pos/P000_01.jpg,0.2,40\n{b}/pos/P001_00.jpg,0.5,60\n"
    )


def make_ilias_similarities(path: Path) -> None:
    a, b = _ILIAS_INSTANCES
    sims = {
        f"{a}/query/Q000_00.jpg": {"yfcc/1": 0.9, f"{a}/pos/P000_01.jpg": 0.8, "yfcc/2": 0.7},
        f"{b}/query/Q001_00.jpg": {f"{b}/pos/P001_00.jpg": 0.6, "yfcc/1": 0.5},
        f"{a}/query/T000.txt": {f"{a}/pos/P000_00.jpg": 0.4, f"{a}/pos/P000_01.jpg": 0.4},
    }
    path.write_text(json.dumps(sims))


def make_ilias_taxonomy(path: Path) -> None:
    a, b = _ILIAS_INSTANCES
    path.write_text(json.dumps({"product": {"food": {"cake": [a]}}, "art": {"statue": {"x": [b]}}}))


def make_data_root(root: Path) -> None:
    """``$OXBENCH_DATA``: an installed roxford5k (empty database files, real tiny query JPEGs) and
    an installed holidays with both orientations (empty files; loading does not decode)."""
    rox = root / "roxford5k"
    (rox / "jpg").mkdir(parents=True)
    gnd = _rox_gnd()
    (rox / "gnd_roxford5k.pkl").write_bytes(pickle.dumps(gnd))
    for name in gnd["imlist"]:  # type: ignore[attr-defined]
        (rox / "jpg" / f"{name}.jpg").touch()
    for name in gnd["qimlist"]:  # type: ignore[attr-defined]
        _tiny_jpeg(rox / "jpg" / f"{name}.jpg")
    hol = root / "holidays"
    for folder in ("jpg", "jpg_rotated"):
        (hol / folder).mkdir(parents=True)
        for name in _holidays_names():
            (hol / folder / name).touch()
    make_holidays_images(hol / "holidays_images.dat")


def _revisited_download(folder: Path, dataset: str, n_db: int, seed: int) -> None:
    """``<folder>/jpg/*.jpg`` and ``gnd_<dataset>.pkl`` at the real counts, as revisitop lays them out.

    The queries and a quarter of the labelled images are small noise JPEGs (SIFT finds features
    there); every other image is a flat grey JPEG, which has none, so a classic run on it is fast.
    """
    import io

    from PIL import Image

    rng = _rng(dataset)
    (folder / "jpg").mkdir(parents=True)

    def jpeg(img: Image.Image) -> bytes:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=80)
        return buf.getvalue()

    noise = [
        jpeg(Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))) for _ in range(16)
    ]
    grey = jpeg(Image.new("RGB", (32, 24), (128, 128, 128)))
    names = [f"{dataset}_{i:06d}" for i in range(n_db)]
    qnames = [f"{dataset}_query_{q:02d}" for q in range(NQ_ROX)]
    gnd, labelled = [], set()
    for _ in range(NQ_ROX):
        idx = rng.choice(n_db, size=30, replace=False).tolist()
        labelled.update(idx[:22])
        gnd.append(
            {"bbx": [4.0, 3.0, 50.0, 40.0], "easy": idx[:10], "hard": idx[10:22], "junk": idx[22:]}
        )
    for i, name in enumerate(names):
        (folder / "jpg" / f"{name}.jpg").write_bytes(
            noise[i % 16] if i in labelled and i % 4 == 0 else grey
        )
    for q, name in enumerate(qnames):
        (folder / "jpg" / f"{name}.jpg").write_bytes(noise[q % 16])
    (folder / f"gnd_{dataset}.pkl").write_bytes(
        pickle.dumps({"imlist": names, "qimlist": qnames, "gnd": gnd})
    )


def make_downloads(folder: Path) -> None:
    """``downloads/roxford5k`` and ``downloads/rparis6k``: what a user unpacked from the owners' archives."""
    _revisited_download(folder / "roxford5k", "roxford5k", N_ROX, 0)
    _revisited_download(folder / "rparis6k", "rparis6k", 6322, 1)


def make_features_mat(path: Path) -> None:
    """revisitop's single .mat of a global descriptor: ``X`` [d, n_db] and ``Q`` [d, n_queries]."""
    from scipy.io import savemat

    rng = _rng(path.name)
    savemat(
        path,
        {
            "X": rng.standard_normal((16, N_ROX)).astype(np.float32),
            "Q": rng.standard_normal((16, NQ_ROX)).astype(np.float32),
        },
    )


def make_local_features_h5(path: Path) -> None:
    """hloc's ``features.h5`` for the stand-in roxford5k: 10 keypoints a 64x48 image, 32-D float16
    descriptors; a query's (inside its box) shared, noisily, by its Easy and Hard images."""
    import h5py

    gnd = _rox_gnd()
    rng = _rng(path.name)
    n, d = 10, 32
    db = rng.standard_normal((N_ROX, n, d))
    queries = rng.standard_normal((NQ_ROX, n, d))
    for q, g in enumerate(gnd["gnd"]):  # type: ignore[attr-defined]
        for i in g["easy"] + g["hard"]:
            db[i] = queries[q] + 0.3 * rng.standard_normal((n, d))
    x0, y0, x1, y1 = gnd["gnd"][0]["bbx"]  # type: ignore[index]
    with h5py.File(path, "w") as f:
        for names, descs in ((gnd["imlist"], db), (gnd["qimlist"], queries)):
            for name, desc in zip(names, descs, strict=True):  # type: ignore[call-overload]
                g = f.create_group(name)
                g["keypoints"] = np.stack(
                    [rng.uniform(x0 + 1, x1 - 1, n), rng.uniform(y0 + 1, y1 - 1, n)], axis=1
                ).astype(np.float32)
                g["descriptors"] = desc.T.astype(np.float16)  # [d, n], as hloc stores them
                g["image_size"] = np.array([64, 48])


STAND_INS: dict[str, Callable[[Path], None]] = {
    "features.h5": make_local_features_h5,
    "downloads": make_downloads,
    "features.mat": make_features_mat,
    "oxford_features.fvecs": make_oxford_fvecs,
    "gnd_roxford5k.pkl": make_gnd_roxford5k,
    "ranks.npy": make_revisited_ranks,
    "scores.npy": make_revisited_scores,
    "X.npy": make_db_features,
    "Q.npy": make_query_features,
    "gnd_oxford5k.pkl": make_gnd_oxford5k,
    "ranks_oxford5k.npy": make_oxford_ranks,
    "gt_files_170407": make_gt_files,
    "my_ranked_lists": make_ranked_lists,
    "holidays_images.dat": make_holidays_images,
    "results.dat": make_holidays_results,
    "ranks_ukbench.npy": make_ukbench_ranks,
    "retrieval_solution_v2.1.csv": make_gldv2_solution,
    "submission.csv": make_gldv2_submission,
    "ilias": make_ilias_ids,
    "similarities.json": make_ilias_similarities,
    "taxonomy.json": make_ilias_taxonomy,
    "data": make_data_root,
}


def prepare_workspace(folder: Path, code: str | None = None) -> dict[str, str]:
    """Write the stand-ins (those named in ``code``, all when None; the data root ``$OXBENCH_DATA``
    always) and the ``oxbench``/``python`` shims; return the blocks' environment."""
    for name, make in STAND_INS.items():
        if (
            code is None
            or name == "data"
            or re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", code)
        ):
            make(folder / name)
    return block_env(folder)


def block_env(folder: Path) -> dict[str, str]:
    """The ``oxbench``/``python`` shims in ``folder/bin`` and the environment the blocks run in."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for tool, args in (("oxbench", "-m oxbench"), ("python", "")):
        shim = bin_dir / tool
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        shim.chmod(0o755)
    (folder / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OXBENCH_")}
    env.pop("XDG_DATA_HOME", None)
    # the blocks import the oxbench these tests import (a checkout's src/ or the installed package)
    import oxbench

    package_parent = str(Path(oxbench.__file__).resolve().parents[1])
    pythonpath = [
        package_parent,
        *(str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p),
    ]
    env.update(
        PYTHONPATH=os.pathsep.join(pythonpath),
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(folder / "home"),
        OXBENCH_DATA=str(folder / "data"),
    )
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.lang == "bash":
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:  # as a reader runs it: saved as a plain script (no __main__ guard), run by path
        script = cwd / f"docs_block_{block.path.stem}_{block.line}.py"
        script.write_text(block.code, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{block.where}: the {block.lang} block exits {proc.returncode}\n"
            f"--- block ---\n{block.code}--- stdout ---\n{proc.stdout[-3000:]}"
            f"--- stderr ---\n{proc.stderr[-3000:]}",
            pytrace=False,
        )


# --------------------------------------------------------------------------------------------
# Tests


def test_every_block_is_tagged_and_every_skip_is_explained() -> None:
    for path in DOCS:
        for b in read_blocks(path):
            assert b.lang in KNOWN_LANGS, (
                f"{b.where}: fence the block as bash, python or text, not {b.lang!r}"
            )
            if b.skip is not None:
                assert b.lang in RUN_LANGS, f"{b.where}: a skip comment before a {b.lang} block"
    readme = read_blocks(REPO / "README.md")
    newcomer_block(readme)
    # a skip comment followed by something other than a block is a typo that would skip nothing
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, ln in enumerate(lines):
            if "docs-test" in ln and not (
                SKIP_RE.match(ln.strip()) and i + 1 < len(lines) and lines[i + 1].startswith("```")
            ):
                inside = sum(1 for x in lines[:i] if x.startswith("```")) % 2 == 1
                assert inside, f"{path.name}:{i + 1}: malformed docs-test comment: {ln!r}"


def test_block_reader_honours_fences_and_skip_comments(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "```bash\necho one\n```\n\n<!-- docs-test: skip (needs the network) -->\n```python\n"
        "print(2)\n```\n````text\n```bash\nnot a block\n```\n````\n"
    )
    blocks = read_blocks(md)
    assert [(b.line, b.lang, b.skip) for b in blocks] == [
        (1, "bash", None),
        (6, "python", "needs the network"),
        (9, "text", None),
    ]
    assert blocks[2].code == "```bash\nnot a block\n```\n"


@pytest.mark.parametrize(
    ("lang", "code", "code_out"),
    [
        (
            "bash",
            "oxbench --version\noxbench evaluate revisited --gnd missing.pkl --ranks x.npy\n",
            2,
        ),
        ("bash", "true\nfalse\ntrue\n", 1),  # a failure before the last line counts
        ("bash", "oxbench evaluate ukbench --ranks x.npy | cat\n", 2),  # and inside a pipe
        ("python", "import oxbench\nraise SystemExit(3)\n", 3),
    ],
)
def test_a_failing_block_fails(lang: str, code: str, code_out: int, tmp_path: Path) -> None:
    env = block_env(tmp_path)
    run_block(
        Block(
            REPO / "README.md",
            1,
            lang,
            "oxbench --help\n" if lang == "bash" else "import oxbench\n",
            None,
        ),
        tmp_path,
        env,
    )
    with pytest.raises(pytest.fail.Exception, match=f"exits {code_out}"):
        run_block(Block(REPO / "README.md", 1, lang, code, None), tmp_path, env)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_doc_blocks_run_as_written(doc: Path, tmp_path: Path) -> None:
    pytest.importorskip("PIL")  # the stand-in query images are JPEGs
    blocks = [b for b in read_blocks(doc) if b.lang in RUN_LANGS and b.skip is None]
    if doc == REPO / "README.md":
        blocks.remove(newcomer_block(read_blocks(doc)))
    if not blocks:
        pytest.skip(f"{doc.name} has no block to run")
    env = prepare_workspace(tmp_path, "".join(b.code for b in blocks))
    for block in blocks:
        run_block(block, tmp_path, env)


# --------------------------------------------------------------------------------------------
# Extras as documented

DISTRIBUTIONS = {"cv2": "opencv-python-headless", "PIL": "pillow", "faiss": "faiss-cpu"}


def _required_extras(folder: Path) -> dict[str, str]:
    """module -> extra named by every ``require("module", "extra")`` call below ``folder``."""
    found: dict[str, str] = {}
    for py in folder.rglob("*.py"):
        for mod, extra in re.findall(r'require\(\s*"([\w.]+)",\s*"(\w+)"\s*\)', py.read_text()):
            found[mod.split(".")[0]] = extra
    return found


def test_synthetic_generator_extra_is_the_one_documented() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    needed = _required_extras(REPO / "src" / "oxbench" / "datasets" / "synthetic")
    assert {"cv2", "PIL"} <= set(needed), needed
    # one extra covers everything the generator imports, and every require() names an extra that has it
    covering = [
        name
        for name, reqs in extras.items()
        if all(any(r.startswith(DISTRIBUTIONS[m]) for r in reqs) for m in needed)
    ]
    assert "classic" in covering, extras
    for mod, extra in needed.items():
        assert any(r.startswith(DISTRIBUTIONS[mod]) for r in extras[extra]), (mod, extra)
    synth_doc = (REPO / "docs" / "synthetic.md").read_text()
    assert 'pip install "oxbench[classic]"' in synth_doc
    readme = (REPO / "README.md").read_text()
    assert re.search(r"`classic`\s*\([^)]*OpenCV[^)]*synthetic benchmark generator", readme), readme


# --------------------------------------------------------------------------------------------
# What docs/development.md promises about the test suite itself


def _pytest_in(
    folder: Path, tests: str, env_extra: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``tests`` in ``folder`` under this repository's conftest.py."""
    (folder / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (folder / "test_x.py").write_text(tests)
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    shared_data: real data\n")
    env = {k: v for k, v in os.environ.items() if k != "OXBENCH_SHARED_DATA"} | env_extra
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "--doctest-modules",
            ".",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


MARKED = """
import pytest

@pytest.mark.shared_data
def test_reads_real_data(shared_data):
    assert (shared_data / "here.txt").read_text() == "real"
"""


def test_shared_data_marker_skips_with_the_hint_or_runs(tmp_path: Path) -> None:
    proc = _pytest_in(tmp_path, MARKED, {})
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout
    assert "set OXBENCH_SHARED_DATA to the real data folder (see docs/development.md" in proc.stdout
    real = tmp_path / "real"
    real.mkdir()
    (real / "here.txt").write_text("real")
    proc = _pytest_in(tmp_path, MARKED, {"OXBENCH_SHARED_DATA": str(real)})
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout
    proc = _pytest_in(tmp_path, MARKED, {"OXBENCH_SHARED_DATA": str(tmp_path / "absent")})
    assert "1 skipped" in proc.stdout and "is not a folder" in proc.stdout, proc.stdout


def test_a_test_using_the_real_data_without_the_marker_is_refused(tmp_path: Path) -> None:
    unmarked = "def test_forgot(shared_data):\n    pass\n"
    proc = _pytest_in(tmp_path, unmarked, {"OXBENCH_SHARED_DATA": str(tmp_path)})
    assert proc.returncode != 0, proc.stdout
    assert "without @pytest.mark.shared_data: test_x.py::test_forgot" in proc.stdout + proc.stderr


def test_a_doctest_needing_a_missing_extra_is_skipped_not_failed(tmp_path: Path) -> None:
    module = '''
def needs_extra():
    """
    >>> from oxbench.errors import require
    >>> require("oxbench_no_such_module", "classic")
    """


def broken():
    """
    >>> 1 + 1
    3
    """
'''
    proc = _pytest_in(tmp_path, module, {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert "1 failed" in proc.stdout and "1 skipped" in proc.stdout, proc.stdout
    assert 'pip install "oxbench[classic]"' in proc.stdout


def test_nothing_in_the_project_refers_to_files_outside_it() -> None:
    """Docs, sources and benchmarks name no file beside the checkout (CI's own script may)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    outside = re.compile(r"\.\./shared|/work/shared|shared/data|SPEC\.md")
    offenders = []
    for rel in listed.splitlines():
        path = REPO / rel
        if (
            rel.startswith(("tests/", ".ci/"))
            or not path.is_file()
            or path.suffix in {".jpg", ".so"}
        ):
            continue
        for n, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            if outside.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
