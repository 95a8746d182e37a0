"""Query expansion and database-side augmentation, on bag-of-words or global vectors.

Every function is pure and accepts rows as dense NumPy arrays or as ``scipy.sparse`` matrices
(tf-idf vectors of a large vocabulary): a query is a 1-D array ``[d]``, a ``[1, d]`` dense array or
a ``[1, d]`` sparse row; a set of vectors is ``[n, d]`` dense or sparse. The result has the kind of
the input it replaces: a sparse query gives a ``[1, d]`` CSR row, a 1-D dense query a 1-D array, a
2-D dense query a ``[1, d]`` array; database vectors keep their kind and shape.

With ``normalize=True`` (the default everywhere) each input vector is L2-normalised before it is
combined and the result is L2-normalised, which is what a cosine / dot-product search expects.
All-zero vectors stay zero.

- :func:`average_query_expansion`: Chum, Philbin, Sivic, Isard, Zisserman, "Total Recall:
  Automatic Query Expansion with a Generative Feature Model for Object Retrieval", ICCV 2007
  (average query expansion over spatially verified results).
- :func:`discriminative_query_expansion`: Arandjelovic & Zisserman, "Three things everyone should
  know to improve object retrieval", CVPR 2012 (a linear SVM's weight vector as the new query).
- :func:`database_side_augmentation`: Arandjelovic & Zisserman 2012 (DBA); rank weights as in
  Gordo et al., "End-to-end learning of deep visual representations", IJCV 2017; similarity
  weights as in Radenovic, Tolias, Chum, TPAMI 2018.
- :func:`alpha_query_expansion`: Radenovic, Tolias, Chum, "Fine-tuning CNN Image Retrieval with
  No Human Annotation", TPAMI 2018 (alpha-QE).
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias, cast

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench.errors import InputError

#: A query vector or a set of row vectors, dense or sparse.
Vectors: TypeAlias = NDArray[np.floating] | sp.spmatrix | sp.sparray


# --------------------------------------------------------------------------------------------
# Dense/sparse plumbing
# --------------------------------------------------------------------------------------------


def _as_rows(x: Vectors, name: str) -> np.ndarray | sp.csr_matrix:
    """2-D float64 rows: a CSR matrix for sparse input, an ndarray otherwise."""
    if sp.issparse(x):
        rows = sp.csr_matrix(x, dtype=np.float64)
    else:
        arr = np.asarray(x)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2:
            raise InputError(
                f"{name} must be a vector or a 2-D array of row vectors, got {arr.shape}"
            )
        if arr.size and not np.issubdtype(arr.dtype, np.number):
            raise InputError(f"{name} must be numeric, got dtype {arr.dtype}")
        rows = arr.astype(np.float64)
    if rows.shape[0] and not np.all(np.isfinite(rows.data if sp.issparse(rows) else rows)):
        raise InputError(f"{name} holds NaN or infinite values")
    return rows


def _as_query(x: Vectors, name: str = "query_vec") -> np.ndarray | sp.csr_matrix:
    rows = _as_rows(x, name)
    if rows.shape[0] != 1:
        raise InputError(f"{name} must be one vector ([d] or [1, d]), got shape {rows.shape}")
    return rows


def _check_dim(a: np.ndarray | sp.csr_matrix, b: np.ndarray | sp.csr_matrix, name: str) -> None:
    if b.shape[0] and a.shape[1] != b.shape[1]:
        raise InputError(f"{name} have dimension {b.shape[1]}, the query has {a.shape[1]}")


def _row_norms(rows: np.ndarray | sp.csr_matrix) -> NDArray[np.float64]:
    if sp.issparse(rows):
        csr = cast(sp.csr_matrix, rows)  # issparse() is not a type guard for mypy
        return np.sqrt(np.asarray(csr.multiply(csr).sum(axis=1)).ravel())
    return np.linalg.norm(rows, axis=1)


def _scale_rows(rows: np.ndarray | sp.csr_matrix, s: NDArray[np.float64]):
    if sp.issparse(rows):
        return sp.csr_matrix(sp.diags(s) @ rows)
    return rows * s[:, None]


def _l2_normalize(rows: np.ndarray | sp.csr_matrix):
    norms = _row_norms(rows)
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return _scale_rows(rows, inv)


def _stack(a: np.ndarray | sp.csr_matrix, b: np.ndarray | sp.csr_matrix):
    if sp.issparse(a) or sp.issparse(b):
        return sp.csr_matrix(sp.vstack([sp.csr_matrix(a), sp.csr_matrix(b)]))
    return np.vstack((a, b))


def _unify(a, b):
    """Both as CSR when either is sparse (dense + sparse would give an np.matrix)."""
    if sp.issparse(a) != sp.issparse(b):
        return sp.csr_matrix(a), sp.csr_matrix(b)
    return a, b


def _like(result: np.ndarray | sp.csr_matrix, template: Vectors):
    """Return ``result`` (rows) in the kind and shape of ``template``."""
    if sp.issparse(template):
        return sp.csr_matrix(result)
    dense = cast(sp.csr_matrix, result).toarray() if sp.issparse(result) else np.asarray(result)
    if np.asarray(template).ndim == 1:
        return dense.ravel()
    return dense


def _weighted_sum(weights: NDArray[np.float64], rows: np.ndarray | sp.csr_matrix):
    """``weights @ rows`` as a [1, d] row of the rows' kind."""
    if sp.issparse(rows):
        return sp.csr_matrix(sp.csr_matrix(weights[None, :]) @ rows)
    return (weights @ rows)[None, :]


def _dots(q: np.ndarray | sp.csr_matrix, rows: np.ndarray | sp.csr_matrix) -> NDArray[np.float64]:
    prod = rows @ q.T
    return np.asarray(prod.toarray() if sp.issparse(prod) else prod).ravel()


# --------------------------------------------------------------------------------------------
# Query-side expansion
# --------------------------------------------------------------------------------------------


def _query_and_rows(query_vec: Vectors, rows: Vectors, name: str, *, normalize: bool):  # noqa: ANN202
    """The query and the rows, checked, in one kind (dense/sparse), L2-normalised if asked."""
    q = _as_query(query_vec)
    x = _as_rows(rows, name)
    _check_dim(q, x, name)
    q, x = _unify(q, x)
    if normalize:
        q, x = _l2_normalize(q), _l2_normalize(x)
    return q, x


def _expanded(
    q: Any, x: Any, weights: NDArray[np.float64], *, normalize: bool, like: Vectors
) -> Vectors:
    """The weighted mean of the query (weight 1) and rows ``x`` (``weights``), shaped like ``like``."""
    total = q + _weighted_sum(weights, x) if x.shape[0] else q
    mean = total * (1.0 / (1.0 + float(np.sum(weights))))
    if normalize:
        mean = _l2_normalize(mean)
    return _like(mean, like)


def average_query_expansion(
    query_vec: Vectors, verified_vecs: Vectors, *, normalize: bool = True
) -> Vectors:
    """Average query expansion (Chum et al., ICCV 2007, "Total Recall").

    The new query is the mean of the query vector and the vectors of the spatially verified
    database images: ``(q + sum_i v_i) / (1 + n)``. With ``normalize``, ``q`` and each ``v_i`` are
    L2-normalised first and the mean is L2-normalised.

    Args:
        query_vec: the query, ``[d]`` / ``[1, d]`` dense or ``[1, d]`` sparse.
        verified_vecs: ``[n, d]`` vectors of the verified images (``n = 0`` returns the query).
        normalize: L2-normalise inputs and output.

    Returns:
        The expanded query, in the kind and shape of ``query_vec``.

    Example:
        >>> average_query_expansion(np.array([1.0, 0.0]), np.array([[0.0, 1.0]]), normalize=False)
        array([0.5, 0.5])
    """
    q, v = _query_and_rows(query_vec, verified_vecs, "verified_vecs", normalize=normalize)
    return _expanded(q, v, np.ones(v.shape[0]), normalize=normalize, like=query_vec)


def alpha_query_expansion(
    query_vec: Vectors,
    neighbour_vecs: Vectors,
    *,
    alpha: float = 3.0,
    similarities: NDArray[np.floating] | None = None,
    normalize: bool = True,
) -> Vectors:
    """Alpha query expansion, alpha-QE (Radenovic, Tolias, Chum, TPAMI 2018).

    For global descriptors: the new query is the weighted mean of the query (weight 1) and its top
    neighbours ``x_i`` (weights ``max(s_i, 0) ** alpha``, with ``s_i`` the query-neighbour
    similarity); ``alpha = 0`` is plain average QE over the neighbours.

    Args:
        query_vec: the query, ``[d]`` / ``[1, d]`` dense or ``[1, d]`` sparse.
        neighbour_vecs: ``[n, d]`` the top-``n`` retrieved vectors.
        alpha: the exponent.
        similarities: ``[n]`` similarities to use; default: dot products of the (normalised, when
            ``normalize``) query and neighbours.
        normalize: L2-normalise inputs and output.

    Returns:
        The expanded query, in the kind and shape of ``query_vec``.
    """
    if alpha < 0:
        raise InputError(f"alpha must be >= 0, got {alpha}")
    q, x = _query_and_rows(query_vec, neighbour_vecs, "neighbour_vecs", normalize=normalize)
    if similarities is None:
        sims = _dots(q, x) if x.shape[0] else np.zeros(0)
    else:
        sims = np.asarray(similarities, dtype=np.float64).ravel()
        if sims.shape[0] != x.shape[0]:
            raise InputError(f"{sims.shape[0]} similarities for {x.shape[0]} neighbour vectors")
    weights = np.power(np.clip(sims, 0.0, None), alpha)
    return _expanded(q, x, weights, normalize=normalize, like=query_vec)


def discriminative_query_expansion(
    query_vec: Vectors,
    positive_vecs: Vectors,
    negative_vecs: Vectors,
    *,
    c: float = 1.0,
    include_query: bool = True,
    balanced: bool = True,
    normalize: bool = True,
    max_iter: int = 500,
    tol: float = 1e-8,
) -> Vectors:
    """Discriminative query expansion, DQE (Arandjelovic & Zisserman, CVPR 2012).

    A linear SVM separates the positives (the query and the spatially verified images) from the
    negatives (images from the bottom of the initial ranking); its weight vector ``w`` is the new
    query (the bias does not change a ranking by ``w . x``). The SVM is solved here exactly in the
    primal with the squared hinge loss (L2-SVM) by L-BFGS (``scipy.optimize``)::

        min_{w,b} 1/2 |w|^2 + c * sum_i k_i * max(0, 1 - y_i (w . x_i + b))^2

    where ``k_i`` reweights the classes to equal total weight when ``balanced`` (few positives,
    many negatives) and is 1 otherwise. For sparse input the problem is solved on the union of the
    training vectors' non-zero dimensions (``w`` lies in their span), so a 1M-word vocabulary costs
    nothing extra.

    Args:
        query_vec: the query, ``[d]`` / ``[1, d]`` dense or ``[1, d]`` sparse.
        positive_vecs: ``[p, d]`` the verified images.
        negative_vecs: ``[n, d]`` low-ranked images, ``n >= 1``.
        c: the SVM's C.
        include_query: count the query as a positive (as in the paper).
        balanced: equal total weight for both classes.
        normalize: L2-normalise the training vectors and the returned ``w``.
        max_iter: L-BFGS iteration cap.
        tol: L-BFGS gradient tolerance.

    Returns:
        ``w``, in the kind and shape of ``query_vec``.
    """
    from scipy.optimize import minimize

    if c <= 0:
        raise InputError(f"c must be positive, got {c}")
    q = _as_query(query_vec)
    pos = _as_rows(positive_vecs, "positive_vecs")
    neg = _as_rows(negative_vecs, "negative_vecs")
    _check_dim(q, pos, "positive_vecs")
    _check_dim(q, neg, "negative_vecs")
    if include_query:
        pos = _stack(q, pos) if pos.shape[0] else q
    if pos.shape[0] == 0 or neg.shape[0] == 0:
        raise InputError("discriminative QE needs at least one positive and one negative vector")
    x = _stack(pos, neg)
    if normalize:
        x = _l2_normalize(x)
    n_pos, n_neg = pos.shape[0], neg.shape[0]
    y = np.concatenate((np.ones(n_pos), -np.ones(n_neg)))
    if balanced:
        n = n_pos + n_neg
        k = np.where(y > 0, n / (2.0 * n_pos), n / (2.0 * n_neg))
    else:
        k = np.ones(n_pos + n_neg)
    dim = x.shape[1]
    if sp.issparse(x):
        support = np.unique(x.indices)
        xs = x[:, support]
    else:
        support = np.arange(dim)
        xs = x
    ck = c * k

    def objective(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        w, b = theta[:-1], theta[-1]
        scores = np.asarray(xs @ w).ravel() + b
        margin = np.maximum(0.0, 1.0 - y * scores)
        f = 0.5 * float(w @ w) + float(np.sum(ck * margin * margin))
        coef = -2.0 * ck * margin * y
        grad_w = w + np.asarray(xs.T @ coef).ravel()
        return f, np.concatenate((grad_w, [coef.sum()]))

    theta0 = np.zeros(support.size + 1)
    res = minimize(
        objective,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": int(max_iter), "gtol": tol, "ftol": 1e-15},
    )
    w_support = res.x[:-1]
    if sp.issparse(x):
        w_row = sp.csr_matrix(
            (w_support, (np.zeros(support.size, dtype=np.int64), support)), shape=(1, dim)
        )
        w_row.eliminate_zeros()
    else:
        w_row = w_support[None, :]
    if normalize:
        w_row = _l2_normalize(w_row)
    return _like(w_row, query_vec)


# --------------------------------------------------------------------------------------------
# Database-side augmentation
# --------------------------------------------------------------------------------------------


def database_side_augmentation(
    db_vecs: Vectors,
    neighbours: NDArray[np.integer],
    *,
    weights: Literal["uniform", "rank", "alpha"] = "uniform",
    alpha: float = 3.0,
    similarities: NDArray[np.floating] | None = None,
    normalize: bool = True,
) -> Vectors:
    """Database-side augmentation, DBA (Arandjelovic & Zisserman, CVPR 2012).

    Each database vector is replaced by the weighted mean of itself (weight 1) and its top
    neighbours in the database (computed offline, e.g. by querying the database with itself and
    spatially verifying). ``neighbours[i]`` lists image ``i``'s neighbours best first; entries equal
    to ``i`` and ``-1`` (padding) are ignored. Weights of the remaining neighbours, ranked
    ``r = 1, 2, ...`` in row order:

    - ``"uniform"``: 1 (the paper's average);
    - ``"rank"``: ``(k + 1 - r) / (k + 1)`` with ``k = neighbours.shape[1]``, decreasing linearly
      with rank, the query itself being rank 0 (Gordo et al. 2017);
    - ``"alpha"``: ``max(s, 0) ** alpha`` with ``s`` the similarity of ``i`` and the neighbour
      (from ``similarities [n, k]`` aligned with ``neighbours``, default the dot products of the
      (normalised) vectors) -- alpha-DBA (Radenovic et al. 2018).

    Computed as one sparse ``[n, n]`` weight matrix times the vectors.

    Args:
        db_vecs: ``[n, d]`` database vectors, dense or sparse.
        neighbours: ``[n, k]`` int neighbour indices, ``-1`` = none.
        weights: the weighting, see above.
        alpha: exponent of ``"alpha"`` weights.
        similarities: ``[n, k]`` similarities for ``"alpha"``.
        normalize: L2-normalise inputs and outputs.

    Returns:
        ``[n, d]`` augmented vectors, of the kind of ``db_vecs``.
    """
    x = _as_rows(db_vecs, "db_vecs")
    n = x.shape[0]
    nb = np.asarray(neighbours)
    if nb.ndim == 1 and n == nb.shape[0]:
        nb = nb[:, None]
    if nb.ndim != 2 or nb.shape[0] != n or (nb.size and not np.issubdtype(nb.dtype, np.integer)):
        raise InputError(
            f"neighbours must be an [n={n}, k] integer array, got {nb.shape} {nb.dtype}"
        )
    nb = nb.astype(np.int64, copy=False)
    if nb.size and (nb.max() >= n or nb.min() < -1):
        raise InputError(f"neighbour indices must lie in [0, {n}) or be -1")
    if weights not in ("uniform", "rank", "alpha"):
        raise InputError(f"unknown DBA weights {weights!r}; use uniform, rank or alpha")
    if normalize:
        x = _l2_normalize(x)
    k = nb.shape[1]
    rows = np.repeat(np.arange(n), k).reshape(n, k)
    valid = (nb >= 0) & (nb != rows)
    if weights == "uniform":
        w = np.ones((n, k))
    elif weights == "rank":
        rank = np.cumsum(valid, axis=1)
        w = (k + 1.0 - rank) / (k + 1.0)
    else:
        if alpha < 0:
            raise InputError(f"alpha must be >= 0, got {alpha}")
        if similarities is None:
            r_i, c_j = rows[valid], nb[valid]
            sims = np.zeros((n, k))
            if sp.issparse(x):
                sims[valid] = np.asarray(x[r_i].multiply(x[c_j]).sum(axis=1)).ravel()
            else:
                sims[valid] = np.einsum("ij,ij->i", x[r_i], x[c_j])
        else:
            sims = np.asarray(similarities, dtype=np.float64)
            if sims.shape != nb.shape:
                raise InputError(f"similarities shape {sims.shape} != neighbours shape {nb.shape}")
        w = np.power(np.clip(sims, 0.0, None), alpha)
    w = np.where(valid, w, 0.0)
    mat = sp.coo_matrix((w[valid], (rows[valid], nb[valid])), shape=(n, n)).tocsr()
    mat = sp.csr_matrix(mat + sp.identity(n, format="csr"))
    out = mat @ x
    if sp.issparse(out):
        out = sp.csr_matrix(out)
    if normalize:
        out = _l2_normalize(out)
    else:
        row_sum = np.asarray(mat.sum(axis=1)).ravel()
        out = _scale_rows(out, 1.0 / row_sum)
    if sp.issparse(db_vecs):
        return sp.csr_matrix(out)
    return np.asarray(out.toarray() if sp.issparse(out) else out)
