/*
 * oxbench.evaluation._accel -- optional compiled kernels for oxbench.evaluation.kernels.
 *
 * Written from scratch for oxbench. Arrays arrive through the buffer protocol (no numpy headers
 * at build time); the loops run without the GIL. Each kernel only reports whether the input was
 * clean: on any anomaly (an index out of range, a repeated image, a NaN score, an unsupported
 * dtype) it returns a non-zero status and the Python caller reruns the numpy path, which raises
 * the exact InputError. So the numbers and the error messages are the numpy path's by
 * construction.
 *
 *   scan_ranks(ranks, tables, n_index, lab_off, out_pos, out_code, out_count
 *              [, group_bytes, block_bytes]) -> int status
 *   (revisitop layout: block_bytes = the transpose buffer, default 4 MiB; group_bytes only for
 *   the fallback without transpose, see run_ranks)
 *   score_ranks(scores, row_outer, u, u_off, ev_row, ev_q, ev_key, out_snap,
 *               cnt, cnt_off, n_bins, group[, vec]) -> int status
 *   (vec=False: no vectorisable bin map, for benchmarking only)
 *   asmk_scatter(scores, ids, codes, query, weights) -> int status
 *   (for oxbench.index.asmk_file: one query word against one posting list; here ST_UNSUPPORTED
 *   also covers a buffer that is not C-contiguous, and nothing is written unless ST_OK)
 *   bow_scatter(scores, code, weights, offsets, words, query_weights) -> int status
 *   (for oxbench.index.postings: one weighted query against the compressed lists of its words;
 *   ST_UNSUPPORTED as asmk_scatter's; on ST_BAD the scores may hold part of the sums, and the
 *   caller starts again from zeros with numpy)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { ST_OK = 0, ST_BAD = 1, ST_UNSUPPORTED = 2 };

/* Zeroed memory for tables read at random, aligned to 2 MiB and, where the system offers it,
 * backed by huge pages (fewer TLB misses: large on virtual machines). PyMem_Raw*: traced by
 * tracemalloc, usable without the GIL. Free `*raw`. */
#define HUGE_ALIGN ((size_t)2 << 20)
static void *alloc_zeroed_huge(size_t bytes, void **raw)
{
    if (bytes < HUGE_ALIGN) {
        *raw = PyMem_RawCalloc(bytes ? bytes : 1, 1);
        return *raw;
    }
    *raw = PyMem_RawCalloc(bytes + HUGE_ALIGN, 1);
    if (!*raw) return NULL;
    char *p = (char *)(((uintptr_t)*raw + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, bytes & ~(HUGE_ALIGN - 1), MADV_HUGEPAGE);
#endif
    return p;
}

/* Item kinds accepted from buffer formats. */
enum { K_I64, K_I32, K_F64, K_F32, K_U8, K_U64, K_U32, K_F16, K_OTHER };

static int fmt_kind(const Py_buffer *b)
{
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@' || *f == '!' || *f == '>') {
        if (*f == '>' || *f == '!') return K_OTHER; /* big-endian: let numpy handle it */
        f++;
    }
    if (f[0] == '\0' || f[1] != '\0') return K_OTHER;
    switch (f[0]) {
    case 'q': case 'l': case 'n':
        if (b->itemsize == 8) return K_I64;
        if (b->itemsize == 4) return K_I32;
        return K_OTHER;
    case 'i':
        return b->itemsize == 4 ? K_I32 : K_OTHER;
    case 'd':
        return b->itemsize == 8 ? K_F64 : K_OTHER;
    case 'f':
        return b->itemsize == 4 ? K_F32 : K_OTHER;
    case 'e':
        return b->itemsize == 2 ? K_F16 : K_OTHER;
    case 'B':
        return b->itemsize == 1 ? K_U8 : K_OTHER;
    case 'Q': case 'L': case 'N':
        if (b->itemsize == 8) return K_U64;
        if (b->itemsize == 4) return K_U32;
        return K_OTHER;
    case 'I':
        return b->itemsize == 4 ? K_U32 : K_OTHER;
    default:
        return K_OTHER;
    }
}

/* Get a 1-D C-contiguous buffer of the given kind and at least `n` items. */
static int get_vec(PyObject *o, Py_buffer *b, int kind, Py_ssize_t n, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) < 0) return -1;
    if (fmt_kind(b) != kind || b->len / b->itemsize < n) {
        PyErr_Format(PyExc_ValueError, "_accel: bad buffer for %s", what);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* A 2-D strided buffer. */
static int get_2d(PyObject *o, Py_buffer *b, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return -1;
    if (b->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "_accel: %s must be 2-D", what);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Ranks: per query a 1-byte label table (indices < n_lab) and a
 * seen-bitset over 0..n_index-1; labelled entries are written as (position, code), at most as
 * many per query as it has labels (a repeated image is an error, so this cannot overflow).
 */

typedef struct {
    const char *base;
    Py_ssize_t s_q, s_j; /* byte strides: query, position */
    Py_ssize_t nq, k;
    int i32;
    const uint8_t *tables;
    Py_ssize_t n_lab;
    int64_t n_index;
    const int64_t *lab_off;
    int64_t *out_pos;
    uint8_t *out_code;
    int64_t *out_count;
    uint64_t *seen; /* nq * words */
    Py_ssize_t words;
    Py_ssize_t group_bytes, block_bytes;
} ranks_job;

/* Record that query q's ranked position j holds a labelled image (label code c). The output slots
 * of a query are sized by its label count, so running past them means an image was repeated. */
static inline int emit_label(const ranks_job *J, Py_ssize_t q, int64_t j, uint8_t c)
{
    const int64_t at = J->lab_off[q] + J->out_count[q];
    if (at >= J->lab_off[q + 1]) return ST_BAD;
    J->out_pos[at] = j;
    J->out_code[at] = c;
    J->out_count[q]++;
    return ST_OK;
}

static inline int scan_entry(const ranks_job *J, Py_ssize_t q, Py_ssize_t j, int64_t v)
{
    if ((uint64_t)v >= (uint64_t)J->n_index) {
        return v == -1 ? ST_OK : ST_BAD;
    }
    uint64_t *w = J->seen + q * J->words + (v >> 6);
    uint64_t bit = (uint64_t)1 << (v & 63);
    if (*w & bit) return ST_BAD;
    *w |= bit;
    if (v < J->n_lab) {
        uint8_t c = J->tables[q * J->n_lab + v];
        if (c && emit_label(J, q, j, c)) return ST_BAD;
    }
    return ST_OK;
}

static inline int64_t load_index(const char *p, int i32)
{
    if (i32) {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    int64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* Fallback for the revisitop layout when the blocked transpose below does not apply
 * (n_index > 2^31, or more label-table columns than indices): one group of queries [g0, g1)
 * over positions [j0, j1) (positions outer, queries inner, both strides positive); the loop
 * invariants in locals (stores to the bitsets and outputs could alias the job's fields), the row
 * `PF` positions ahead prefetched. Specialised for int64 / int32 items. */
#define PF 8
static inline int scan_group(const ranks_job *J, Py_ssize_t g0, Py_ssize_t g1, Py_ssize_t j0,
                             Py_ssize_t j1, const int i32)
{
    const Py_ssize_t m = g1 - g0, s_j = J->s_j, s_q = J->s_q, words = J->words;
    const uint64_t n_index = (uint64_t)J->n_index, n_lab = (uint64_t)J->n_lab;
    uint64_t *const seen = J->seen + g0 * words;
    const uint8_t *const tables = J->tables + g0 * J->n_lab;
    const char *row = J->base + j0 * s_j + g0 * s_q;
    const Py_ssize_t span = (m - 1) * s_q + (i32 ? 4 : 8) - 1;
    const Py_ssize_t k = J->k;
    for (Py_ssize_t j = j0; j < j1; j++, row += s_j) {
        if (j + PF < k) {
            __builtin_prefetch(row + PF * s_j, 0, 0);
            __builtin_prefetch(row + PF * s_j + span, 0, 0);
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            const uint64_t v = (uint64_t)load_index(row + i * s_q, i32);
            if (v >= n_index) {
                if ((int64_t)v == -1) continue;
                return ST_BAD;
            }
            uint64_t *const w = seen + i * words + (v >> 6);
            const uint64_t bit = (uint64_t)1 << (v & 63), old = *w;
            if (old & bit) return ST_BAD;
            *w = old | bit;
            if (v < n_lab) {
                const uint8_t c = tables[i * n_lab + v];
                if (c && emit_label(J, g0 + i, j, c)) return ST_BAD;
            }
        }
    }
    return ST_OK;
}

/* Rows [0, m) of a block (from `row`) into the per-query runs (run q at out + q * rows): the
 * low 32 bits of every index; the high 32 bits must be the sign extension of the low ones (else
 * `*bad`); the scan checks the runs against n_index <= 2^31 (only 0xffffffff = -1 may exceed). */
static inline void transpose_rows(const char *row, Py_ssize_t s_j, Py_ssize_t s_q, Py_ssize_t nq,
                                  uint32_t *out, Py_ssize_t rows, Py_ssize_t m, const int i32,
                                  uint64_t *bad)
{
    Py_ssize_t r = 0;
    uint64_t b = 0;
#if defined(__SSE2__)
    if ((i32 && s_q == 4) || (!i32 && s_q == 8)) {
        __m128i acc = _mm_setzero_si128();
        for (; r + 4 <= m; r += 4) {
            const char *p0 = row + r * s_j, *p1 = p0 + s_j, *p2 = p1 + s_j, *p3 = p2 + s_j;
            uint32_t *o = out + r;
            Py_ssize_t q = 0;
            if (i32) {
                for (; q + 4 <= nq; q += 4) {
                    __m128i x0 = _mm_loadu_si128((const __m128i *)(p0 + q * 4));
                    __m128i x1 = _mm_loadu_si128((const __m128i *)(p1 + q * 4));
                    __m128i x2 = _mm_loadu_si128((const __m128i *)(p2 + q * 4));
                    __m128i x3 = _mm_loadu_si128((const __m128i *)(p3 + q * 4));
                    __m128i a01 = _mm_unpacklo_epi32(x0, x1), b01 = _mm_unpackhi_epi32(x0, x1);
                    __m128i a23 = _mm_unpacklo_epi32(x2, x3), b23 = _mm_unpackhi_epi32(x2, x3);
                    _mm_storeu_si128((__m128i *)(o + q * rows), _mm_unpacklo_epi64(a01, a23));
                    _mm_storeu_si128((__m128i *)(o + (q + 1) * rows), _mm_unpackhi_epi64(a01, a23));
                    _mm_storeu_si128((__m128i *)(o + (q + 2) * rows), _mm_unpacklo_epi64(b01, b23));
                    _mm_storeu_si128((__m128i *)(o + (q + 3) * rows), _mm_unpackhi_epi64(b01, b23));
                }
            } else {
                for (; q + 2 <= nq; q += 2) {
                    __m128i x0 = _mm_loadu_si128((const __m128i *)(p0 + q * 8));
                    __m128i x1 = _mm_loadu_si128((const __m128i *)(p1 + q * 8));
                    __m128i x2 = _mm_loadu_si128((const __m128i *)(p2 + q * 8));
                    __m128i x3 = _mm_loadu_si128((const __m128i *)(p3 + q * 8));
                    /* high dword == sign fill of the low dword, for each of the 8 indices */
                    acc = _mm_or_si128(acc, _mm_xor_si128(x0, _mm_shuffle_epi32(_mm_srai_epi32(x0, 31), 0xa0)));
                    acc = _mm_or_si128(acc, _mm_xor_si128(x1, _mm_shuffle_epi32(_mm_srai_epi32(x1, 31), 0xa0)));
                    acc = _mm_or_si128(acc, _mm_xor_si128(x2, _mm_shuffle_epi32(_mm_srai_epi32(x2, 31), 0xa0)));
                    acc = _mm_or_si128(acc, _mm_xor_si128(x3, _mm_shuffle_epi32(_mm_srai_epi32(x3, 31), 0xa0)));
                    /* low dwords: [v(r, q), v(r, q + 1)] per row, then 2 x 4 transposed */
                    __m128i l0 = _mm_shuffle_epi32(x0, 0x08), l1 = _mm_shuffle_epi32(x1, 0x08);
                    __m128i l2 = _mm_shuffle_epi32(x2, 0x08), l3 = _mm_shuffle_epi32(x3, 0x08);
                    __m128i a01 = _mm_unpacklo_epi32(l0, l1), a23 = _mm_unpacklo_epi32(l2, l3);
                    _mm_storeu_si128((__m128i *)(o + q * rows), _mm_unpacklo_epi64(a01, a23));
                    _mm_storeu_si128((__m128i *)(o + (q + 1) * rows), _mm_unpackhi_epi64(a01, a23));
                }
            }
            for (; q < nq; q++) {
                const char *pp[4] = {p0, p1, p2, p3};
                for (int i = 0; i < 4; i++) {
                    const int64_t v = load_index(pp[i] + q * s_q, i32);
                    b |= (uint64_t)(v - (int64_t)(int32_t)v);
                    o[q * rows + i] = (uint32_t)v;
                }
            }
        }
        /* the odd dwords of acc: the high halves' mismatches (the even ones are always 0) */
        uint32_t t[4];
        _mm_storeu_si128((__m128i *)t, acc);
        b |= t[1] | t[3];
    }
#endif
    for (; r < m; r++) {
        const char *p = row + r * s_j;
        for (Py_ssize_t q = 0; q < nq; q++) {
            const int64_t v = load_index(p + q * s_q, i32);
            b |= (uint64_t)(v - (int64_t)(int32_t)v);
            out[q * rows + r] = (uint32_t)v;
        }
    }
    *bad |= b;
}

/* One run entry outside the common range [n_lab, n_index): a labelled candidate (test-and-set,
 * then the label lookup), -1 (padding: skipped) or an error. */
static int run_rare(const ranks_job *J, Py_ssize_t q, uint64_t *seen, uint32_t v, int64_t j)
{
    if (v >= (uint64_t)J->n_index) return v == UINT32_MAX ? ST_OK : ST_BAD;
    uint64_t *const w = seen + (v >> 6);
    const uint64_t bit = (uint64_t)1 << (v & 63);
    if (*w & bit) return ST_BAD;
    *w |= bit;
    const uint8_t c = J->tables[q * J->n_lab + v];
    return c ? emit_label(J, q, j, c) : ST_OK;
}

/* The revisitop layout in blocks of `rows` positions, read in memory order and transposed into
 * per-query runs of uint32 (transpose_rows, SSE2); each run is then scanned against its query's
 * seen-bitset alone, which stays in the nearest cache meanwhile, while the next query's bitset
 * is streamed in (prefetched evenly over the scan). Before (rows outer, queries inner) every row
 * hit all the queries' bitsets (9 MB at R1M, beyond L2) at random (slower: bench/README.md). Needs
 * n_index <= 2^31 and n_lab <= n_index. */
#ifndef CHUNK
#define CHUNK 8
#endif
static inline int scan_transposed(const ranks_job *J, uint32_t *buf, Py_ssize_t rows, const int i32)
{
    const Py_ssize_t nq = J->nq, s_j = J->s_j, s_q = J->s_q, k = J->k, words = J->words;
    /* common entries: n_lab <= v < n_index, one unsigned comparison */
    const uint32_t lo = (uint32_t)J->n_lab, span = (uint32_t)J->n_index - (uint32_t)J->n_lab;
    const Py_ssize_t lines = (words * 8 + 63) / 64;
    for (Py_ssize_t j0 = 0; j0 < k; j0 += rows) {
        const Py_ssize_t m = j0 + rows < k ? rows : k - j0;
        uint64_t bad = 0;
        transpose_rows(J->base + j0 * s_j, s_j, s_q, nq, buf, rows, m, i32, &bad);
        if (bad) return ST_BAD;
        /* lines of the next bitset to prefetch per CHUNK entries */
        const Py_ssize_t per = (lines * CHUNK + m - 1) / m;
        for (Py_ssize_t q = 0; q < nq; q++) {
            const uint32_t *col = buf + q * rows;
            uint64_t *const seen = J->seen + q * words;
            const char *nx = (const char *)(seen + words), *const nx_end = nx + words * 8;
            if (q + 1 == nq) nx = nx_end;
            Py_ssize_t r = 0;
            for (; r < m;) {
                const Py_ssize_t r1 = r + CHUNK < m ? r + CHUNK : m;
                for (Py_ssize_t i = 0; i < per && nx < nx_end; i++, nx += 64) __builtin_prefetch(nx, 1, 2);
                for (; r < r1; r++) {
                    const uint32_t v = col[r];
                    if (__builtin_expect(v - lo < span, 1)) {
                        uint64_t *const w = seen + (v >> 6);
                        const uint64_t bit = (uint64_t)1 << (v & 63), old = *w;
                        if (old & bit) return ST_BAD;
                        *w = old | bit;
                    } else if (run_rare(J, q, seen, v, j0 + r)) {
                        return ST_BAD;
                    }
                }
            }
        }
    }
    return ST_OK;
}

/* The revisitop layout with both strides positive and indices that fit the uint32 runs: the
 * blocked transpose applies. */
static int transpose_applies(const ranks_job *J)
{
    return J->s_q > 0 && J->s_j > 0 && J->s_q < J->s_j && J->nq > 0 && J->k > 0 &&
           J->n_index > 0 && J->n_index <= ((int64_t)1 << 31) && J->n_lab <= J->n_index;
}

static int run_ranks(const ranks_job *J, uint32_t *tbuf, Py_ssize_t trows)
{
    Py_ssize_t aq = J->s_q < 0 ? -J->s_q : J->s_q;
    Py_ssize_t aj = J->s_j < 0 ? -J->s_j : J->s_j;
    if (J->nq == 0 || J->k == 0) return ST_OK;
    if (tbuf) {
        return J->i32 ? scan_transposed(J, tbuf, trows, 1) : scan_transposed(J, tbuf, trows, 0);
    }
    if (aq < aj && J->s_q > 0 && J->s_j > 0) {
        /* revisitop layout, no transpose: one pass over the positions per group of queries
         * whose seen-bitsets and label tables fit in `group_bytes` (so the duplicate check's
         * random test-and-sets hit the nearest cache), reading only that group's entries of
         * each row; groups of equal size. `block_bytes` > 0: the positions in blocks of that
         * many bytes of rows, each read once per group. */
        Py_ssize_t per = J->words * 8 + J->n_lab;
        Py_ssize_t G = per > 0 ? J->group_bytes / per : J->nq;
        if (G < 1) G = 1;
        if (G > J->nq) G = J->nq;
        Py_ssize_t ng = (J->nq + G - 1) / G;
        G = (J->nq + ng - 1) / ng;
        Py_ssize_t B = J->block_bytes > 0 ? J->block_bytes / aj : J->k;
        if (B < 16) B = 16;
        for (Py_ssize_t j0 = 0; j0 < J->k; j0 += B) {
            Py_ssize_t j1 = j0 + B < J->k ? j0 + B : J->k;
            for (Py_ssize_t g0 = 0; g0 < J->nq; g0 += G) {
                Py_ssize_t g1 = g0 + G < J->nq ? g0 + G : J->nq;
                int st = J->i32 ? scan_group(J, g0, g1, j0, j1, 1) : scan_group(J, g0, g1, j0, j1, 0);
                if (st) return st;
            }
        }
    } else {
        for (Py_ssize_t q = 0; q < J->nq; q++) {
            const char *row = J->base + q * J->s_q;
            for (Py_ssize_t j = 0; j < J->k; j++) {
                int64_t v = load_index(row + j * J->s_j, J->i32);
                if (scan_entry(J, q, j, v)) return ST_BAD;
            }
        }
    }
    return ST_OK;
}

static PyObject *scan_ranks(PyObject *self, PyObject *args)
{
    PyObject *o_ranks, *o_tables, *o_off, *o_pos, *o_code, *o_count;
    long long n_index;
    Py_ssize_t group_bytes = (Py_ssize_t)1 << 20, block_bytes = 0;
    if (!PyArg_ParseTuple(args, "OOLOOOO|nn", &o_ranks, &o_tables, &n_index, &o_off, &o_pos,
                          &o_code, &o_count, &group_bytes, &block_bytes))
        return NULL;
    /* Every size the loops trust is checked here: the bitsets take n_index / 8 bytes a query, so
     * n_index must be >= 0 and small enough for that product to fit in memory arithmetic. */
    if (n_index < 0 || n_index > ((long long)1 << 48)) {
        PyErr_Format(PyExc_ValueError, "_accel: n_index must be in 0 .. 2**48, got %lld", n_index);
        return NULL;
    }
    Py_buffer br, bt, bo, bp, bc, bn;
    if (get_2d(o_ranks, &br, "ranks") < 0) return NULL;
    int kind = fmt_kind(&br);
    if (kind != K_I64 && kind != K_I32) {
        PyBuffer_Release(&br);
        return PyLong_FromLong(ST_UNSUPPORTED);
    }
    Py_ssize_t nq = br.shape[0], k = br.shape[1];
    if (get_2d(o_tables, &bt, "tables") < 0) goto fail_r;
    if (fmt_kind(&bt) != K_U8 || bt.shape[0] != nq || bt.strides[1] != 1 ||
        bt.strides[0] != bt.shape[1]) {
        PyErr_SetString(PyExc_ValueError, "_accel: tables must be C-contiguous uint8 [nq, n_lab]");
        goto fail_t;
    }
    if (get_vec(o_off, &bo, K_I64, nq + 1, 0, "lab_off") < 0) goto fail_t;
    const int64_t *off = (const int64_t *)bo.buf;
    /* the output slots of query q are [off[q], off[q + 1]): a start of 0 and no decrease keep
     * every write (emit_label) inside out_pos / out_code, whose length is checked against off[nq] */
    if (off[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "_accel: lab_off must start at 0");
        goto fail_o;
    }
    for (Py_ssize_t q = 0; q < nq; q++) {
        if (off[q + 1] < off[q]) {
            PyErr_SetString(PyExc_ValueError, "_accel: lab_off must not decrease");
            goto fail_o;
        }
    }
    int64_t total = off[nq];
    if ((uint64_t)nq > (uint64_t)PY_SSIZE_T_MAX / 8 / ((uint64_t)(n_index + 63) / 64 + 1)) {
        PyErr_SetString(PyExc_ValueError, "_accel: n_queries x n_index too large");
        goto fail_o;
    }
    if (get_vec(o_pos, &bp, K_I64, total, 1, "out_pos") < 0) goto fail_o;
    if (get_vec(o_code, &bc, K_U8, total, 1, "out_code") < 0) goto fail_p;
    if (get_vec(o_count, &bn, K_I64, nq, 1, "out_count") < 0) goto fail_c;

    ranks_job J;
    J.base = (const char *)br.buf;
    J.s_q = br.strides[0];
    J.s_j = br.strides[1];
    J.nq = nq;
    J.k = k;
    J.i32 = kind == K_I32;
    J.tables = (const uint8_t *)bt.buf;
    J.n_lab = bt.shape[1];
    J.n_index = n_index;
    J.lab_off = off;
    J.out_pos = (int64_t *)bp.buf;
    J.out_code = (uint8_t *)bc.buf;
    J.out_count = (int64_t *)bn.buf;
    memset(J.out_count, 0, (size_t)nq * sizeof(int64_t));
    J.group_bytes = group_bytes;
    J.block_bytes = block_bytes;
    J.words = (Py_ssize_t)((n_index + 63) / 64);
    if (J.words < 1) J.words = 1;
    /* Blocked transpose: `block_bytes` (default 4 MiB, under 1 % of the R1M ranks array) of
     * uint32 runs, so many positions at a time. */
    uint32_t *tbuf = NULL;
    Py_ssize_t trows = 0;
    if (transpose_applies(&J)) {
        Py_ssize_t budget = block_bytes > 0 ? block_bytes : (Py_ssize_t)4 << 20;
        trows = budget / (Py_ssize_t)(4 * nq);
        if (trows < 1) trows = 1;
        if (trows > k) trows = k;
        tbuf = (uint32_t *)PyMem_RawMalloc((size_t)trows * (size_t)nq * sizeof(uint32_t));
        if (!tbuf) {
            PyErr_NoMemory();
            goto fail_n;
        }
    }
    /* PyMem_Raw*: traced by tracemalloc, usable without the GIL */
    void *seen_raw = NULL;
    J.seen = (uint64_t *)alloc_zeroed_huge((size_t)nq * (size_t)J.words * sizeof(uint64_t), &seen_raw);
    if (!J.seen) {
        PyMem_RawFree(tbuf);
        PyErr_NoMemory();
        goto fail_n;
    }
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = run_ranks(&J, tbuf, trows);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(seen_raw);
    PyMem_RawFree(tbuf);
    PyBuffer_Release(&bn);
    PyBuffer_Release(&bc);
    PyBuffer_Release(&bp);
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bt);
    PyBuffer_Release(&br);
    return PyLong_FromLong(st);

fail_n:
    PyBuffer_Release(&bn);
fail_c:
    PyBuffer_Release(&bc);
fail_p:
    PyBuffer_Release(&bp);
fail_o:
    PyBuffer_Release(&bo);
fail_t:
    PyBuffer_Release(&bt);
fail_r:
    PyBuffer_Release(&br);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Scores: per query the distinct labelled scores u_0 < ... < u_{d-1} (float64, exact for float32
 * and float64 input). Every score x gets the key 2t + e, t = #{u < x}, e = (x == u_t), counted in
 * cnt[q][key]; a monotone bin map (linear between the lowest and highest finite u) with a table
 * of the first u in each bin leaves only the u in x's own bin to compare. Events (row, q, key)
 * sorted in scan order snapshot cnt[q][key] just before their row is counted: #equal scores at a
 * lower index. The caller turns suffix sums of cnt plus the snapshots into ranks.
 */

/* Bins holding at most PAD labelled scores are resolved by PAD branch-free comparisons: the u
 * that follow a bin's own belong to higher bins (or are the +inf padding), so they compare false.
 * Fuller bins are flagged in the table and binary-searched. */
#define PAD 4
#define GMAX 64
#define BIG 0x80000000u

typedef struct {
    double lo, sc;
    const double *u; /* d values, then PAD x +inf */
    uint32_t d;
    uint32_t *start; /* n_bins + 1: #{u in lower bins}, BIG flag: more than PAD in this bin */
    int64_t *cnt;    /* 2 d + 1 */
    int32_t *hist;   /* n_bins: count of scores in a bin without labelled scores; < 0: has some */
} squery;

static inline uint32_t bin_of(double x, double lo, double sc, double top)
{
    double y = (x - lo) * sc;
    y = y > 0.0 ? y : 0.0; /* NaN -> 0 (refused separately) */
    y = y < top ? y : top;
    return (uint32_t)y;
}

static inline int64_t key_in_bin(const squery *Q, double x, uint32_t b)
{
    uint32_t t = Q->start[b];
    const double *u = Q->u;
    if (t & BIG) {
        uint32_t lo = t & ~BIG, hi = Q->start[b + 1] & ~BIG; /* first u >= x in [lo, hi) */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (u[mid] < x) lo = mid + 1; else hi = mid;
        }
        t = lo;
    } else {
        const double *v = u + t;
        t += (uint32_t)(v[0] < x) + (uint32_t)(v[1] < x) + (uint32_t)(v[2] < x) + (uint32_t)(v[3] < x);
    }
    return 2 * (int64_t)t + ((t < Q->d) & (u[t] == x)); /* the +inf padding is no u */
}

/* Most scores fall in bins without a labelled score: one counter per bin (folded into cnt at the
 * end, all of them share the key 2 * start[b]); the others are compared exactly. */
static inline void count_score(const squery *Q, double x, double top)
{
    uint32_t b = bin_of(x, Q->lo, Q->sc, top);
    int32_t h = Q->hist[b];
    if (h >= 0) {
        Q->hist[b] = h + 1;
    } else {
        Q->cnt[key_in_bin(Q, x, b)]++;
    }
}

typedef struct {
    const char *base;
    Py_ssize_t s_r, s_q, n, nq;
    int f32, row_outer;
    squery *Q;
    const int64_t *ev_row, *ev_q, *ev_key;
    int64_t *snap;
    Py_ssize_t n_ev;
    double top;
    uint32_t n_bins;
    Py_ssize_t group;
    Py_ssize_t *gp;
    int vec;
    int32_t **hp;    /* per query: its bin counters */
    double *lo, *sc; /* per query, copies of Q[q].lo / .sc (contiguous for vector loads) */
} scores_job;

static inline double load_score(const char *p, int f32)
{
    if (f32) {
        float x;
        memcpy(&x, p, 4);
        return (double)x;
    }
    double x;
    memcpy(&x, p, 8);
    return x;
}

static int run_scores(const scores_job *J)
{
    int nan = 0;
    const double top = J->top;
    Py_ssize_t p = 0;
    if (J->row_outer) {
        /* Rows outer (memory order) in blocks kept in cache, read once per group of G queries
         * whose bin counters stay in the nearest cache. Events sorted by (q / G, row, q). */
        Py_ssize_t G = J->group, ng = (J->nq + G - 1) / G;
        Py_ssize_t *gp = J->gp; /* per group: next event */
        Py_ssize_t e = 0;
        for (Py_ssize_t g = 0; g < ng; g++) {
            while (e < J->n_ev && J->ev_q[e] / G < g) e++;
            gp[g] = e;
        }
        Py_ssize_t ar = J->s_r < 0 ? -J->s_r : J->s_r;
        Py_ssize_t B = ((Py_ssize_t)1 << 19) / (ar > 0 ? ar : 1);
        if (B < 16) B = 16;
        for (Py_ssize_t r0 = 0; r0 < J->n; r0 += B) {
            Py_ssize_t r1 = r0 + B < J->n ? r0 + B : J->n;
            for (Py_ssize_t g = 0; g < ng; g++) {
                Py_ssize_t q0 = g * G, q1 = q0 + G < J->nq ? q0 + G : J->nq;
                p = gp[g];
                for (Py_ssize_t r = r0; r < r1; r++) {
                    while (p < J->n_ev && J->ev_row[p] == r && J->ev_q[p] / G == g) {
                        J->snap[p] = J->Q[J->ev_q[p]].cnt[J->ev_key[p]];
                        p++;
                    }
                    const char *row = J->base + r * J->s_r;
                    if (J->vec && J->f32 && J->s_q == 4 && q1 - q0 <= GMAX) {
                        /* contiguous float32 queries: the bin map vectorises */
                        const float *xr = (const float *)row + q0;
                        const double *lo = J->lo + q0, *sc = J->sc + q0;
                        uint32_t bins[GMAX];
                        int m = (int)(q1 - q0), nn = 0, i0 = 0;
#if defined(__SSE2__)
                        /* two queries at a time; the same IEEE operations as bin_of (maxpd
                         * puts 0 for NaN and -0.0, minpd caps at top), so the same bins */
                        const __m128d zero = _mm_setzero_pd(), vtop = _mm_set1_pd(top);
                        int bad = 0;
                        for (; i0 + 4 <= m; i0 += 4) {
                            __m128 x4 = _mm_loadu_ps(xr + i0);
                            bad |= _mm_movemask_ps(_mm_cmpunord_ps(x4, x4));
                            __m128d xa = _mm_cvtps_pd(x4);
                            __m128d xb = _mm_cvtps_pd(_mm_movehl_ps(x4, x4));
                            __m128d ya = _mm_mul_pd(_mm_sub_pd(xa, _mm_loadu_pd(lo + i0)), _mm_loadu_pd(sc + i0));
                            __m128d yb = _mm_mul_pd(_mm_sub_pd(xb, _mm_loadu_pd(lo + i0 + 2)), _mm_loadu_pd(sc + i0 + 2));
                            ya = _mm_min_pd(_mm_max_pd(ya, zero), vtop);
                            yb = _mm_min_pd(_mm_max_pd(yb, zero), vtop);
                            __m128i ba = _mm_cvttpd_epi32(ya), bb = _mm_cvttpd_epi32(yb);
                            _mm_storeu_si128((__m128i *)(bins + i0), _mm_unpacklo_epi64(ba, bb));
                        }
                        nn |= bad != 0;
#endif
                        for (int i = i0; i < m; i++) {
                            double x = (double)xr[i];
                            nn |= x != x;
                            bins[i] = bin_of(x, lo[i], sc[i], top);
                        }
                        nan |= nn;
                        /* (a query without labels has no marked bin: it just counts, unread) */
                        int32_t *const *hp = J->hp + q0;
                        for (int i = 0; i < m; i++) {
                            int32_t *hb = hp[i] + bins[i];
                            int32_t h = *hb;
                            if (h >= 0) {
                                *hb = h + 1;
                            } else {
                                const squery *Q = &J->Q[q0 + i];
                                Q->cnt[key_in_bin(Q, (double)xr[i], bins[i])]++;
                            }
                        }
                        continue;
                    }
                    for (Py_ssize_t q = q0; q < q1; q++) {
                        const squery *Q = &J->Q[q];
                        double x = load_score(row + q * J->s_q, J->f32);
                        nan |= x != x;
                        if (Q->d) count_score(Q, x, top);
                    }
                }
                gp[g] = p;
            }
        }
    } else {
        /* events sorted by (query, row) */
        for (Py_ssize_t q = 0; q < J->nq; q++) {
            const squery *Q = &J->Q[q];
            const char *col = J->base + q * J->s_q;
            if (Q->d == 0) {
                for (Py_ssize_t r = 0; r < J->n; r++) {
                    double x = load_score(col + r * J->s_r, J->f32);
                    nan |= x != x;
                }
                continue;
            }
            Py_ssize_t r = 0;
            for (;;) {
                Py_ssize_t stop = J->n;
                if (p < J->n_ev && J->ev_q[p] == q) stop = (Py_ssize_t)J->ev_row[p];
                for (; r < stop; r++) {
                    double x = load_score(col + r * J->s_r, J->f32);
                    nan |= x != x;
                    count_score(Q, x, top);
                }
                if (stop == J->n) break;
                while (p < J->n_ev && J->ev_q[p] == q && J->ev_row[p] == stop) {
                    J->snap[p] = Q->cnt[J->ev_key[p]];
                    p++;
                }
            }
        }
    }
    if (nan) return ST_BAD;
    for (Py_ssize_t q = 0; q < J->nq; q++) {
        const squery *Q = &J->Q[q];
        if (Q->d == 0) continue;
        for (uint32_t b = 0; b < J->n_bins; b++) {
            if (Q->hist[b] > 0) Q->cnt[2 * (int64_t)(Q->start[b] & ~BIG)] += Q->hist[b];
        }
    }
    return ST_OK;
}

static PyObject *score_ranks(PyObject *self, PyObject *args)
{
    PyObject *o_s, *o_u, *o_uoff, *o_evr, *o_evq, *o_evk, *o_snap, *o_cnt, *o_coff;
    int row_outer, n_bins;
    Py_ssize_t group;
    int vec = 1;
    if (!PyArg_ParseTuple(args, "OpOOOOOOOOin|p", &o_s, &row_outer, &o_u, &o_uoff, &o_evr, &o_evq,
                          &o_evk, &o_snap, &o_cnt, &o_coff, &n_bins, &group, &vec))
        return NULL;
    if (n_bins < 8 || group < 1) {
        PyErr_SetString(PyExc_ValueError, "_accel: n_bins must be >= 8 and group >= 1");
        return NULL;
    }
    Py_buffer bs, bu, buo, ber, beq, bek, bsn, bc, bco;
    if (get_2d(o_s, &bs, "scores") < 0) return NULL;
    int kind = fmt_kind(&bs);
    if (kind != K_F32 && kind != K_F64) {
        PyBuffer_Release(&bs);
        return PyLong_FromLong(ST_UNSUPPORTED);
    }
    Py_ssize_t n = bs.shape[0], nq = bs.shape[1];
    if (n >= (Py_ssize_t)INT32_MAX) { /* per-bin counters are int32 */
        PyBuffer_Release(&bs);
        return PyLong_FromLong(ST_UNSUPPORTED);
    }
    PyObject *result = NULL;
    squery *Q = NULL;
    uint32_t *starts = NULL;
    double *upad = NULL;
    int32_t *hists = NULL;
    Py_ssize_t *gp = NULL;
    double *losc = NULL;
    int32_t **hp = NULL;
    int have = 0;
    if (PyObject_GetBuffer(o_u, &bu, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    have = 1;
    if (get_vec(o_uoff, &buo, K_I64, nq + 1, 0, "u_off") < 0) goto done;
    have = 2;
    const int64_t *uoff = (const int64_t *)buo.buf;
    if (uoff[0] != 0) { /* with d >= 0 per query (checked below), u_off stays in [0, len(u)] */
        PyErr_SetString(PyExc_ValueError, "_accel: u_off must start at 0");
        goto done;
    }
    for (Py_ssize_t q = 0; q < nq; q++) {
        if (uoff[q + 1] < uoff[q]) {
            PyErr_SetString(PyExc_ValueError, "_accel: u_off must not decrease");
            goto done;
        }
    }
    if (fmt_kind(&bu) != K_F64 || bu.len / 8 < uoff[nq]) {
        PyErr_SetString(PyExc_ValueError, "_accel: bad buffer for u");
        goto done;
    }
    if (PyObject_GetBuffer(o_evr, &ber, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    have = 3;
    Py_ssize_t n_ev = ber.len / 8;
    if (fmt_kind(&ber) != K_I64) {
        PyErr_SetString(PyExc_ValueError, "_accel: bad buffer for ev_row");
        goto done;
    }
    if (get_vec(o_evq, &beq, K_I64, n_ev, 0, "ev_q") < 0) goto done;
    have = 4;
    if (get_vec(o_evk, &bek, K_I64, n_ev, 0, "ev_key") < 0) goto done;
    have = 5;
    if (get_vec(o_snap, &bsn, K_I64, n_ev, 1, "out_snap") < 0) goto done;
    have = 6;
    if (get_vec(o_coff, &bco, K_I64, nq + 1, 0, "cnt_off") < 0) goto done;
    have = 7;
    const int64_t *coff = (const int64_t *)bco.buf;
    if (coff[0] != 0) { /* each query's block is 2 d + 1 > 0 long (checked below): increasing */
        PyErr_SetString(PyExc_ValueError, "_accel: cnt_off must start at 0");
        goto done;
    }
    for (Py_ssize_t q = 0; q < nq; q++) {
        if (coff[q + 1] - coff[q] != 2 * (uoff[q + 1] - uoff[q]) + 1) {
            PyErr_SetString(PyExc_ValueError, "_accel: inconsistent offsets");
            goto done;
        }
    }
    if (n_bins > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "_accel: n_bins must be at most 2**24");
        goto done;
    }
    if (get_vec(o_cnt, &bc, K_I64, coff[nq], 1, "cnt") < 0) goto done;
    have = 8;

    Q = (squery *)PyMem_RawCalloc(nq ? (size_t)nq : 1, sizeof(squery));
    starts = (uint32_t *)PyMem_RawMalloc(((size_t)nq + 1) * ((size_t)n_bins + 1) * sizeof(uint32_t));
    upad = (double *)PyMem_RawMalloc(((size_t)uoff[nq] + (size_t)nq * PAD + 1) * sizeof(double));
    hists = (int32_t *)PyMem_RawCalloc(((size_t)nq + 1) * (size_t)n_bins, sizeof(int32_t));
    losc = (double *)PyMem_RawCalloc(2 * ((size_t)nq + 1), sizeof(double));
    hp = (int32_t **)PyMem_RawCalloc((size_t)nq + 1, sizeof(int32_t *));
    gp = (Py_ssize_t *)PyMem_RawMalloc(((size_t)nq / (size_t)group + 2) * sizeof(Py_ssize_t));
    if (!Q || !starts || !upad || !hists || !gp || !losc || !hp) {
        PyErr_NoMemory();
        goto done;
    }
    const double *u_all = (const double *)bu.buf;
    int64_t *cnt_all = (int64_t *)bc.buf;
    const int64_t *evq = (const int64_t *)beq.buf, *evk = (const int64_t *)bek.buf;
    for (Py_ssize_t i = 0; i < n_ev; i++) {
        Py_ssize_t q = (Py_ssize_t)evq[i];
        if (q < 0 || q >= nq || evk[i] < 0 || evk[i] >= coff[q + 1] - coff[q] ||
            ((const int64_t *)ber.buf)[i] < 0 || ((const int64_t *)ber.buf)[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "_accel: event out of range");
            goto done;
        }
    }
    double top = (double)n_bins - 1.0;
    for (Py_ssize_t q = 0; q < nq; q++) {
        squery *S = &Q[q];
        int64_t d = uoff[q + 1] - uoff[q];
        if (d < 0 || coff[q + 1] - coff[q] != 2 * d + 1 || d > (int64_t)0x7fffff00) {
            PyErr_SetString(PyExc_ValueError, "_accel: inconsistent offsets");
            goto done;
        }
        S->d = (uint32_t)d;
        double *uq = upad + uoff[q] + (int64_t)q * PAD;
        memcpy(uq, u_all + uoff[q], (size_t)d * sizeof(double));
        for (int i = 0; i < PAD; i++) uq[d + i] = HUGE_VAL;
        S->u = uq;
        S->cnt = cnt_all + coff[q];
        memset(S->cnt, 0, (size_t)(2 * d + 1) * sizeof(int64_t));
        S->start = starts + (size_t)q * ((size_t)n_bins + 1);
        /* the bin map: linear between the lowest and highest finite labelled score */
        double lo = 0.0, hi = 0.0;
        int any = 0;
        for (int64_t i = 1; i < d; i++) {
            if (!(S->u[i - 1] < S->u[i])) {
                PyErr_SetString(PyExc_ValueError, "_accel: u must be strictly increasing");
                goto done;
            }
        }
        for (int64_t i = 0; i < d; i++) {
            double v = S->u[i];
            if (v != v) {
                PyErr_SetString(PyExc_ValueError, "_accel: NaN in u");
                goto done;
            }
            if (v - v == 0.0) { /* finite */
                if (!any) lo = v;
                hi = v;
                any = 1;
            }
        }
        /* labelled scores in bins 2 .. n_bins - 3: scores below or above them all then fall in
         * bins without labels (the cheap path) instead of sharing the lowest/highest one */
        double sc = hi > lo ? (double)(n_bins - 4) / (hi - lo) : 1.0;
        double lo2 = lo - 2.0 / sc;
        if (!(sc - sc == 0.0) || !(sc > 0.0) || !(lo2 - lo2 == 0.0)) {
            sc = 1.0; /* overflow: any positive scale is exact, just slower */
            lo2 = lo;
        }
        S->lo = lo2;
        S->sc = sc;
        losc[q] = lo2;
        losc[nq + q] = sc;
        /* start[b] = #{u : bin(u) < b}; bins are monotone in the score */
        uint32_t t = 0;
        for (uint32_t b = 0; b <= (uint32_t)n_bins; b++) {
            while (t < S->d && bin_of(S->u[t], S->lo, S->sc, top) < b) t++;
            S->start[b] = t;
        }
        S->hist = hists + (size_t)q * (size_t)n_bins;
        hp[q] = S->hist;
        for (uint32_t b = 0; b < (uint32_t)n_bins; b++) {
            if (S->start[b + 1] > S->start[b]) S->hist[b] = INT32_MIN;
            if (S->start[b + 1] - S->start[b] > PAD) S->start[b] |= BIG;
        }
    }

    scores_job J;
    J.base = (const char *)bs.buf;
    J.s_r = bs.strides[0];
    J.s_q = bs.strides[1];
    J.n = n;
    J.nq = nq;
    J.f32 = kind == K_F32;
    J.row_outer = row_outer;
    J.Q = Q;
    J.ev_row = (const int64_t *)ber.buf;
    J.ev_q = evq;
    J.ev_key = evk;
    J.snap = (int64_t *)bsn.buf;
    J.n_ev = n_ev;
    J.top = top;
    J.n_bins = (uint32_t)n_bins;
    J.group = group;
    J.vec = vec;
    J.hp = hp;
    J.lo = losc;
    J.sc = losc + nq;
    J.gp = gp;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = run_scores(&J);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(st);

done:
    PyMem_RawFree(hp);
    PyMem_RawFree(losc);
    PyMem_RawFree(gp);
    PyMem_RawFree(hists);
    PyMem_RawFree(upad);
    PyMem_RawFree(starts);
    PyMem_RawFree(Q);
    if (have >= 8) PyBuffer_Release(&bc);
    if (have >= 7) PyBuffer_Release(&bco);
    if (have >= 6) PyBuffer_Release(&bsn);
    if (have >= 5) PyBuffer_Release(&bek);
    if (have >= 4) PyBuffer_Release(&beq);
    if (have >= 3) PyBuffer_Release(&ber);
    if (have >= 2) PyBuffer_Release(&buo);
    if (have >= 1) PyBuffer_Release(&bu);
    PyBuffer_Release(&bs);
    return result;
}

/* ------------------------------------------------------------------------------------------
 * ASMK: one query word's packed code against the word's posting list, in one pass:
 *   for i in 0 .. m-1:  h = sum_j popcount(codes[i, j] ^ query[j]);  scores[ids[i]] += weights[h]
 * with codes uint64 [m, k], ids uint32 [m] (< n_images), weights float64 [>= 64 k + 1] (the
 * selectivity table times the word's idf). The additions are numpy's np.add.at's, element by
 * element in list order, so the scores are the numpy path's to the bit. The ids are checked in a
 * first pass, so an anomaly leaves the scores untouched for the numpy rerun.
 */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define ASMK_MULTIVERSION 1
#endif

#define ASMK_LOOP                                                                               \
    do {                                                                                       \
        if (k == 2) {                                                                          \
            const uint64_t q0 = q[0], q1 = q[1];                                               \
            for (Py_ssize_t i = 0; i < m; i++) {                                               \
                int h = __builtin_popcountll(c[2 * i] ^ q0) +                                  \
                        __builtin_popcountll(c[2 * i + 1] ^ q1);                               \
                s[ids[i]] += w[h];                                                             \
            }                                                                                  \
        } else if (k == 1) {                                                                   \
            const uint64_t q0 = q[0];                                                          \
            for (Py_ssize_t i = 0; i < m; i++) s[ids[i]] += w[__builtin_popcountll(c[i] ^ q0)]; \
        } else {                                                                               \
            for (Py_ssize_t i = 0; i < m; i++) {                                               \
                const uint64_t *row = c + i * k;                                               \
                Py_ssize_t h = 0;                                                              \
                for (Py_ssize_t j = 0; j < k; j++) h += __builtin_popcountll(row[j] ^ q[j]);   \
                s[ids[i]] += w[h];                                                             \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static void asmk_loop_generic(double *s, const uint32_t *ids, const uint64_t *c, const uint64_t *q,
                              const double *w, Py_ssize_t m, Py_ssize_t k)
{
    ASMK_LOOP;
}

#ifdef ASMK_MULTIVERSION
/* The same loop with the POPCNT instruction (no -march flag at build time: chosen at run time). */
__attribute__((target("popcnt"))) static void
asmk_loop_popcnt(double *s, const uint32_t *ids, const uint64_t *c, const uint64_t *q,
                 const double *w, Py_ssize_t m, Py_ssize_t k)
{
    ASMK_LOOP;
}
#endif

static PyObject *asmk_scatter(PyObject *self, PyObject *args)
{
    PyObject *o[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    /* scores, ids, codes, query, weights; any buffer that is not C-contiguous, of another kind or
     * shape is ST_UNSUPPORTED (the numpy path runs instead) */
    static const int kinds[5] = {K_F64, K_U32, K_U64, K_U64, K_F64};
    static const int ndims[5] = {1, 1, 2, 1, 1};
    Py_buffer b[5];
    int have = 0, status = ST_UNSUPPORTED;
    for (; have < 5; have++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (have == 0 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o[have], &b[have], flags) < 0) {
            PyErr_Clear();
            goto done;
        }
        if (fmt_kind(&b[have]) != kinds[have] || b[have].ndim != ndims[have]) {
            have++;
            goto done;
        }
    }
    Py_ssize_t n = b[0].shape[0], m = b[1].shape[0], k = b[2].shape[1];
    if (b[2].shape[0] != m || k < 1 || b[3].shape[0] != k || b[4].shape[0] < 64 * k + 1)
        goto done;
    double *s = (double *)b[0].buf;
    const uint32_t *ids = (const uint32_t *)b[1].buf;
    const uint64_t *c = (const uint64_t *)b[2].buf, *q = (const uint64_t *)b[3].buf;
    const double *w = (const double *)b[4].buf;
    Py_BEGIN_ALLOW_THREADS
    uint32_t top = 0;
    for (Py_ssize_t i = 0; i < m; i++) top = ids[i] > top ? ids[i] : top;
    if (m && (Py_ssize_t)top >= n) {
        status = ST_BAD;
    } else {
#ifdef ASMK_MULTIVERSION
        if (__builtin_cpu_supports("popcnt"))
            asmk_loop_popcnt(s, ids, c, q, w, m, k);
        else
#endif
            asmk_loop_generic(s, ids, c, q, w, m, k);
        status = ST_OK;
    }
    Py_END_ALLOW_THREADS
done:
    while (have > 0) PyBuffer_Release(&b[--have]);
    return PyLong_FromLong(status);
}

/* ------------------------------------------------------------------------------------------
 * Bag of words: one weighted query against the compressed posting lists of its words
 * (oxbench.index.postings.CompressedPostings). For each query word j, in the order given:
 *   the word's ids, variable-byte gaps in code[offsets[w, 0] : offsets[w + 1, 0]] (7 bits a byte,
 *   low group first, high bit = more bytes; each list's ids from 0), and its weights
 *   weights[offsets[w, 1] : offsets[w + 1, 1]] (float32, or float16 widened exactly);
 *   scores[id] += query_weights[j] * weight   (float32 product, then float32 sum)
 * which are the numpy path's float32 products and np.add.at's additions, element by element in
 * the same order (words as given, each list in order): the same scores to the bit. Built with
 * -ffp-contract=off, so no product is fused into its sum. A list that does not decode to exactly
 * its count of ids below n (a value cut at the list's end, longer than 63 bits, a gap or an id past
 * the index) is ST_BAD; the scores then hold part of the sums (the caller reruns numpy from zeros).
 */
static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0) {
        if (m == 0) {
            bits = sign;
        } else { /* subnormal: m 2^-24, normalised */
            uint32_t shift = 0;
            while (!(m & 0x400u)) {
                m <<= 1;
                shift++;
            }
            bits = sign | ((113u - shift) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13); /* inf, NaN with its payload (as numpy) */
    } else {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define BOW_LIST(WEIGHT)                                                                         \
    do {                                                                                         \
        uint64_t id = 0;                                                                         \
        Py_ssize_t i = b0, k = p0;                                                               \
        while (i < b1) {                                                                         \
            uint64_t gap = 0;                                                                    \
            unsigned shift = 0;                                                                  \
            uint8_t byte;                                                                        \
            do {                                                                                 \
                if (i >= b1 || shift > 56) return ST_BAD;                                        \
                byte = c[i++];                                                                   \
                gap |= (uint64_t)(byte & 0x7fu) << shift;                                        \
                shift += 7;                                                                      \
            } while (byte & 0x80u);                                                              \
            if (k >= p1 || gap >= n) return ST_BAD;                                              \
            id += gap; /* both below n < 2^63: no wrap */                                        \
            if (id >= n) return ST_BAD;                                                          \
            s[id] += qv * (WEIGHT);                                                              \
            k++;                                                                                 \
        }                                                                                        \
        if (k != p1) return ST_BAD;                                                              \
    } while (0)

static int bow_lists(float *s, uint64_t n, const uint8_t *c, Py_ssize_t n_code, const void *wt,
                     int half, Py_ssize_t nnz, const int64_t *off, Py_ssize_t n_words,
                     const void *words, int words64, const float *qw, Py_ssize_t m)
{
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t w = words64 ? ((const int64_t *)words)[j] : ((const int32_t *)words)[j];
        if (w < 0 || w >= n_words) return ST_BAD;
        int64_t b0 = off[2 * w], p0 = off[2 * w + 1], b1 = off[2 * w + 2], p1 = off[2 * w + 3];
        if (b0 < 0 || b0 > b1 || b1 > n_code || p0 < 0 || p0 > p1 || p1 > nnz) return ST_BAD;
        const float qv = qw[j];
        if (half) {
            const uint16_t *wh = (const uint16_t *)wt;
            BOW_LIST(half_to_float(wh[k]));
        } else {
            const float *wf = (const float *)wt;
            BOW_LIST(wf[k]);
        }
    }
    return ST_OK;
}

static PyObject *bow_scatter(PyObject *self, PyObject *args)
{
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    /* scores, code, weights, offsets, words, query weights; a buffer that is not C-contiguous, of
     * another kind or shape is ST_UNSUPPORTED (the numpy path runs instead) */
    static const int ndims[6] = {1, 1, 1, 2, 1, 1};
    Py_buffer b[6];
    int have = 0, status = ST_UNSUPPORTED;
    for (; have < 6; have++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (have == 0 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o[have], &b[have], flags) < 0) {
            PyErr_Clear();
            goto done;
        }
        int kind = fmt_kind(&b[have]);
        int ok = b[have].ndim == ndims[have];
        switch (have) {
        case 0: case 5: ok = ok && kind == K_F32; break;
        case 1: ok = ok && kind == K_U8; break;
        case 2: ok = ok && (kind == K_F32 || kind == K_F16); break;
        case 3: ok = ok && kind == K_I64 && b[3].shape[1] == 2 && b[3].shape[0] >= 1; break;
        default: ok = ok && (kind == K_I64 || kind == K_I32); break;
        }
        if (!ok) {
            have++;
            goto done;
        }
    }
    if (b[5].shape[0] != b[4].shape[0]) goto done;
    {
        float *s = (float *)b[0].buf;
        uint64_t n = (uint64_t)b[0].shape[0];
        int half = fmt_kind(&b[2]) == K_F16, words64 = fmt_kind(&b[4]) == K_I64;
        Py_BEGIN_ALLOW_THREADS
        status = bow_lists(s, n, (const uint8_t *)b[1].buf, b[1].shape[0], b[2].buf, half,
                           b[2].shape[0], (const int64_t *)b[3].buf, b[3].shape[0] - 1, b[4].buf,
                           words64, (const float *)b[5].buf, b[4].shape[0]);
        Py_END_ALLOW_THREADS
    }
done:
    while (have > 0) PyBuffer_Release(&b[--have]);
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"scan_ranks", scan_ranks, METH_VARARGS,
     "scan_ranks(ranks, tables, n_index, lab_off, out_pos, out_code, out_count[, group_bytes, "
     "block_bytes]) -> status"},
    {"score_ranks", score_ranks, METH_VARARGS,
     "score_ranks(scores, row_outer, u, u_off, ev_row, ev_q, ev_key, out_snap, cnt, cnt_off, "
     "n_bins, group[, vec]) -> status"},
    {"asmk_scatter", asmk_scatter, METH_VARARGS,
     "asmk_scatter(scores, ids, codes, query, weights) -> status"},
    {"bow_scatter", bow_scatter, METH_VARARGS,
     "bow_scatter(scores, code, weights, offsets, words, query_weights) -> status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_accel",
    "Optional compiled kernels for oxbench.evaluation.kernels (numpy fallback).", -1, methods,
};

PyMODINIT_FUNC PyInit__accel(void)
{
    return PyModule_Create(&moduledef);
}
