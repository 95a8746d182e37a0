"""What the Oxford and Paris families share: the owners' archives, their terms and image names.

Content, not a family: :mod:`.original` (Oxford 5K / Paris 6K) and :mod:`.revisited` (ROxford /
RParis) both take their images from these archives.
"""

from __future__ import annotations

from oxbench.datasets.spec import Placement, RemoteFile

VGG_OX = "https://www.robots.ox.ac.uk/~vgg/data/oxbuildings"
VGG_PA = "https://www.robots.ox.ac.uk/~vgg/data/parisbuildings"
REVISITOP = "http://cmp.felk.cvut.cz/revisitop/data/datasets"
MB = 1_000_000

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

VGG_TERMS = (
    "The {name} images were collected from Flickr; their use must respect Flickr's Terms and "
    "Conditions of Use and the Visual Geometry Group's Terms of Access: non-commercial research "
    "use only, no redistribution of the images. Faces were blurred by VGG for privacy (see VGG's "
    "Dataset Privacy Notice at {page}). oxbench downloads the files from VGG on your request and "
    "ships none of them."
)
REVISITOP_TERMS = (
    " The revisited annotation (gnd_{id}.pkl) is by Radenovic, Iscen, Tolias, Avrithis and Chum "
    "(CVPR 2018), distributed at http://cmp.felk.cvut.cz/revisitop/ for research; cite the paper."
)

# --- archives shared by several entries -------------------------------------------------------

OXFORD_IMAGES = RemoteFile(
    name="oxbuild_images-v1.tgz",
    urls=(f"{VGG_OX}/oxbuild_images-v1.tgz",),
    approx_size=1_900 * MB,
    archive=True,
    placements=(Placement("*.jpg", "jpg"),),
)
PARIS_IMAGES = tuple(
    RemoteFile(
        name=f"paris_{i}-v1.tgz",
        urls=(f"{VGG_PA}/paris_{i}-v1.tgz",),
        approx_size=1_300 * MB,
        archive=True,
        placements=(Placement("*.jpg", "jpg"),),
    )
    for i in (1, 2)
)
