"""Step: spatial verification of short lists, in the run's executor.

:class:`ShortListVerifier` is a picklable job: given ``(query index, query name, short list)`` it
reads the query's and the candidates' local features (and words) from their stores, forms tentative
correspondences (mutual nearest descriptors with Lowe's ratio, or shared visual words), fits the
geometric model of its :class:`~oxbench.refinement.spatial.Verification` settings and returns a :class:`VerifiedList`. Any family with
local features in stores uses it, through :func:`verify_short_lists`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import CorruptCache, FileIdentity, load_npz, save_npz
from oxbench.errors import InputError
from oxbench.features.local import LocalExtractor
from oxbench.features.store import FeatureStore
from oxbench.fileio import json_digest, remove_stale_temps
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.steps.words import WordedParts, Words, reopen_store, store_spec
from oxbench.refinement.spatial import Verification, descriptor_matches, spatial_rerank

log = logging.getLogger(__name__)

#: Verified images per query whose inlier correspondences a search returns (the top of the list).
MATCHES_FOR_VIEWERS = 20


@dataclass(frozen=True)
class VerifiedList:
    """Spatial verification of one query's short list.

    Attributes:
        head: ``int64 [r]`` the re-ranked short list (verified first, by inlier count).
        verified: ``int64 [v]`` the verified indices, best first (``head[:v]``).
        inliers: ``int64 [v]`` their inlier counts.
        matches: ``{index: float32 [m, 4]}`` inlier correspondences ``(x_q, y_q, x_db, y_db)`` in
            full-image pixels of the first :data:`MATCHES_FOR_VIEWERS` verified images.
    """

    head: NDArray[np.int64]
    verified: NDArray[np.int64]
    inliers: NDArray[np.int64]
    matches: dict[int, NDArray[np.float32]]


StoreSpec = tuple[Path, LocalExtractor, dict[str, object]]


class ShortListVerifier:
    """Picklable job: spatially verify one query's short list (reopens stores and words where it runs).

    Args:
        stores: ``{part: (folder, extractor, extra)}`` of the feature stores (queries, database,
            distractors), as :func:`oxbench.pipelines.steps.words.store_spec` gives them.
        words: ``{part: words file}``.
        index_parts: ``(part, image name)`` of every index position.
        settings: the verification settings.
        query_part: the part the short lists' queries come from (``database`` when database
            images are verified against their own neighbours, as database-side augmentation does).
        trusted: ``{part: FileIdentity}`` of the words files as the driver checked them: a worker
            that finds the same files memory-maps them without hashing them again.
        store_digests: ``{part: content digest}`` of the feature stores as the driver opened them
            (:meth:`~oxbench.features.store.FeatureStore.content_digest`): what a verified list
            was computed from, recorded in its cache entry.
    """

    def __init__(
        self,
        *,
        stores: dict[str, StoreSpec],
        words: dict[str, Path],
        index_parts: list[tuple[str, str]],
        settings: Verification,
        query_part: str = "queries",
        trusted: dict[str, FileIdentity] | None = None,
        store_digests: dict[str, str] | None = None,
    ) -> None:
        self.stores = stores
        self.store_digests = dict(store_digests or {})
        self.words = words
        self.trusted = dict(trusted or {})
        self.index_parts = index_parts
        self.settings = settings
        self.query_part = query_part
        self._open: tuple[dict[str, FeatureStore], dict[str, Words]] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_open": None}

    def _opened(self) -> tuple[dict[str, FeatureStore], dict[str, Words]]:
        if self._open is None:
            stores = {p: reopen_store(spec) for p, spec in self.stores.items()}
            self._open = (
                stores,
                {p: Words.load(w, trusted=self.trusted.get(p)) for p, w in self.words.items()},
            )
        return self._open

    def __call__(self, item: tuple[int, str, NDArray[np.int64]]) -> VerifiedList:
        _, qname, order = item
        stores, words = self._opened()
        st = self.settings
        query = stores[self.query_part].get_raw(qname)
        # without words (local features of a named source, no vocabulary), descriptors match
        no_words = np.zeros(0, np.int64)
        q_words = words[self.query_part].of(qname)[0][:, : st.query_ma] if words else no_words
        finish = stores[self.query_part].config.finish
        q_desc = finish(query.descriptors) if st.matching == "descriptors" else None
        cands, tentative = [], []
        for idx in order.tolist():
            part, name = self.index_parts[idx]
            cand = stores[part].get_raw(name)
            c_words = words[part].of(name)[0][:, 0] if words else no_words
            cands.append((cand.keypoints, c_words, cand.image_size))
            if q_desc is not None:
                tentative.append(
                    descriptor_matches(q_desc, finish(cand.descriptors), ratio=st.ratio)
                )
        res = spatial_rerank(
            query.keypoints,
            q_words,
            cands,
            order,
            st,
            top_r=len(order),
            query_size=query.image_size,
            tentative=tentative if q_desc is not None else None,
        )
        position = {int(v): i for i, v in enumerate(order.tolist())}
        verified = np.asarray(res.verified, np.int64)
        inliers = np.array([res.inliers[position[int(v)]] for v in verified], np.int64)
        matches: dict[int, NDArray[np.float32]] = {}
        for v in verified[:MATCHES_FOR_VIEWERS].tolist():
            pairs = res.inlier_matches[position[v]]
            assert pairs is not None
            d_kp = cands[position[v]][0]
            matches[v] = np.concatenate(
                [query.keypoints[pairs[:, 0], :2], d_kp[pairs[:, 1], :2]], axis=1
            ).astype(np.float32)
        return VerifiedList(np.asarray(res.order, np.int64), verified, inliers, matches)


def short_list_verifier(
    parts: WordedParts, settings: Verification, query_part: str = "queries"
) -> ShortListVerifier:
    """The verification job over a benchmark's stores and words (``query_part``'s words assigned)."""
    return ShortListVerifier(
        stores={p: store_spec(s) for p, s in parts.stores.items()},
        words=dict(parts.words_paths),
        index_parts=parts.index_parts,
        settings=settings,
        query_part=query_part,
        trusted={p: w.source for p, w in parts.words.items() if w.source is not None},
        store_digests={p: s.content_digest() for p, s in parts.stores.items()},
    )


def verification_inputs(job: ShortListVerifier) -> dict[str, object]:
    """What every verified list of ``job`` is computed from: the stores' and words' content digests,
    the settings and the query part (part of each entry's record, :meth:`VerificationCache.record`)."""
    stores: dict[str, str] = getattr(job, "store_digests", {})
    words: dict[str, FileIdentity] = getattr(job, "trusted", {})
    return {
        "stores": dict(sorted(stores.items())),
        "words": {p: t.digest for p, t in sorted(words.items())},
        "settings": asdict(job.settings),
        "query_part": job.query_part,
    }


class VerificationCache:
    """Verified short lists on disk, one ``.npz`` per query and short list (digest-checked).

    An entry is keyed by the query, its short list's images (part and name, in order), and the
    folder's key: the feature stores, the words and the verification settings. A rerun of the same
    configuration finds every list here; a different short list (another vocabulary, ``top_r``,
    query expansion's second round) is another entry. Positions are stored relative to the short
    list, so an entry does not depend on where its images sit in the index.

    Each entry names what it stands for inside its content (:func:`oxbench.cache.
    stands_for_record`): its query, a digest of its short list's images, and the job's
    :func:`verification_inputs`; an entry read for another query or list (two entries swapped, one
    copied over another) or left from other features or words is verified again, with a warning.

    Args:
        folder: ``<cache>/verification/<key>`` (:meth:`for_job`).
        inputs: :func:`verification_inputs` of the job whose lists the folder holds.
    """

    def __init__(self, folder: Path, inputs: dict[str, object] | None = None) -> None:
        self.folder = Path(folder)
        self.inputs = dict(inputs or {})
        self.refused = 0  # entries found corrupt or written for another record

    @classmethod
    def for_job(cls, job: ShortListVerifier, cache: Path) -> VerificationCache:
        """The cache folder of ``job``'s stores, words, settings (and query part) under the cache root ``cache``."""

        def rel(path: Path) -> str:
            path = Path(path)
            return str(path.relative_to(cache)) if path.is_relative_to(cache) else str(path)

        key = {
            "stores": {
                p: [rel(folder), extractor.to_dict()]
                for p, (folder, extractor, _) in sorted(job.stores.items())
            },
            "words": {p: rel(w) for p, w in sorted(job.words.items())},
            "settings": asdict(job.settings),
            "viewer_matches": MATCHES_FOR_VIEWERS,
        }
        if job.query_part != "queries":  # database images as queries: entries of their own
            key["query_part"] = job.query_part
        return cls(Path(cache) / "verification" / json_digest(key, 16), verification_inputs(job))

    def record(self, query: str, candidates: Sequence[tuple[str, str]]) -> dict[str, object]:
        """What the entry of ``query``'s short list of ``candidates`` stands for."""
        return {
            "query": query,
            "short_list": json_digest([list(c) for c in candidates]),
            "inputs": self.inputs,
        }

    def path(self, query: str, candidates: Sequence[tuple[str, str]]) -> Path:
        """The entry of ``query``'s short list of ``candidates`` (``(part, name)`` in order)."""
        return self.folder / f"{json_digest([query, [list(c) for c in candidates]], 24)}.npz"

    def load(
        self, path: Path, order: NDArray[np.int64], record: dict[str, object] | None = None
    ) -> VerifiedList | None:
        """The entry at ``path`` for the short list ``order`` (written for ``record``,
        :meth:`record`); ``None`` when it is missing, or corrupt or written for another record
        (then it is deleted, with a warning, to be computed again)."""
        if not path.is_file():
            return None
        try:
            z = load_npz(path, what="verified short list", stands_for=record)
            return _from_arrays(z, order, path)
        except CorruptCache as exc:
            # one warning per cache, however many entries a swap or an old version left behind
            (log.debug if self.refused else log.warning)("%s; verifying that short list again", exc)
            self.refused += 1
            path.unlink(missing_ok=True)
            return None

    def save(
        self,
        path: Path,
        order: NDArray[np.int64],
        verified: VerifiedList,
        record: dict[str, object] | None = None,
    ) -> None:
        """Write ``verified`` (the result for the short list ``order``, standing for ``record``)
        atomically."""
        position = {int(v): i for i, v in enumerate(order.tolist())}
        keys = sorted(verified.matches, key=lambda v: position[v])
        arrays: dict[str, NDArray] = {
            "head": np.array([position[int(v)] for v in verified.head.tolist()], np.int64),
            "verified": np.array([position[int(v)] for v in verified.verified.tolist()], np.int64),
            "inliers": np.asarray(verified.inliers, np.int64),
            "match_of": np.array([position[v] for v in keys], np.int64),
            "match_counts": np.array([len(verified.matches[v]) for v in keys], np.int64),
            "match_xy": (
                np.concatenate([verified.matches[v] for v in keys]) if keys else np.zeros((0, 4))
            ).astype(np.float32),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        save_npz(path, arrays, stands_for=record)


def _from_arrays(z: dict[str, NDArray], order: NDArray[np.int64], path: Path) -> VerifiedList:
    """A :class:`VerifiedList` from a cache entry's arrays, every index and count checked."""
    r = len(order)

    def array(name: str, dtype: type, ndim: int) -> NDArray:
        a = z.get(name)
        if a is None or a.dtype != dtype or a.ndim != ndim:
            raise CorruptCache(
                f"{name!r} is missing or not a {ndim}-D {np.dtype(dtype).name} array", path
            )
        return a

    def positions(name: str) -> NDArray[np.int64]:
        a = array(name, np.int64, 1)
        if a.size and (a.min() < 0 or a.max() >= r):
            raise CorruptCache(f"{name!r} is not a list of positions in a short list of {r}", path)
        return a

    head, verified, match_of = positions("head"), positions("verified"), positions("match_of")
    inliers, counts = array("inliers", np.int64, 1), array("match_counts", np.int64, 1)
    xy = array("match_xy", np.float32, 2)
    ok = (
        len(head) == r
        and np.array_equal(np.sort(head), np.arange(r))
        and len(verified) <= r
        and np.array_equal(head[: len(verified)], verified)
        and inliers.shape == verified.shape
        and bool(np.all(inliers >= 1))
        and counts.shape == match_of.shape
        and bool(np.all(counts >= 0))
        and bool(np.isin(match_of, verified).all())
        and xy.shape[1] == 4
        and xy.shape[0] == int(counts.sum())
        and bool(np.isfinite(xy).all())
    )
    if not ok:
        raise CorruptCache("the verified short list does not fit its short list", path)
    pieces = np.split(xy, np.cumsum(counts)[:-1]) if len(counts) else []
    matches = {int(order[p]): piece for p, piece in zip(match_of.tolist(), pieces, strict=True)}
    return VerifiedList(order[head], order[verified], inliers, matches)


@dataclass(frozen=True)
class QueryBlock:
    """The short lists one verification task holds: ``(query index, query name, short list, entry
    file name)`` each (named by its queries in messages)."""

    lists: tuple[tuple[int, str, NDArray[np.int64], str], ...]

    def __str__(self) -> str:
        names = [q for _, q, _, _ in self.lists]
        return f"the short lists of {len(names)} queries ({names[0]} .. {names[-1]})"


class VerifyBlock:
    """Picklable job: verify a block of short lists and write each one's cache entry where it runs.

    A task returns receipts ``(entry file name, computed)``, never the lists; the driver reads
    the entries back from the :class:`VerificationCache` (digest-checked). An entry is a pure
    function of its query, short list, stores, words and settings, so an attempt that finds the
    entry already written (a retried task whose first worker was only slow) leaves it as it is.
    """

    def __init__(self, verifier: ShortListVerifier, folder: Path) -> None:
        self.verifier = verifier
        self.folder = Path(folder)

    def __call__(self, block: QueryBlock) -> list[tuple[str, bool]]:
        cache = VerificationCache(self.folder, verification_inputs(self.verifier))
        parts = self.verifier.index_parts
        receipts = []
        for qi, qname, order, entry in block.lists:
            path = self.folder / entry
            computed = not path.is_file()
            if computed:
                record = cache.record(qname, [parts[int(j)] for j in order])
                verified = self.verifier((qi, qname, order))
                cache.save(path, np.asarray(order, np.int64), verified, record)
            receipts.append((entry, computed))
        return receipts


#: Most short lists one verification task holds (a task of a few seconds; a worker's lost work).
BLOCK_QUERIES = 8


def verify_short_lists(
    job: ShortListVerifier,
    items: Sequence[tuple[int, str, NDArray[np.int64]]],
    ctx: RunContext,
    *,
    desc: str = "spatial",
) -> list[VerifiedList]:
    """Verify every ``(query index, query name, short list)``; results in the order of ``items``.

    Lists verified before with the same features, words and settings come from the
    :class:`VerificationCache` under ``ctx.cache``; the others run through ``ctx.executor`` in
    blocks of queries (:class:`VerifyBlock`), each task writing its lists' entries as it goes, so an
    interrupted or killed run keeps what it verified and the rerun verifies only the rest. Records
    the step ``desc`` (spaces as ``_``) as a cache hit when every list was found.

    Raises:
        InputError: an entry is missing after its task returned (workers that do not share the
            cache folder).
    """
    items = list(items)
    cache = VerificationCache.for_job(job, Path(ctx.cache))
    if cache.folder.is_dir():
        remove_stale_temps(cache.folder)
    lists = [(qname, [job.index_parts[int(j)] for j in order]) for _, qname, order in items]
    paths = [cache.path(q, c) for q, c in lists]
    records = [cache.record(q, c) for q, c in lists]
    orders = [np.asarray(it[2], np.int64) for it in items]
    results: list[VerifiedList | None] = [
        cache.load(p, o, r) for p, o, r in zip(paths, orders, records, strict=True)
    ]
    todo = [i for i, r in enumerate(results) if r is None]
    if cache.refused > 1:
        log.info(
            "%s: %d cached short lists refused in all; verifying them again", desc, cache.refused
        )
    log.info("%s: %d of %d short lists from the cache", desc, len(items) - len(todo), len(items))
    if todo:
        cache.folder.mkdir(parents=True, exist_ok=True)
        size = max(1, min(BLOCK_QUERIES, -(-len(todo) // (2 * ctx.executor.workers))))
        blocks = [
            QueryBlock(
                tuple(
                    (items[i][0], items[i][1], orders[i], paths[i].name) for i in todo[s : s + size]
                )
            )
            for s in range(0, len(todo), size)
        ]
        run = ctx.executor.map(
            VerifyBlock(job, cache.folder), blocks, desc=desc, unit="block", progress=ctx.progress
        )
        with contextlib.closing(run):
            for _ in run:
                pass
        for i in todo:
            results[i] = cache.load(paths[i], orders[i], records[i])
            if results[i] is None:
                raise InputError(
                    f"{desc}: the verified short list of query {items[i][1]!r} is missing after its "
                    "task returned (do the workers see the cache folder?)",
                    paths[i],
                )
    ctx.record_step(desc.replace(" ", "_"), hit=not todo)
    return [r for r in results if r is not None]


def verified_first(
    order: NDArray[np.int64],
    row_scores: NDArray[np.float32],
    verified: NDArray[np.int64],
    inliers: NDArray[np.int64],
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """One query's list after verification: ``verified`` first (in their order), then ``order``'s rest.

    Args:
        order: ``[n]`` the ranking verification started from.
        row_scores: ``[n_index]`` its scores by index position.
        verified: ``[v]`` the verified images, best first; ``inliers``: their inlier counts.

    Returns:
        ``(order, scores aligned with it)``: a verified image's score is its inlier count (>= 1,
        above any similarity score), the others keep theirs.
    """
    new_order = np.concatenate([verified, order[~np.isin(order, verified)]])
    scores = row_scores[new_order].astype(np.float32)
    scores[: len(verified)] = inliers
    return new_order, scores


def joined(
    first: VerifiedList, second: VerifiedList | None
) -> tuple[NDArray[np.int64], NDArray[np.int64], dict[int, NDArray[np.float32]]]:
    """The images verified in two rounds, by inlier count (stable), and their correspondences."""
    verified, inliers = first.verified, first.inliers
    found = dict(first.matches)
    if second is not None:
        verified = np.concatenate([verified, second.verified])
        inliers = np.concatenate([inliers, second.inliers])
        by_inliers = np.argsort(-inliers, kind="stable")
        verified, inliers = verified[by_inliers], inliers[by_inliers]
        found.update(second.matches)
    return verified, inliers, {v: found[v] for v in verified.tolist() if v in found}


def verify_ranked(
    job: ShortListVerifier,
    names: Sequence[str],
    ranks: NDArray[np.int64],
    r: int,
    ctx: RunContext,
    *,
    rows: dict[int, NDArray[np.int64]] | None = None,
    stage: str = "spatial",
) -> list[VerifiedList]:
    """:func:`verify_short_lists` of each query's top ``r`` of ``ranks`` (or, with ``rows``, of
    those lists only, in order); ``names``: the queries' image names. Timed as ``stage``."""
    if rows is None:
        items = [(qi, names[qi], ranks[qi, :r]) for qi in range(ranks.shape[0])]
    else:
        items = [(qi, names[qi], order) for qi, order in rows.items()]
    with ctx.timed(stage):
        return verify_short_lists(job, items, ctx, desc=stage.replace("_", " "))
