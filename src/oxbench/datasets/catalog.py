"""The benchmarks oxbench knows: one short declarative entry each (docs/protocols.md, "Datasets").

URLs are the ones the dataset owners publish. In 2023 VGG replaced the Oxford and Paris image
archives by face-blurred ones (``oxbuild_images-v1.tgz``, ``paris_{1,2}-v1.tgz``); the old
un-blurred names (``oxbuild_images.tgz``, ``paris_{1,2}.tgz``) quoted in many READMEs are gone. No
owner publishes checksums for these archives, so every file follows the lock-file policy (see
:mod:`oxbench.datasets.spec`). ``import`` lays out copies users already have in the same layout.

Canonical layout below the data root (``<root>/<id>/``):

- ``oxford5k``: ``jpg/<name>.jpg`` (5,063) and ``gt_files_170407/<landmark>_<n>_{good,ok,junk,query}.txt``;
- ``paris6k``: ``jpg/<name>.jpg`` (6,412 incl. 20 corrupt), ``paris_120310/*.txt``, ``corrupt.txt``;
- ``roxford5k`` / ``rparis6k``: ``jpg/<name>.jpg`` and ``gnd_<id>.pkl`` (as revisitop lays them out);
- ``revisitop1m``: ``jpg/<path from revisitop1m.txt>`` and ``revisitop1m.txt``;
- ``oxford100k``: ``jpg/<name>.jpg``;
- ``holidays``: ``jpg/<nnnnnn>.jpg``, ``holidays_images.dat`` and, optionally, ``jpg_rotated/``
  (the same 1,491 file names, turned upright by hand: used by ``orientation="rotated"``);
- ``ukbench``: ``jpg/ukbench<nnnnn>.jpg``.
"""

from __future__ import annotations

from oxbench.datasets.families import (
    Distractors,
    Holidays,
    Original,
    Revisited,
    Synthetic,
    UKBench,
    text_gt_placements,
)
from oxbench.datasets.spec import DatasetSpec, Placement, RemoteFile, register

_VGG_OX = "https://www.robots.ox.ac.uk/~vgg/data/oxbuildings"
_VGG_PA = "https://www.robots.ox.ac.uk/~vgg/data/parisbuildings"
_REVISITOP = "http://cmp.felk.cvut.cz/revisitop/data/datasets"
_R1M = "http://ptak.felk.cvut.cz/revisitop/revisitop1m"
_GB = 1_000_000_000
_MB = 1_000_000

OXFORD_LANDMARKS = (
    "all_souls", "ashmolean", "balliol", "bodleian", "christ_church", "cornmarket", "hertford",
    "keble", "magdalen", "pitt_rivers", "radcliffe_camera",
)  # fmt: skip
PARIS_LANDMARKS = (
    "defense", "eiffel", "invalides", "louvre", "moulinrouge", "museedorsay", "notredame",
    "pantheon", "pompidou", "sacrecoeur", "triomphe",
)  # fmt: skip

#: Image names of Oxford 5K / ROxford: the 11 landmarks, 5 other colleges and "oxford" (the 17
#: Flickr search terms), then a 6-digit number. ``import`` uses it until a list of names is there.
OXFORD_NAMES = (
    r"(?:all_souls|ashmolean|balliol|bodleian|christ_church|cornmarket|hertford|jesus|keble|magdalen"
    r"|new|oriel|oxford|pitt_rivers|radcliffe_camera|trinity|worcester)_\d{6}"
)
#: Image names of Paris 6K / RParis: ``paris_<landmark or "general">_<6 digits>``.
PARIS_NAMES = r"paris_(?:general|" + "|".join(PARIS_LANDMARKS) + r")_\d{6}"

#: The 20 Paris images that are undecodable in the official archives (6,412 - 20 = 6,392 usable).
#: The names are facts listed by many codebases that cite VGG's ``corrupt.txt``.
PARIS_CORRUPT = (
    "paris_louvre_000136", "paris_louvre_000146", "paris_moulinrouge_000422",
    "paris_museedorsay_001059", "paris_notredame_000188", "paris_pantheon_000284",
    "paris_pantheon_000960", "paris_pantheon_000974", "paris_pompidou_000195",
    "paris_pompidou_000196", "paris_pompidou_000201", "paris_pompidou_000467",
    "paris_pompidou_000640", "paris_sacrecoeur_000299", "paris_sacrecoeur_000330",
    "paris_sacrecoeur_000353", "paris_triomphe_000662", "paris_triomphe_000833",
    "paris_triomphe_000863", "paris_triomphe_000867",
)  # fmt: skip

_VGG_TERMS = (
    "The {name} images were collected from Flickr; their use must respect Flickr's Terms and "
    "Conditions of Use and the Visual Geometry Group's Terms of Access: non-commercial research "
    "use only, no redistribution of the images. Faces were blurred by VGG for privacy (see VGG's "
    "Dataset Privacy Notice at {page}). oxbench downloads the files from VGG on your request and "
    "ships none of them."
)
_REVISITOP_TERMS = (
    " The revisited annotation (gnd_{id}.pkl) is by Radenovic, Iscen, Tolias, Avrithis and Chum "
    "(CVPR 2018), distributed at http://cmp.felk.cvut.cz/revisitop/ for research; cite the paper."
)

# --- archives shared by several entries -------------------------------------------------------

_OXFORD_IMAGES = RemoteFile(
    name="oxbuild_images-v1.tgz",
    urls=(f"{_VGG_OX}/oxbuild_images-v1.tgz",),
    approx_size=1_900 * _MB,
    archive=True,
    placements=(Placement("*.jpg", "jpg"),),
)
_PARIS_IMAGES = tuple(
    RemoteFile(
        name=f"paris_{i}-v1.tgz",
        urls=(f"{_VGG_PA}/paris_{i}-v1.tgz",),
        approx_size=1_300 * _MB,
        archive=True,
        placements=(Placement("*.jpg", "jpg"),),
    )
    for i in (1, 2)
)


# --- original Oxford / Paris ------------------------------------------------------------------

register(DatasetSpec(
    id="oxford5k",
    title="Oxford Buildings (Oxford 5K)",
    homepage=f"{_VGG_OX}/",
    description=(
        "Flickr photos of 11 Oxford landmarks, 5 queries each (55), with good/ok/junk labels "
        "(Philbin et al., CVPR 2007). The query image is part of the database."
    ),
    n_images=5063,
    n_queries=55,
    counts_note="5,062 images officially; 5,063 in the image archive and in common lists (loaded: 5,063)",
    protocols=("original",),
    files=(
        _OXFORD_IMAGES,
        RemoteFile(
            name="gt_files_170407.tgz",
            urls=(f"{_VGG_OX}/gt_files_170407.tgz",),
            approx_size=100_000,
            archive=True,
            placements=text_gt_placements("gt_files_170407"),
        ),
    ),
    terms=_VGG_TERMS.format(name="Oxford Buildings", page=f"{_VGG_OX}/"),
    family=Original(gt_dir="gt_files_170407", names=OXFORD_NAMES),
    belongs_with=("oxford100k",),
    citation="J. Philbin et al., Object retrieval with large vocabularies and fast spatial matching, CVPR 2007",
))  # fmt: skip

register(DatasetSpec(
    id="paris6k",
    title="Paris Buildings (Paris 6K)",
    homepage=f"{_VGG_PA}/",
    description=(
        "Flickr photos of 11 Paris landmarks, 55 queries, same format as Oxford 5K (Philbin et al., "
        "CVPR 2008). All *_good.txt files are empty: every positive is in *_ok.txt. 20 images in "
        "the archives are corrupt and are left out of the database."
    ),
    n_images=6392,
    n_queries=55,
    counts_note="6,412 images listed, 20 of them corrupt -> 6,392 usable (loaded: 6,392)",
    protocols=("original",),
    files=(
        *_PARIS_IMAGES,
        RemoteFile(
            name="paris_120310.tgz",
            urls=(f"{_VGG_PA}/paris_120310.tgz",),
            approx_size=110_000,
            archive=True,
            placements=text_gt_placements("paris_120310"),
        ),
        RemoteFile(name="corrupt.txt", urls=(f"{_VGG_PA}/corrupt.txt",), approx_size=1_000, optional=True),
    ),
    terms=_VGG_TERMS.format(name="Paris Buildings", page=f"{_VGG_PA}/"),
    family=Original(gt_dir="paris_120310", names=PARIS_NAMES),
    expected_corrupt=PARIS_CORRUPT,
    citation="J. Philbin et al., Lost in quantization, CVPR 2008",
))  # fmt: skip

# --- revisited Oxford / Paris -----------------------------------------------------------------

register(DatasetSpec(
    id="roxford5k",
    title="Revisited Oxford (ROxford 5K)",
    homepage="http://cmp.felk.cvut.cz/revisitop/",
    description=(
        "Oxford 5K re-annotated: 70 queries (26 groups) with easy/hard/junk(Unclear) labels and "
        "three setups (Easy, Medium, Hard). The query images are removed from the database. Use "
        "only the cropped query region."
    ),
    n_images=4993,
    n_queries=70,
    counts_note="4,993 database images + 70 query images = the 5,063 Oxford images",
    protocols=("revisited",),
    files=(
        _OXFORD_IMAGES,
        RemoteFile(
            name="gnd_roxford5k.pkl",
            urls=(f"{_REVISITOP}/roxford5k/gnd_roxford5k.pkl",),
            approx_size=150_000,
        ),
    ),
    terms=_VGG_TERMS.format(name="Oxford Buildings", page=f"{_VGG_OX}/")
    + _REVISITOP_TERMS.format(id="roxford5k"),
    family=Revisited(names=OXFORD_NAMES),
    belongs_with=("revisitop1m",),
    citation="F. Radenovic et al., Revisiting Oxford and Paris, CVPR 2018",
))  # fmt: skip

register(DatasetSpec(
    id="rparis6k",
    title="Revisited Paris (RParis 6K)",
    homepage="http://cmp.felk.cvut.cz/revisitop/",
    description=(
        "Paris 6K re-annotated: 70 queries (25 groups) with easy/hard/junk labels; query images "
        "removed from the database; the 20 corrupt images are not used."
    ),
    n_images=6322,
    n_queries=70,
    counts_note="6,322 database images + 70 query images = the 6,392 usable Paris images",
    protocols=("revisited",),
    files=(
        *_PARIS_IMAGES,
        RemoteFile(
            name="gnd_rparis6k.pkl",
            urls=(f"{_REVISITOP}/rparis6k/gnd_rparis6k.pkl",),
            approx_size=280_000,
        ),
    ),
    terms=_VGG_TERMS.format(name="Paris Buildings", page=f"{_VGG_PA}/")
    + _REVISITOP_TERMS.format(id="rparis6k"),
    family=Revisited(names=PARIS_NAMES),
    belongs_with=("revisitop1m",),
    expected_corrupt=PARIS_CORRUPT,
    citation="F. Radenovic et al., Revisiting Oxford and Paris, CVPR 2018",
))  # fmt: skip

# --- distractors ------------------------------------------------------------------------------

register(DatasetSpec(
    id="revisitop1m",
    title="Revisited 1M distractors (R1M)",
    homepage="http://cmp.felk.cvut.cz/revisitop/",
    description=(
        "1,001,001 distractor images from YFCC100M (1024x768), hard negatives for ROxford/RParis, "
        "in 100 archives revisitop1m.{1..100}.tar.gz plus the image list revisitop1m.txt. "
        "Distractor j gets ranking index n_db + j, in the list's order."
    ),
    n_images=1_001_001,
    n_queries=0,
    counts_note="1,001,001 images, listed in revisitop1m.txt",
    protocols=(),
    files=(
        RemoteFile(name="revisitop1m.txt", urls=(f"{_R1M}/revisitop1m.txt",), approx_size=40 * _MB),
        *(
            RemoteFile(
                name=f"revisitop1m.{i}.tar.gz",
                urls=(f"{_R1M}/jpg/revisitop1m.{i}.tar.gz",),
                approx_size=3 * _GB,
                archive=True,
                placements=(Placement("*.jpg", "jpg", mode="tree", strip="jpg"),),
            )
            for i in range(1, 101)
        ),
    ),
    terms=(
        "The R1M images come from the Yahoo Flickr Creative Commons 100M dataset (YFCC100M); each "
        "image keeps its own Creative Commons licence, recorded with the photo on Flickr. The set "
        "is distributed by CTU Prague (http://cmp.felk.cvut.cz/revisitop/) for research; cite "
        "Radenovic et al., CVPR 2018. About 300 GB of downloads."
    ),
    family=Distractors(list_file="revisitop1m.txt"),
    distractors_for=("roxford5k", "rparis6k"),
    citation="F. Radenovic et al., Revisiting Oxford and Paris, CVPR 2018",
))  # fmt: skip

register(DatasetSpec(
    id="oxford100k",
    title="Oxford 100K distractors (Flickr 100K)",
    homepage=f"{_VGG_OX}/",
    description=(
        "99,782 Flickr images used as distractors for Oxford 5K / Paris 6K (Oxford 105K). Not "
        "cleaned: it contains some landmark images. VGG's page no longer offers the archive; "
        "import a copy you have with `oxbench data import oxford100k --from PATH`."
    ),
    n_images=99_782,
    n_queries=0,
    counts_note="99,782 images (distractor j gets ranking index n_db + j, in sorted name order)",
    protocols=(),
    files=(),
    terms=_VGG_TERMS.format(name="Oxford 100K distractor", page=f"{_VGG_OX}/"),
    family=Distractors(),  # no official list: distractor j is the j-th sorted name
    distractors_for=("oxford5k", "paris6k"),
    citation="J. Philbin et al., Object retrieval with large vocabularies and fast spatial matching, CVPR 2007",
))  # fmt: skip

# --- Holidays, UKBench ------------------------------------------------------------------------

register(DatasetSpec(
    id="holidays",
    title="INRIA Holidays",
    homepage="https://lear.inrialpes.fr/people/jegou/data.php#holidays",
    description=(
        "1,491 personal holiday photos in 500 groups; the first image of each group (number "
        "divisible by 100) is its query. Some images are stored rotated by 90 degrees: choose "
        "orientation='original' (the files as published) or 'rotated' (a hand-rotated copy in "
        "jpg_rotated/, same names); the choice is recorded with the results."
    ),
    n_images=1491,
    n_queries=500,
    counts_note="each query image is also in the database, where it is ignored (junk)",
    protocols=("holidays",),
    files=(
        RemoteFile(
            name="jpg1.tar.gz",
            urls=("ftp://ftp.inrialpes.fr/pub/lear/douze/data/jpg1.tar.gz",),
            approx_size=1_100 * _MB,
            archive=True,
            placements=(Placement("*.jpg", "jpg"),),
        ),
        RemoteFile(
            name="jpg2.tar.gz",
            urls=("ftp://ftp.inrialpes.fr/pub/lear/douze/data/jpg2.tar.gz",),
            approx_size=1_500 * _MB,
            archive=True,
            placements=(Placement("*.jpg", "jpg"),),
        ),
        RemoteFile(
            name="eval_holidays.tgz",
            urls=("https://lear.inrialpes.fr/people/jegou/code/eval_holidays.tgz",),
            approx_size=50_000,
            archive=True,
            placements=(Placement("holidays_images.dat", "."),),
        ),
    ),
    terms=(
        "The INRIA Holidays images are copyright INRIA (Jegou, Douze and Schmid, ECCV 2008) and "
        "are provided for research purposes; cite the paper. oxbench downloads them from INRIA "
        "on your request and ships none of them."
    ),
    family=Holidays(),
    options={"orientation": ("original", "rotated")},
    citation="H. Jegou, M. Douze, C. Schmid, Hamming embedding and weak geometric consistency, ECCV 2008",
))  # fmt: skip

register(DatasetSpec(
    id="ukbench",
    title="University of Kentucky Recognition Benchmark (UKBench)",
    homepage="https://archive.org/details/ukbench",
    description=(
        "10,200 images (640x480) of 2,550 objects, 4 each; every image queries the whole set, "
        "itself included; the score is the mean number of the object's 4 images in the top 4."
    ),
    n_images=10_200,
    n_queries=10_200,
    counts_note="10,200 images = 2,550 objects x 4",
    protocols=("ukbench",),
    files=(
        RemoteFile(
            name="ukbench.zip",
            urls=(
                "https://archive.org/download/ukbench/ukbench.zip",
                "http://vis.uky.edu/~stewe/ukbench/ukbench.zip",
            ),
            approx_size=1_600 * _MB,
            archive=True,
            placements=(Placement("*/full/ukbench*.jpg", "jpg"), Placement("full/ukbench*.jpg", "jpg")),
        ),
    ),
    terms=(
        "UKBench (Nister and Stewenius, CVPR 2006) is provided by the University of Kentucky for "
        "research; cite the paper. The archive.org copy is the one the authors' page points to "
        "since the original host went offline."
    ),
    family=UKBench(),
    citation="D. Nister, H. Stewenius, Scalable recognition with a vocabulary tree, CVPR 2006",
))  # fmt: skip

# --- synthetic (implemented in oxbench.datasets.synthetic) ------------------------------------

for _sid, _what in (("synthetic", "test city"), ("synthetic-train", "training city (other seed)")):
    register(
        DatasetSpec(
            id=_sid,
            title=f"Synthetic city ({_what})",
            homepage="",
            description=(
                f"A generated {_what} in the ROxford layout (revisited labels, boxes, on-demand "
                "distractors), for tests and demos without any download. Made by `oxbench data synth` "
                "or on first load."
            ),
            n_images=0,
            n_queries=0,
            counts_note="set by the generator's parameters",
            protocols=("revisited",),
            files=(),
            terms="Generated locally by oxbench; no terms apply.",
            family=Synthetic(),
        )
    )
