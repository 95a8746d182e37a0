"""Bag-of-visual-words vectors and a tf-idf inverted file over scipy.sparse.

An image becomes a histogram of its visual words (term frequencies ``tf``; with soft assignment,
sums of per-feature weights). The inverted file weights them with inverse document frequency
``idf_w = log(N / df_w)`` (Sivic & Zisserman 2003), optionally damps bursts (a word repeated many
times in one image -- windows, bricks -- otherwise dominates: ``sqrt(tf)`` is the power-law
normalisation of Jegou et al. 2009), L2-normalises each vector, and scores a query against every
database image by the dot product (cosine similarity). The database matrix is kept transposed
(``words x images`` CSR), i.e. one posting list per word: a query touches only the lists of its own
words.

Rankings are stable: equal scores are ordered by lower database index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.schema import KindSettings, setting, validate

Burst = Literal["none", "sqrt"]


@dataclass(frozen=True)
class HardAssignment(KindSettings):
    """``assignment=hard``: each database feature counts for its nearest word."""

    kind: ClassVar[str] = "hard"

    @property
    def words(self) -> int:
        """Words each database feature counts for."""
        return 1


@dataclass(frozen=True)
class SoftAssignment(KindSettings):
    """``assignment=soft`` (Philbin et al. 2008): each database feature counts for its ``k``
    nearest words with Gaussian weights ``exp(-d^2 / (2 sigma2))`` summing to 1
    (:func:`soft_assignment_weights`); query features stay hard-assigned.

    Attributes:
        k: nearest words per database feature.
        sigma2: the Gaussian's ``sigma^2``, in squared units of the (unit-norm) descriptors.
            Philbin et al. used ``k = 3`` and ``sigma^2 = 6250`` for SIFT vectors of norm ~512,
            about 0.024 of the squared norm; the default was chosen on the training city of the
            real subset (bench/README.md, issue 23) from a grid that holds that value.
    """

    kind: ClassVar[str] = "soft"
    k: int = setting(3, S.Int(lo=1, hi=64), doc="soft assignment: nearest words")
    sigma2: float = setting(
        0.005, S.Float(lo=0, lo_open=True, hi=1e6), doc="soft assignment: sigma^2"
    )

    def __post_init__(self) -> None:
        validate(self)

    @property
    def words(self) -> int:
        """Words each database feature counts for."""
        return self.k


#: The ``assignment`` setting: how database features count for words (a kind with its own
#: settings: ``--set assignment=soft --set assignment.k=5``).
ASSIGNMENT_SPEC = S.Kinds("assignment", HardAssignment, SoftAssignment)


def soft_assignment_weights(sq_dists: NDArray[np.floating], sigma2: float) -> NDArray[np.float32]:
    """Soft-assignment weights of each feature's ``k`` nearest words (Philbin et al. 2008).

    ``w_j = exp(-d_j^2 / (2 sigma^2))``, computed relative to the nearest word (``d_j^2 - d_1^2``,
    which leaves the ratios unchanged and avoids underflow) and normalised to sum to 1 per feature, so
    every feature contributes the same total mass as under hard assignment.

    Args:
        sq_dists: ``[n, k]`` squared distances to the nearest words, nearest first.
        sigma2: ``sigma^2`` in squared-descriptor units (RootSIFT vectors have unit norm).

    Returns:
        ``float32 [n, k]``, rows summing to 1.

    Example:
        >>> soft_assignment_weights(np.array([[0.1, 0.1]]), 0.05)
        array([[0.5, 0.5]], dtype=float32)
    """
    d = np.asarray(sq_dists, dtype=np.float64)
    if d.ndim != 2:
        raise InputError(f"squared distances must be [n, k], got shape {d.shape}")
    if not sigma2 > 0:
        raise InputError(f"sigma2 must be positive, got {sigma2}")
    if d.shape[1] == 0:
        return np.zeros(d.shape, np.float32)
    w = np.exp(-(d - d[:, :1]) / (2.0 * sigma2))
    w /= w.sum(axis=1, keepdims=True)
    return w.astype(np.float32)


def bow_matrix(
    words: Sequence[NDArray[np.integer]],
    n_words: int,
    weights: Sequence[NDArray[np.floating]] | None = None,
) -> sp.csr_matrix:
    """Term-frequency matrix ``[n_images, n_words]`` from per-image word arrays.

    Args:
        words: one array per image, ``[n_features]`` (hard) or ``[n_features, k]`` (soft).
        n_words: vocabulary size.
        weights: optional per-image weights of the same shapes (soft assignment); default 1.

    Returns:
        CSR ``float32`` matrix of (weighted) word counts, duplicates summed.
    """
    rows, cols, vals = [], [], []
    for i, w in enumerate(words):
        w = np.asarray(w)
        flat = w.reshape(-1).astype(np.int64, copy=False)
        if flat.size and (flat.min() < 0 or flat.max() >= n_words):
            raise InputError(f"image {i}: visual word outside 0..{n_words - 1}")
        rows.append(np.full(flat.size, i, np.int64))
        cols.append(flat)
        if weights is None:
            vals.append(np.ones(flat.size, np.float32))
        else:
            wt = np.asarray(weights[i], np.float32)
            if wt.shape != w.shape:
                raise InputError(f"image {i}: weights shape {wt.shape} != words shape {w.shape}")
            vals.append(wt.reshape(-1))
    n = len(words)
    if n == 0:
        return sp.csr_matrix((0, n_words), dtype=np.float32)
    m = sp.coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(n, n_words),
        dtype=np.float32,
    ).tocsr()
    m.sum_duplicates()
    return m


def _l2_normalise_rows(m: sp.csr_matrix) -> sp.csr_matrix:
    norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
    inv = np.zeros_like(norms)
    nz = norms > 0
    inv[nz] = 1.0 / norms[nz]
    return sp.csr_matrix(sp.diags(inv.astype(np.float32)) @ m)


class InvertedFile:
    """A tf-idf inverted file with L2-normalised vectors and dot-product scoring.

    Args:
        n_words: vocabulary size.
        idf: weight words by ``log(N / df)`` (learned from the database in :meth:`fit`).
        burst: ``"sqrt"`` (default) damps repeated words by ``sqrt(tf)``; ``"none"`` keeps ``tf``.

    Attributes:
        idf_: ``float32 [n_words]`` (ones when ``idf=False``; 0 for words in no database image).
        db_vectors_: CSR ``[n_db, n_words]`` weighted, L2-normalised database vectors.
        postings_: CSR ``[n_words, n_db]``: the transposed matrix, one row per word.

    Example:
        >>> tf = bow_matrix([np.array([0, 1]), np.array([1, 2])], 3)
        >>> ivf = InvertedFile(3).fit(tf)
        >>> ivf.search(bow_matrix([np.array([0])], 3)).tolist()
        [[0, 1]]
    """

    def __init__(self, n_words: int, *, idf: bool = True, burst: Burst = "sqrt") -> None:
        if burst not in ("none", "sqrt"):
            raise InputError(f"unknown burst handling {burst!r}; use 'none' or 'sqrt'")
        self.n_words = int(n_words)
        self.idf = bool(idf)
        self.burst = burst
        self.idf_: NDArray[np.float32] | None = None
        self.db_vectors_: sp.csr_matrix | None = None
        self.postings_: sp.csr_matrix | None = None

    def _check_tf(self, tf: sp.spmatrix) -> sp.csr_matrix:
        if not sp.issparse(tf):
            tf = sp.csr_matrix(np.asarray(tf, dtype=np.float32))
        tf = sp.csr_matrix(tf, dtype=np.float32)
        if tf.shape[1] != self.n_words:
            raise InputError(f"term frequencies have {tf.shape[1]} words, the index {self.n_words}")
        if tf.nnz and tf.data.min() < 0:
            raise InputError("term frequencies must be non-negative")
        return tf

    def fit(self, db_tf: sp.spmatrix) -> InvertedFile:
        """Learn idf from the database and build its posting lists.

        Args:
            db_tf: ``[n_db, n_words]`` term frequencies (:func:`bow_matrix`).

        Returns:
            self.
        """
        tf = self._check_tf(db_tf)
        self.fit_idf([tf])
        self.db_vectors_ = self.transform(tf)
        self.postings_ = self.db_vectors_.T.tocsr()
        return self

    def fit_chunks(self, db_tf_chunks: Callable[[], Iterable[sp.spmatrix]]) -> InvertedFile:
        """:meth:`fit` from the database's term frequencies in chunks of rows, read twice (idf,
        then each chunk's weighted vectors): the same vectors and lists, but the build holds one
        chunk's term frequencies and never the whole database's. At its peak it holds the
        weighted chunks, their stacked copy and the posting lists (bench/README.md, "Estimates").

        Args:
            db_tf_chunks: a function returning a fresh iterable of ``[rows, n_words]`` term
                frequencies, the database's rows in order (called twice).
        """
        self.fit_idf(db_tf_chunks())
        pieces = [self.transform(tf) for tf in db_tf_chunks()]
        if not pieces:
            raise InputError("the inverted file needs at least one chunk of term frequencies")
        stacked = sp.vstack(pieces, format="csr", dtype=np.float32)
        del pieces
        self.db_vectors_ = sp.csr_matrix(stacked)
        self.postings_ = self.db_vectors_.T.tocsr()
        return self

    def fit_idf(self, db_tf_chunks: Iterable[sp.spmatrix]) -> InvertedFile:
        """Learn idf from the database's term frequencies given in chunks of rows (all of them,
        in any order); build no posting lists (:meth:`fit` does both; a streamed build writes the
        lists itself, :meth:`oxbench.index.postings.CompressedPostings.build`).

        ``idf_w = log(n / df_w)``, ``df_w`` the database images holding word ``w`` (0 for a word
        in no image); all ones when ``idf=False``.
        """
        n, df = 0, np.zeros(self.n_words, np.int64)
        for chunk in db_tf_chunks:
            tf = self._check_tf(chunk)
            n += tf.shape[0]
            df += np.bincount(tf.indices[tf.data > 0], minlength=self.n_words)
        if self.idf:
            idf = np.zeros(self.n_words, np.float64)
            nz = df > 0
            idf[nz] = np.log(n / df[nz].astype(np.float64))
            self.idf_ = idf.astype(np.float32)
        else:
            self.idf_ = np.ones(self.n_words, np.float32)
        return self

    def use_database(self, vectors: sp.spmatrix) -> InvertedFile:
        """Search ``vectors [n_db, n_words]`` (already weighted, e.g. augmented) instead of the fitted ones."""
        if self.idf_ is None or self.db_vectors_ is None:
            raise InputError("the inverted file is not built (call fit)")
        v = sp.csr_matrix(vectors, dtype=np.float32)
        if v.shape != self.db_vectors_.shape:
            raise InputError(
                f"database vectors of shape {v.shape}, the index holds {self.db_vectors_.shape}"
            )
        self.db_vectors_ = v
        self.postings_ = v.T.tocsr()
        return self

    def transform(self, tf: sp.spmatrix) -> sp.csr_matrix:
        """Weighted, L2-normalised vectors ``[n, n_words]`` of term-frequency rows."""
        if self.idf_ is None:
            raise InputError("the inverted file is not built (call fit)")
        tf = self._check_tf(tf)
        if self.burst == "sqrt":
            tf = tf.copy()
            tf.data = np.sqrt(tf.data)
        weighted = sp.csr_matrix(tf @ sp.diags(self.idf_))
        weighted.eliminate_zeros()
        return _l2_normalise_rows(weighted)

    def scores_of_vectors(self, vectors: sp.spmatrix | NDArray[np.floating]) -> NDArray[np.float32]:
        """Dot products ``[n_queries, n_db]`` of already weighted query vectors with the database."""
        if self.postings_ is None:
            raise InputError("the inverted file is not built (call fit)")
        if sp.issparse(vectors):
            q = sp.csr_matrix(vectors, dtype=np.float32)
            out = q @ self.postings_
            return np.asarray(out.toarray(), dtype=np.float32)
        q = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        return np.asarray(self.postings_.T @ q.T, dtype=np.float32).T

    def scores(self, query_tf: sp.spmatrix) -> NDArray[np.float32]:
        """Cosine scores ``[n_queries, n_db]`` of query term frequencies."""
        return self.scores_of_vectors(self.transform(query_tf))

    def search(self, query_tf: sp.spmatrix, k: int | None = None) -> NDArray[np.int64]:
        """Ranked database indices ``[n_queries, k]`` (all when ``k`` is None), best first.

        Ties are broken by lower database index (stable sort):
        :func:`oxbench.evaluation.ranking.ranks_from_scores`.
        """
        return ranks_from_scores(self.scores(query_tf).T, k)
