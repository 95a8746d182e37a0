"""``oxbench data``: list, describe, locate, fetch, import and verify datasets (thin layer over
:mod:`oxbench.datasets`). Exit codes: 0 fine, 1 ``verify`` found problems, 2 bad input."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import click

from oxbench.errors import InputError

if TYPE_CHECKING:
    from oxbench.datasets.disk import DiskStatus

_ROOT_HELP = "Data root (default: $OXBENCH_DATA, else ~/.local/share/oxbench)."


class _DatasetRow(TypedDict):
    """One row of ``oxbench data list`` (also its ``--json`` output)."""

    id: str
    title: str
    images: int
    queries: int
    protocols: list[str]
    download: int
    path: str
    state: str
    image_files: int
    size_on_disk: int
    origin: str


def _fmt_size(n: int) -> str:
    from oxbench.datasets.fetch import _human

    return _human(n)


class _DataGroup(click.Group):
    """Adds helper SYNTH's ``synth`` command lazily (skipped when that module is absent)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        if self._synth() is not None:
            names = sorted({*names, "synth"})
        return names

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "synth":
            return self._synth()
        return super().get_command(ctx, name)

    @staticmethod
    def _synth() -> click.Command | None:
        try:
            return getattr(importlib.import_module("oxbench.cli.synth"), "synth", None)
        except ModuleNotFoundError as exc:
            if exc.name == "oxbench.cli.synth":
                return None
            raise


@click.group(cls=_DataGroup)
def data() -> None:
    """List, fetch, import, verify and generate datasets."""


def _on_disk(st: DiskStatus) -> str:
    """The "on disk" column of ``list``: the size, marked when incomplete, ``-`` when absent."""
    if st.state == "absent":
        return "-"
    size = _fmt_size(st.size_bytes)
    return size if st.state == "installed" else f"partial {size}"


@data.command("list")
@click.option("--root", type=click.Path(path_type=Path), help=_ROOT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(root: Path | None, as_json: bool) -> None:
    """The datasets oxbench knows, what is installed under the data root, and the size on disk.

    "on disk" is the size of <root>/<id>/ ("partial" when files or images are missing there,
    "-" when absent); it looks, it does not check: `oxbench data verify ID` does.
    """
    from oxbench.datasets.catalog import DATASETS
    from oxbench.datasets.disk import dataset_status
    from oxbench.datasets.paths import data_root

    base = data_root(root)
    rows: list[_DatasetRow] = []
    status = {name: dataset_status(name, base) for name in DATASETS}
    for name in DATASETS:
        s, st = DATASETS.get(name), status[name]
        rows.append(
            {
                "id": s.id,
                "title": s.title,
                "images": s.n_images,
                "queries": s.n_queries,
                "protocols": list(s.protocols),
                "download": s.download_size,
                "path": str(st.path),
                "state": st.state,
                "image_files": st.image_files,
                "size_on_disk": st.size_bytes,
                "origin": str(DATASETS.origin(name)),
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"data root: {base}")
    click.echo(
        f"{'id':<16} {'images':>10} {'queries':>8}  {'protocol':<10} {'download':>10} {'on disk':>16}  title"
    )
    for r in rows:
        size = _fmt_size(r["download"]) if r["download"] else "-"
        synthetic = DATASETS.get(r["id"]).synthetic
        images = "generated" if synthetic else f"{r['images']:,}"
        queries = "-" if synthetic else f"{r['queries']:,}"
        disk = _on_disk(status[r["id"]])
        origin = DATASETS.origin(r["id"])
        plugin = "" if origin.builtin else f" [from {origin}]"
        click.echo(
            f"{r['id']:<16} {images:>10} {queries:>8}  {','.join(r['protocols']) or '-':<10} "
            f"{size:>10} {disk:>16}  {r['title']}{plugin}"
        )


def _disk_line(st: DiskStatus) -> str:
    """What ``info`` says about the dataset folder."""
    if st.state == "absent":
        return f"not installed (it goes in {st.path})"
    found = f"{st.image_files:,} image files, {_fmt_size(st.size_bytes)}"
    if st.state == "installed":
        return f"installed in {st.path} ({found})"
    short = [f"missing {', '.join(st.missing)}"] if st.missing else []
    if st.image_files < st.expected_image_files:
        short.append(f"{st.image_files:,} of {st.expected_image_files:,} image files")
    return f"incomplete in {st.path} ({'; '.join(short)}; {_fmt_size(st.size_bytes)})"


@data.command("info")
@click.argument("dataset_id")
@click.option("--root", type=click.Path(path_type=Path), help=_ROOT_HELP)
def info_cmd(dataset_id: str, root: Path | None) -> None:
    """Everything about one dataset: what is on disk, counts, files, checksum policy, terms."""
    from oxbench.datasets.catalog import get_spec
    from oxbench.datasets.disk import dataset_status

    s = get_spec(dataset_id)
    click.echo(f"{s.id}: {s.title}")
    click.echo(f"  on disk:    {_disk_line(dataset_status(s.id, root))}")
    if s.homepage:
        click.echo(f"  homepage:   {s.homepage}")
    if s.synthetic:
        click.echo(f"  counts:     generated ({s.counts_note})")
    else:
        click.echo(
            f"  counts:     {s.n_images:,} images, {s.n_queries:,} queries ({s.counts_note})"
        )
    click.echo(f"  protocols:  {', '.join(s.protocols) or '-'}")
    from oxbench.protocol import get_protocol

    for name in s.protocols:  # what each scores, as the protocol says it
        click.echo(f"    {name}: {get_protocol(name).about}")
    if s.belongs_with:
        click.echo(f"  used with:  {', '.join(s.belongs_with)}")
    if s.distractors_for:
        click.echo(f"  distractors for: {', '.join(s.distractors_for)}")
    if s.options:
        click.echo("  options:    " + "; ".join(f"{k}={'|'.join(v)}" for k, v in s.options.items()))
    if s.expected_corrupt:
        click.echo(f"  known-corrupt images: {len(s.expected_corrupt)} (reported, not used)")
    click.echo(f"  about:      {s.description}")
    if s.files:
        click.echo(f"  files ({len(s.files)}, about {_fmt_size(s.download_size)}):")
        shown = s.files if len(s.files) <= 6 else (*s.files[:3], None, *s.files[-2:])
        for f in shown:
            if f is None:
                click.echo("    ...")
                continue
            size = f"{f.size:,} B" if f.size is not None else f"~{_fmt_size(f.approx_size or 0)}"
            click.echo(
                f"    {f.name:<28} {size:>12}  {f.urls[0]}{'  (optional)' if f.optional else ''}"
            )
    click.echo(f"  checksums:  {s.checksum_policy}")
    if s.citation:
        click.echo(f"  cite:       {s.citation}")
    click.echo(f"  terms:      {s.terms}")


@data.command("path")
@click.argument("dataset_id")
@click.option("--root", type=click.Path(path_type=Path), help=_ROOT_HELP)
@click.option(
    "--missing-ok",
    is_flag=True,
    help="Print the folder even when the dataset is not there (exit 0).",
)
def path_cmd(dataset_id: str, root: Path | None, missing_ok: bool) -> None:
    """Print the folder of a dataset (<root>/<id>), for scripts: `cd "$(oxbench data path roxford5k)"`.

    Exit 2, with the command that gets the dataset, when the folder does not exist (so a script
    stops there instead of working in a path that is not there), unless --missing-ok.
    An incomplete folder is printed, with a note on stderr.
    """
    from oxbench.datasets.catalog import get_spec
    from oxbench.datasets.disk import dataset_status
    from oxbench.datasets.ondisk import remedy, require_dir

    spec = get_spec(dataset_id)
    st = dataset_status(spec.id, root)
    if st.state == "absent" and not missing_ok:
        require_dir(spec, st.path)
    if st.state == "incomplete":
        click.echo(f"note: {spec.id} is {_disk_line(st)}; {remedy(spec, st.path.parent)}", err=True)
    click.echo(str(st.path))


def _accept_terms_interactively(spec_id: str, root: Path, accept: bool) -> bool:
    """Show the terms once per data root; True when accepted."""
    from oxbench.datasets.catalog import get_spec
    from oxbench.datasets.lock import LockFile

    spec = get_spec(spec_id)
    if spec.synthetic or not spec.files:
        return True  # nothing is downloaded: fetch generates it or explains how to import
    try:
        if LockFile(root).terms_accepted(spec.id):
            return True
    except InputError:
        return accept
    click.echo(f"Terms of use of {spec.id}:\n  {spec.terms}\n", err=True)
    if accept:
        return True
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InputError(
            f"the terms of use of {spec.id} must be accepted: read them above and rerun with --accept-terms"
        )
    return click.confirm("Do you accept these terms?", default=False, err=True)


@data.command("fetch")
@click.argument("dataset_id")
@click.option("--root", type=click.Path(path_type=Path), help=_ROOT_HELP)
@click.option(
    "--accept-terms",
    is_flag=True,
    help="Accept the dataset's terms of use (needed once per root; required without a terminal).",
)
@click.option(
    "--mirror",
    metavar="URL",
    help="Base URL replacing the owners' host (default: $OXBENCH_MIRROR); only the mirror is contacted.",
)
@click.option(
    "--also-owners",
    is_flag=True,
    help="With a mirror: try the owners' hosts too when the mirror fails.",
)
@click.option(
    "--jobs", type=click.IntRange(1, 32), default=4, show_default=True, help="Parallel downloads."
)
@click.option(
    "--keep-archives", is_flag=True, help="Keep the downloaded archives after extraction."
)
@click.option("--force", is_flag=True, help="Download again files already installed.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def fetch_cmd(
    dataset_id: str,
    root: Path | None,
    accept_terms: bool,
    mirror: str | None,
    also_owners: bool,
    jobs: int,
    keep_archives: bool,
    force: bool,
    no_progress: bool,
) -> None:
    """Download, check and lay out a dataset from its owners (resumable, verified)."""
    from oxbench.datasets.catalog import get_spec
    from oxbench.datasets.paths import data_root
    from oxbench.datasets.prepare import fetch_dataset

    spec = get_spec(dataset_id)
    base = data_root(root)
    if not _accept_terms_interactively(spec.id, base, accept_terms):
        raise InputError(f"terms of use of {spec.id} not accepted; nothing downloaded")
    report = fetch_dataset(
        spec.id,
        base,
        accept_terms=True,
        mirror=mirror,
        also_owners=also_owners,
        jobs=jobs,
        keep_archives=keep_archives,
        force=force,
        progress=not no_progress,
    )
    for f in report.files:
        if f.get("reused"):
            click.echo(
                f"{f['name']}: reused from another dataset in this root, {f['placed']} file(s) hard-linked"
            )
            continue
        state = "already there" if f["skipped"] else ("resumed" if f["resumed"] else "downloaded")
        click.echo(
            f"{f['name']}: {state}, {f['size']:,} bytes, sha256 {f['sha256'][:16]}..., {f['placed']} file(s) laid out"
        )
    for note in report.notes:
        click.echo(f"note: {note}")
    click.echo(f"{spec.id}: ready in {report.root} (check with `oxbench data verify {spec.id}`)")


@data.command("import")
@click.argument("dataset_id")
@click.option(
    "--from",
    "source",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder or archive you already have.",
)
@click.option("--root", type=click.Path(path_type=Path), help=_ROOT_HELP)
@click.option("--copy", is_flag=True, help="Copy files instead of hard-linking them.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def import_cmd(
    dataset_id: str, source: Path, root: Path | None, copy: bool, no_progress: bool
) -> None:
    """Lay out a local copy (folders and/or archives) in oxbench's layout, checking it.

    Images that are none of the dataset's (not in its ground truth or list, or, before that is
    there, not named as its images are) are left out with a warning, never copied in.
    """
    from oxbench.datasets.prepare import import_dataset
    from oxbench.datasets.verify import verify

    report = import_dataset(dataset_id, source, root, link=not copy, progress=not no_progress)
    click.echo(f"{report.dataset}: {report.placed} file(s) laid out in {report.root}")
    if report.not_images:
        click.echo(
            f"left out: {len(report.not_images)} file(s) that match no image of {report.dataset} "
            f"(not copied), e.g. {', '.join(report.not_images[:3])}"
        )
    for note in report.notes:
        click.echo(f"note: {note}")
    check = verify(dataset_id, root, decode=False, progress=False)
    for line in check.summary():
        click.echo(line)
    if not (check.ok or check.ground_truth_only):
        click.echo(
            f"(incomplete: import the rest, then run `oxbench data verify {report.dataset}`)"
        )


@data.command("verify")
@click.argument("dataset_id")
@click.option("--root", type=click.Path(path_type=Path), help=_ROOT_HELP)
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path),
    help="Write the JSON report here (default: <root>/<id>/verify.json, or ./<id>.verify.json when that folder is read-only).",
)
@click.option(
    "--no-decode", is_flag=True, help="Only check presence, counts, ground truth and checksums."
)
@click.option(
    "--jobs", type=click.IntRange(1, 64), default=2, show_default=True, help="Decoding threads."
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.pass_context
def verify_cmd(
    ctx: click.Context,
    dataset_id: str,
    root: Path | None,
    report_path: Path | None,
    no_decode: bool,
    jobs: int,
    no_progress: bool,
) -> None:
    """Decode every image and check counts, ground truth and checksums; exit 1 if anything is off.

    A root with the ground truth alone (no image at all) is reported as such, exit 0: the
    ``features*`` presets need no images.
    """
    from oxbench.datasets.verify import verify

    report = verify(dataset_id, root, decode=not no_decode, jobs=jobs, progress=not no_progress)
    # the findings first: a report that cannot be written loses nothing the user asked to see
    for line in report.summary():
        click.echo(line)
    out = report_path or Path(report.root) / "verify.json"
    try:
        report.write_json(out)
    except InputError as exc:
        if report_path is not None:
            raise
        # A read-only (shared) data root: put the default report in the working directory.
        fallback = Path.cwd() / f"{report.dataset}.verify.json"
        click.echo(
            f"note: cannot write {out} ({exc.problem}); writing the report to {fallback}", err=True
        )
        out = report.write_json(fallback)
    click.echo(f"report: {out}")
    ctx.exit(0 if report.ok or report.ground_truth_only else 1)


@data.command("mine-distractors")
@click.option("--dataset", default="synthetic", show_default=True, help="The synthetic benchmark.")
@click.option(
    "--kind",
    required=True,
    help="Pool kind: city, scene, nearmiss or mixed (oxbench.datasets.synthetic.distractor_kinds).",
)
@click.option("--pool", "pool", type=int, required=True, help="Candidates to score (K x N).")
@click.option("--keep", type=int, required=True, help="The N most distracting to keep.")
@click.option(
    "--methods",
    default="rootsift-bow,rootsift-bow-sv,rootsift-vlad",
    show_default=True,
    help="The methods that score the pool, comma-separated.",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="[METHOD:]KEY=VALUE",
    help="A setting for every method, or for one (repeatable).",
)
@click.option("--root", type=click.Path(path_type=Path), help=_ROOT_HELP)
@click.option("--cache", type=click.Path(path_type=Path), default=None, help="Cache folder.")
@click.option("--runs", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
@click.option("--workers", type=int, default=None, help="Worker processes.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def mine_cmd(
    dataset: str,
    kind: str,
    pool: int,
    keep: int,
    methods: str,
    settings: tuple[str, ...],
    root: Path | None,
    cache: Path | None,
    runs: Path,
    workers: int | None,
    no_progress: bool,
) -> None:
    """R1M's selection: score POOL generated distractors of KIND with three methods (each
    candidate: the fraction of Easy and Hard images ranked below it, summed over queries and
    methods) and keep the KEEP most distracting; then run with
    ``--distractors synthetic-mined-KIND:KEEP``."""
    from oxbench.cli.options import parse_setting, parse_workers
    from oxbench.datasets.mining import selection_summary
    from oxbench.pipelines.mining import mine_distractors
    from oxbench.pipelines.session import RecordOptions, Session

    names = [m.strip() for m in methods.split(",") if m.strip()]
    overrides: dict[str, dict[str, object]] = {m: {} for m in names}
    for text in settings:
        key, value = parse_setting(text)
        target, _, key = key.rpartition(":")
        if target and target not in overrides:
            raise InputError(f"--set {text}: {target} is not one of --methods")
        for m in [target] if target else names:
            if key in overrides[m]:
                raise InputError(f"--set {text}: {key} is given twice for {m}")
            overrides[m][key] = value
    out = mine_distractors(
        dataset,
        kind=kind,
        pool=pool,
        keep=keep,
        methods=names,
        overrides=overrides,
        session=Session(
            root=root, cache=cache, workers=parse_workers(workers), progress=not no_progress
        ),
        record=RecordOptions(runs_dir=runs),
    )
    click.echo(selection_summary(json.loads(out.read_text(encoding="utf-8"))))
    click.echo(f"selection: {out}  (use --distractors synthetic-mined-{kind}:{keep})")
