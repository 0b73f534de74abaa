/* The engine's CPU kernels: paged attention read in place, fused residual + RMSNorm, RoPE and
 * SwiGLU (twins and reasons in llama_cpu.py).
 *
 * Activations and caches are fp32 (dtype 0) or bf16 (dtype 1); all math is fp32. Elementwise
 * kernels round where their torch twins round (built with -ffp-contract=off, so a*b - c*d is
 * two roundings as in eager torch); the attention's dot products use fmaf. Every parallel loop
 * is an OpenMP loop on the caller's torch team (see cbuild.py). */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;

/* Bits reinterpreted by memcpy, not a union: GCC vectorizes loops over the former only. */
static inline float f32_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t bits_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float bf16_load(uint16_t h) { return f32_bits((uint32_t)h << 16); }

/* Round to nearest even, NaN kept quiet: torch's float -> bfloat16 conversion. */
static inline uint16_t bf16_store(float f) {
    const uint32_t u = bits_f32(f), rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded); /* a select: loops vectorize */
}

static inline void load_row(const void *p, int dtype, i64 n, float *out) {
    if (dtype) {
        const uint16_t *h = (const uint16_t *)p;
        for (i64 i = 0; i < n; i++) out[i] = bf16_load(h[i]);
    } else {
        memcpy(out, p, (size_t)n * sizeof(float));
    }
}

static inline void store_row(void *p, int dtype, i64 n, const float *x) {
    if (dtype) {
        uint16_t *h = (uint16_t *)p;
        for (i64 i = 0; i < n; i++) h[i] = bf16_store(x[i]);
    } else {
        memcpy(p, x, (size_t)n * sizeof(float));
    }
}

/* Value as stored in `dtype` and read back (the rounding of an intermediate torch tensor). */
static inline float round_to(int dtype, float x) { return dtype ? bf16_load(bf16_store(x)) : x; }

/* e^x for x in [-87.3, 88.7] (clamped), branch-free so loops over it vectorize: x = n ln2 + r with
 * |r| <= ln2/2, e^r by its Taylor series to r^7 (truncation < 1e-8 relative: fp32 rounding,
 * a few 1e-8, dominates), 2^n by the exponent bits. */
static inline float exp_vec(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    float n = floorf(x * 1.44269504f + 0.5f);
    float r = (x - n * 0.693359375f) + n * 2.12194440e-4f; /* ln2 split in two for exactness */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * f32_bits((uint32_t)((int32_t)n + 127) << 23);
}

/* The cache block holding a row's positions [p0, p0 + *n) (*n <= bs), or -1 where its table
 * names none: the row's scores there are then -inf for its `heads` heads, and *bad is set. */
static inline i64 score_block(const int32_t *tab, i64 p0, i64 len, i64 bs, i64 num_blocks, i64 *n, float *sc,
                              i64 heads, int32_t *bad) {
    const i64 blk = tab[p0 / bs];
    *n = len - p0 < bs ? len - p0 : bs;
    if (blk >= 0 && blk < num_blocks) return blk;
    *bad = 1;
    for (i64 i = 0; i < heads; i++)
        for (i64 o = 0; o < *n; o++) sc[i * len + p0 + o] = -INFINITY;
    return -1;
}

/* s[p] <- exp(s[p] - max s) (-inf stays 0) over len scores; returns 1 / their sum, or 0 for an
 * empty row (a row with no position attends to nothing: output 0). */
static inline float softmax_numerators(float *s, i64 len) {
    float m = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : m)
    for (i64 p = 0; p < len; p++) m = s[p] > m ? s[p] : m;
    if (m == -INFINITY) m = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (i64 p = 0; p < len; p++) { s[p] = s[p] == -INFINITY ? 0.0f : exp_vec(s[p] - m); sum += s[p]; }
    return sum > 0.0f ? 1.0f / sum : 0.0f;
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
/* The row kernels below are written once over a vector of VW floats: AVX-512's 16 lanes where
 * the build has it, AVX2's 8 with FMA elsewhere (a CPU without AVX-512 would otherwise take the
 * generic loop for fp32). */
#if defined(__AVX512F__)
#define VW 16
#define V(op) _mm512_##op
typedef __m512 vec;
static inline vec v_load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline float v_sum(vec x) { return _mm512_reduce_add_ps(x); }
#else
#define VW 8
#define V(op) _mm256_##op
typedef __m256 vec;
static inline vec v_load_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline float v_sum(vec x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
#endif
static inline vec v_zero(void) { return V(setzero_ps)(); }
static inline vec v_set1(float x) { return V(set1_ps)(x); }
static inline vec v_load(const float *p) { return V(loadu_ps)(p); }
static inline void v_store(float *p, vec x) { V(storeu_ps)(p, x); }
static inline vec v_fma(vec a, vec b, vec c) { return V(fmadd_ps)(a, b, c); }
static inline vec v_mul(vec a, vec b) { return V(mul_ps)(a, b); }
#define MAX_NV (256 / VW) /* vectors in a head of d <= 256 */

/* The second half of the row kernels below: each head's scores sc[i] [len] to softmax
 * numerators, then out[i] = their weighted sum of the values over their sum, every block read
 * once, front to back, for all KV heads; bf16 values (bf16 = 1) widened to fp32, then fp32
 * FMAs. nv = d / VW vectors; hq <= 16, d <= 256. `bf16` is a constant at every call, so the
 * load's branch folds away when inlined. */
static inline __attribute__((always_inline)) void softmax_and_values(
    const void *vc, int bf16, const int32_t *tab, i64 len, i64 bs, i64 num_blocks, const i64 hkv, const i64 g,
    const i64 nv, float *sc, float *out) {
    const i64 hq = hkv * g, d = VW * nv, row_st = hkv * d;
    float inv[16];
    for (i64 i = 0; i < hq; i++) inv[i] = softmax_numerators(sc + i * len, len);
    vec acc[16][MAX_NV];
    for (i64 i = 0; i < hq; i++)
        for (i64 c = 0; c < nv; c++) acc[i][c] = v_zero();
    for (i64 p0 = 0; p0 < len; p0 += bs) {
        const i64 blk = tab[p0 / bs], n = len - p0 < bs ? len - p0 : bs;
        if (blk < 0 || blk >= num_blocks) continue; /* flagged by score_block */
        for (i64 o = 0; o < n; o++)
            for (i64 h = 0; h < hkv; h++) {
                const i64 at = (blk * bs + o) * row_st + h * d;
                vec vf[MAX_NV];
                for (i64 c = 0; c < nv; c++)
                    vf[c] = bf16 ? v_load_bf16((const uint16_t *)vc + at + VW * c) : v_load((const float *)vc + at + VW * c);
                for (i64 j = 0; j < g; j++) {
                    const vec w = v_set1(sc[(h * g + j) * len + p0 + o]);
                    for (i64 c = 0; c < nv; c++) acc[h * g + j][c] = v_fma(w, vf[c], acc[h * g + j][c]);
                }
            }
    }
    for (i64 i = 0; i < hq; i++) {
        const vec f = v_set1(inv[i]);
        for (i64 c = 0; c < nv; c++) v_store(out + i * d + VW * c, v_mul(acc[i][c], f));
    }
}

#define F32_ROW 1
/* One row of veil_paged_attention for fp32 q and caches, all its heads (the generic loop below
 * reads each block once per KV head and reduces one vector per score the compiler's way): a
 * block read once, front to back, for all KV heads; q·k by FMAs in fp32. nc = d / VW vectors;
 * hq <= 16 and d <= 256. Inlined per shape, so the loops over heads and vectors unroll for the
 * shapes in use. sc: [hq][len]; out: [hq][d] fp32. */
static inline __attribute__((always_inline)) void f32_row(
    const float *q, i64 q_sh, const float *kc, const float *vc, const int32_t *tab, i64 len, i64 bs,
    i64 num_blocks, float scale, const i64 hkv, const i64 g, const i64 nc, float *sc, float *out, int32_t *bad) {
    const i64 hq = hkv * g, d = VW * nc, row_st = hkv * d;
    for (i64 p0 = 0, n; p0 < len; p0 += bs) {
        const i64 blk = score_block(tab, p0, len, bs, num_blocks, &n, sc, hq, bad);
        if (blk < 0) continue;
        const float *kb = kc + blk * bs * row_st;
        for (i64 o = 0; o < n; o++)
            for (i64 h = 0; h < hkv; h++) {
                vec kv[MAX_NV];
                for (i64 c = 0; c < nc; c++) kv[c] = v_load(kb + o * row_st + h * d + VW * c);
                for (i64 j = 0; j < g; j++) {
                    const float *qi = q + (h * g + j) * q_sh;
                    vec acc = v_mul(v_load(qi), kv[0]);
                    for (i64 c = 1; c < nc; c++) acc = v_fma(v_load(qi + VW * c), kv[c], acc);
                    sc[(h * g + j) * len + p0 + o] = v_sum(acc) * scale;
                }
            }
    }
    softmax_and_values(vc, 0, tab, len, bs, num_blocks, hkv, g, nc, sc, out);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define BF16_ROW 1
/* f32_row for bf16 q and caches on AVX512-BF16 (the generic loop converts and reduces one
 * 64-element row at a time per head; see benchmarks/results/2026-11-27-cpu-engine-kernels for
 * what this path measures): q·k by vdpbf16ps (bf16 pairs multiplied exactly, summed in fp32),
 * the values as in f32_row. nc = d / 32 chunks of 32 bf16; hq <= 16 and d <= 256. */
static inline __attribute__((always_inline)) void bf16_row(
    const uint16_t *q, i64 q_sh, const uint16_t *kc, const uint16_t *vc, const int32_t *tab, i64 len, i64 bs,
    i64 num_blocks, float scale, const i64 hkv, const i64 g, const i64 nc, float *sc, float *out, int32_t *bad) {
    const i64 hq = hkv * g, d = 32 * nc, row_st = hkv * d;
    __m512bh qv[16][8];
    for (i64 i = 0; i < hq; i++)
        for (i64 c = 0; c < nc; c++) qv[i][c] = (__m512bh)_mm512_loadu_si512(q + i * q_sh + 32 * c);
    for (i64 p0 = 0, n; p0 < len; p0 += bs) {
        const i64 blk = score_block(tab, p0, len, bs, num_blocks, &n, sc, hq, bad);
        if (blk < 0) continue;
        const uint16_t *kb = kc + blk * bs * row_st;
        for (i64 o = 0; o < n; o++)
            for (i64 h = 0; h < hkv; h++) {
                __m512bh kv[8];
                for (i64 c = 0; c < nc; c++) kv[c] = (__m512bh)_mm512_loadu_si512(kb + o * row_st + h * d + 32 * c);
                for (i64 j = 0; j < g; j++) {
                    __m512 acc = _mm512_setzero_ps();
                    for (i64 c = 0; c < nc; c++) acc = _mm512_dpbf16_ps(acc, qv[h * g + j][c], kv[c]);
                    sc[(h * g + j) * len + p0 + o] = _mm512_reduce_add_ps(acc) * scale;
                }
            }
    }
    softmax_and_values(vc, 1, tab, len, bs, num_blocks, hkv, g, d / VW, sc, out);
}
#endif

/* One KV head h of one row, any dtype and shape: the G query heads' scores against each key
 * row converted to fp32, the softmax, the weighted values. qf: [G][d] scratch; sc: [G][len];
 * row: [d]; out: [G][d] fp32. */
static void generic_head(const char *q, i64 q_sh, int q_dtype, const char *kc, const char *vc, int kv_dtype,
                         const int32_t *tab, i64 len, i64 bs, i64 num_blocks, float scale, i64 hkv, i64 h, i64 g,
                         i64 d, float *qf, float *sc, float *row, float *out, int32_t *bad) {
    const size_t esz = kv_dtype ? 2 : 4, qsz = q_dtype ? 2 : 4;
    for (i64 j = 0; j < g; j++) {
        load_row(q + (h * g + j) * q_sh * qsz, q_dtype, d, qf + j * d);
        for (i64 e = 0; e < d; e++) qf[j * d + e] *= scale;
    }
    for (i64 p0 = 0, n; p0 < len; p0 += bs) {
        const i64 blk = score_block(tab, p0, len, bs, num_blocks, &n, sc, g, bad);
        if (blk < 0) continue;
        const char *kb = kc + ((blk * bs * hkv + h) * d) * esz;
        for (i64 o = 0; o < n; o++) {
            load_row(kb + o * hkv * d * esz, kv_dtype, d, row);
            for (i64 j = 0; j < g; j++) {
                const float *qj = qf + j * d;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (i64 e = 0; e < d; e++) dot = fmaf(qj[e], row[e], dot);
                sc[j * len + p0 + o] = dot;
            }
        }
    }
    float inv[64];
    for (i64 j = 0; j < g; j++) inv[j] = softmax_numerators(sc + j * len, len);
    memset(out, 0, sizeof(float) * (size_t)(g * d));
    for (i64 p0 = 0; p0 < len; p0 += bs) {
        const i64 blk = tab[p0 / bs], n = len - p0 < bs ? len - p0 : bs;
        if (blk < 0 || blk >= num_blocks) continue; /* flagged by score_block */
        const char *vb = vc + ((blk * bs * hkv + h) * d) * esz;
        for (i64 o = 0; o < n; o++) {
            load_row(vb + o * hkv * d * esz, kv_dtype, d, row);
            for (i64 j = 0; j < g; j++) {
                const float w = sc[j * len + p0 + o];
                float *oj = out + j * d;
#pragma omp simd
                for (i64 e = 0; e < d; e++) oj[e] = fmaf(w, row[e], oj[e]);
            }
        }
    }
    for (i64 j = 0; j < g; j++)
        for (i64 e = 0; e < d; e++) out[j * d + e] *= inv[j];
}

/* Attention of query rows over their sequences' paged caches, read in place (no gathered copy).
 * Row t attends positions [0, row_len[t]) of table row row_table[t] (identity when NULL).
 * q: [T, Hq, D] with strides (q_st, q_sh), last dim contiguous; caches [blocks, bs, Hkv, D]
 * contiguous; tables [*, table_width] int32 with row stride table_stride; out [T, Hq, D]
 * contiguous in q's dtype. A row with no position gets zeros. Returns 0; 2 (before any work)
 * if a row's length is negative or past its table; 1 if a table entry a row reads lies outside
 * [0, num_blocks) (skipped; the output is then not to be used). One work item per row, its KV
 * heads together: a block's heads lie side by side, so one pass reads the block front to back
 * where an item per (row, head) would come back to the same memory once per head. */
int veil_paged_attention(void *out, const void *q, i64 q_st, i64 q_sh, int q_dtype, const void *kc,
                         const void *vc, int kv_dtype, const int32_t *tables, i64 table_stride, i64 table_width,
                         const int32_t *row_table, const int32_t *row_len, i64 rows, i64 hq, i64 hkv, i64 d,
                         i64 bs, i64 num_blocks, float scale) {
    const i64 g = hq / hkv;
    const size_t qsz = q_dtype ? 2 : 4;
    i64 max_len = 0;
    for (i64 t = 0; t < rows; t++) {
        if (row_len[t] < 0 || row_len[t] > table_width * bs) return 2;
        max_len = row_len[t] > max_len ? row_len[t] : max_len;
    }
    int32_t bad = 0;
#pragma omp parallel reduction(| : bad)
    {
        float *sc = malloc(sizeof(float) * (size_t)(hq * (max_len + 1) + 2 * hq * d + d));
        float *qf = sc + hq * (max_len + 1), *acc = qf + hq * d, *row = acc + hq * d;
#pragma omp for schedule(dynamic, 1)
        for (i64 t = 0; t < rows; t++) {
            const i64 len = row_len[t];
            const int32_t *tab = tables + (row_table ? row_table[t] : t) * table_stride;
            const char *qt = (const char *)q + t * q_st * qsz;
#ifdef BF16_ROW
            if (q_dtype == 1 && kv_dtype == 1 && d % 32 == 0 && d <= 256 && hq <= 16) {
                if (hkv == 3 && g == 3 && d == 64) /* SmolLM2-135M's heads: loops unrolled */
                    bf16_row((const uint16_t *)qt, q_sh, kc, vc, tab, len, bs, num_blocks, scale, 3, 3, 2, sc, acc, &bad);
                else
                    bf16_row((const uint16_t *)qt, q_sh, kc, vc, tab, len, bs, num_blocks, scale, hkv, g, d / 32, sc,
                             acc, &bad);
                store_row((char *)out + t * hq * d * qsz, 1, hq * d, acc);
                continue;
            }
#endif
#ifdef F32_ROW
            if (q_dtype == 0 && kv_dtype == 0 && d % VW == 0 && d <= 256 && hq <= 16) {
                if (hkv == 3 && g == 3 && d == 64) /* SmolLM2-135M's heads: loops unrolled */
                    f32_row((const float *)qt, q_sh, kc, vc, tab, len, bs, num_blocks, scale, 3, 3, 64 / VW, sc, acc,
                            &bad);
                else
                    f32_row((const float *)qt, q_sh, kc, vc, tab, len, bs, num_blocks, scale, hkv, g, d / VW, sc, acc,
                            &bad);
                store_row((char *)out + t * hq * d * qsz, 0, hq * d, acc);
                continue;
            }
#endif
            for (i64 h = 0; h < hkv; h++) {
                generic_head(qt, q_sh, q_dtype, kc, vc, kv_dtype, tab, len, bs, num_blocks, scale, hkv, h, g, d, qf,
                             sc, row, acc, &bad);
                store_row((char *)out + (t * hq + h * g) * d * qsz, q_dtype, g * d, acc);
            }
        }
        free(sc);
    }
    return bad;
}

/* residual' = x + residual (rounded to the dtype), normed = round(round(r' * rstd) * w), rstd =
 * 1 / sqrt(mean(r'^2) + eps) in fp32: add_rms_norm_torch's roundings. res NULL: plain RMSNorm
 * (new_res unused). Rows contiguous in their last dim, strides in elements; w contiguous. */
void veil_add_rms_norm(void *normed, void *new_res, const void *x, i64 x_st, const void *res, i64 r_st,
                       const void *w, int w_dtype, int dtype, i64 rows, i64 hidden, float eps) {
    const size_t sz = dtype ? 2 : 4, wsz = w_dtype ? 2 : 4;
#pragma omp parallel
    {
        float *a = malloc(sizeof(float) * (size_t)(3 * hidden)), *b = a + hidden, *wf = b + hidden;
        load_row(w, w_dtype, hidden, wf);
        (void)wsz;
#pragma omp for schedule(static)
        for (i64 t = 0; t < rows; t++) {
            load_row((const char *)x + t * x_st * sz, dtype, hidden, a);
            if (res) {
                load_row((const char *)res + t * r_st * sz, dtype, hidden, b);
                for (i64 e = 0; e < hidden; e++) a[e] = round_to(dtype, a[e] + b[e]);
                store_row((char *)new_res + t * hidden * sz, dtype, hidden, a);
            }
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (i64 e = 0; e < hidden; e++) ss += a[e] * a[e];
            const float rstd = 1.0f / sqrtf(ss / (float)hidden + eps);
            for (i64 e = 0; e < hidden; e++) a[e] = round_to(dtype, a[e] * rstd) * wf[e];
            store_row((char *)normed + t * hidden * sz, dtype, hidden, a);
        }
        free(a);
    }
}

/* RoPE in place, rotate-half convention, on q [T, Hq, D] and k [T, Hkv, D] (strides in
 * elements, last dim contiguous); cos, sin [*, D/2] fp32 contiguous; positions int64. */
void veil_rope(void *q, i64 q_st, i64 q_sh, i64 hq, void *k, i64 k_st, i64 k_sh, i64 hk, int dtype,
               const int64_t *positions, const float *cos_t, const float *sin_t, i64 rows, i64 d) {
    const i64 half = d / 2;
    const size_t sz = dtype ? 2 : 4;
#pragma omp parallel
    {
        float *x = malloc(sizeof(float) * (size_t)(2 * d)), *y = x + d;
#pragma omp for schedule(static)
        for (i64 t = 0; t < rows; t++) {
            const float *c = cos_t + positions[t] * half, *s = sin_t + positions[t] * half;
            for (i64 h = 0; h < hq + hk; h++) {
                char *p = h < hq ? (char *)q + (t * q_st + h * q_sh) * sz
                                 : (char *)k + (t * k_st + (h - hq) * k_sh) * sz;
                load_row(p, dtype, d, x);
                for (i64 e = 0; e < half; e++) {
                    const float lo = x[e], hi = x[e + half];
                    y[e] = lo * c[e] - hi * s[e];
                    y[e + half] = hi * c[e] + lo * s[e];
                }
                store_row(p, dtype, d, y);
            }
        }
        free(x);
    }
}

/* out [T, I] = round(silu(gate)) * up from x [T, 2I] (gate then up; row stride x_st): SiLU
 * in fp32 rounded to the dtype, then the product rounded (silu_and_mul_torch's roundings). */
void veil_silu_and_mul(void *out, const void *x, i64 x_st, int dtype, i64 rows, i64 inter) {
    const size_t sz = dtype ? 2 : 4;
#pragma omp parallel
    {
        float *a = malloc(sizeof(float) * (size_t)(3 * inter)), *b = a + 2 * inter;
#pragma omp for schedule(static)
        for (i64 t = 0; t < rows; t++) {
            load_row((const char *)x + t * x_st * sz, dtype, 2 * inter, a);
            for (i64 e = 0; e < inter; e++) b[e] = a[e] / (1.0f + exp_vec(-a[e]));
            for (i64 e = 0; e < inter; e++) b[e] = round_to(dtype, b[e]) * a[inter + e];
            store_row((char *)out + t * inter * sz, dtype, inter, b);
        }
        free(a);
    }
}

/* cache[slot] = kv[t] for the K and V rows of every token with slot >= 0 (slot = block * bs +
 * offset, caches [blocks * bs, Hkv, D] contiguous, kv [T, Hkv, D] with row stride kv_st and
 * contiguous heads); rows of one dtype, copied as bytes. Returns the number of slots past the
 * cache; if there are any, nothing is written. */
int veil_store_kv(void *kc, void *vc, const void *k, i64 k_st, const void *v, i64 v_st, const int64_t *slots,
                  i64 rows, i64 row_bytes, int esz, i64 num_slots) {
    int n_bad = 0;
    for (i64 t = 0; t < rows; t++) n_bad += slots[t] >= num_slots;
    if (n_bad) return n_bad; /* nothing written */
    for (i64 t = 0; t < rows; t++) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        memcpy((char *)kc + slot * row_bytes, (const char *)k + t * k_st * esz, (size_t)row_bytes);
        memcpy((char *)vc + slot * row_bytes, (const char *)v + t * v_st * esz, (size_t)row_bytes);
    }
    return 0;
}
