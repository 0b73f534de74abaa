/* The native CKKS backend's CPU kernels on int64 residues [..., L, N] (canonical: [0, q)).
 *
 * veil_ntt_rows: the negacyclic NTT / INTT of veil.crypto.native.ntt (SEAL's network: Cooley-Tukey
 * forward with psi^brev(k), Gentleman-Sande inverse with psi^-brev(k) and 1/N folded into the last
 * stage), one row at a time, all stages in place. Why C: the torch twin makes one pass over the
 * whole [B, L, N] array per stage, and a 16,384-point limb (128 KB) no longer sits in L1 between
 * passes; here a row stays in cache across its 14 stages.
 *
 * veil_add_mod, veil_sub_mul, veil_gather: a ciphertext addition, the rescale's and ModDown's
 * tail, an automorphism, each in one pass.
 *
 * veil_mac: sum_k a_k * w_k mod q, the products summed exactly in 128 bits and reduced once per
 * output: dot_plain's ct x pt sums (twin ckks_ops.mac_torch) and the key inner product of a key
 * switch or of a hoisted set's keys (twin rns._key_inner, key by key), in AVX-512 registers
 * where the CPU has IFMA (below).
 *
 * Products: Shoup's, with wp = floor(w * 2^64 / q): for any 64-bit a,
 * a*w - mulhi(a, wp)*q lies in [0, 2q). Lazy bounds (Harvey): forward values stay in [0, 4q),
 * inverse values in [0, 2q); both need 4q < 2^64, i.e. q < 2^62 (the loader checks it).
 *
 * AVX-512 (x86 CPUs with IFMA and DQ, chosen at run time; VEIL_CPU_IFMA=0 turns it off): the
 * butterflies run 8 lanes at a time, on 52-bit multiplies for primes below 2^50 (the chain's
 * 36-bit primes: Shoup with wp52 = floor(w * 2^52 / q), lazy values < 4q < 2^52 fit the
 * multiplier) and on 64-bit products built from 32-bit ones for the others (q0, q1, p); the
 * stages with fewer than 8 butterflies per twiddle permute 16 values into lanes first. Same
 * network, same lazy ranges, the same canonical output bit for bit. The multiply-accumulate sums
 * 52-bit product halves for primes below 2^50 and three 52-bit columns of split operands for
 * those up to 2^60 (mac_block_wide: 2x the scalar 128-bit sum on the 55/57-bit primes); (x - r)
 * * c takes the 52-bit lanes for primes below 2^50 only.
 *
 * Table of one prime, n = ring degree (veil_ntt_table fills it from w and winv):
 *   [0, n) w, [n, 2n) wp, [2n, 3n) winv, [3n, 4n) winvp, [4n, 5n) wp52, [5n, 6n) winvp52,
 *   then lo, lop, hi, hip, lop52, hip52
 * where lo = n^-1 and hi = psi^-brev(1) * n^-1 (the last inverse stage's constants); the
 * 52-bit quotients are 0 for primes of 2^50 or more (never read).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

static inline uint64_t mulhi(uint64_t a, uint64_t b) { return (uint64_t)(((u128)a * b) >> 64); }

/* a*w mod q in [0, 2q) for any 64-bit a. */
static inline uint64_t mul_shoup(uint64_t a, uint64_t w, uint64_t wp, uint64_t q) {
    return a * w - mulhi(a, wp) * q;
}

static inline uint64_t shoup(uint64_t w, uint64_t q) { return (uint64_t)(((u128)w << 64) / q); }

#define IFMA_MAX_Q (1ULL << 50) /* lazy values < 4q < 2^52 */

static inline uint64_t shoup52(uint64_t w, uint64_t q) {
    return q < IFMA_MAX_Q ? (uint64_t)(((u128)w << 52) / q) : 0;
}

void veil_ntt_table(uint64_t *tab, const uint64_t *w, const uint64_t *winv, int64_t n, uint64_t q,
                    uint64_t lo, uint64_t hi) {
    for (int64_t i = 0; i < n; i++) {
        tab[i] = w[i];
        tab[n + i] = shoup(w[i], q);
        tab[2 * n + i] = winv[i];
        tab[3 * n + i] = shoup(winv[i], q);
        tab[4 * n + i] = shoup52(w[i], q);
        tab[5 * n + i] = shoup52(winv[i], q);
    }
    uint64_t *c = tab + 6 * n;
    c[0] = lo;
    c[1] = shoup(lo, q);
    c[2] = hi;
    c[3] = shoup(hi, q);
    c[4] = shoup52(lo, q);
    c[5] = shoup52(hi, q);
}

/* (-q, q) -> [0, q) */
static inline uint64_t lift(int64_t x, uint64_t q) { return (uint64_t)x + (x < 0 ? q : 0); }

/* One twiddle's group of t Cooley-Tukey butterflies (forward; values in [0, 4q)). */
static inline void forward_group(uint64_t *u, uint64_t *v, int64_t t, uint64_t W, uint64_t Wp, uint64_t q) {
    const uint64_t two_q = 2 * q;
    for (int64_t j = 0; j < t; j++) {
        uint64_t U = u[j];
        U -= (U >= two_q) ? two_q : 0;
        const uint64_t V = mul_shoup(v[j], W, Wp, q);
        u[j] = U + V;
        v[j] = U - V + two_q;
    }
}

/* One twiddle's group of t Gentleman-Sande butterflies (inverse; values in [0, 2q)). */
static inline void inverse_group(uint64_t *u, uint64_t *v, int64_t t, uint64_t W, uint64_t Wp, uint64_t q) {
    const uint64_t two_q = 2 * q;
    for (int64_t j = 0; j < t; j++) {
        const uint64_t U = u[j], V = v[j];
        uint64_t s = U + V;
        s -= (s >= two_q) ? two_q : 0;
        u[j] = s;
        v[j] = mul_shoup(U - V + two_q, W, Wp, q);
    }
}

static void forward_row(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const uint64_t *w = tab, *wp = tab + n;
    const uint64_t two_q = 2 * q;
    for (int64_t j = 0; j < n; j++) a[j] = lift(x[j], q);
    for (int64_t m = 1, t = n >> 1; m < n; m <<= 1, t >>= 1)
        for (int64_t i = 0; i < m; i++) forward_group(a + 2 * i * t, a + 2 * i * t + t, t, w[m + i], wp[m + i], q);
    for (int64_t j = 0; j < n; j++) {
        uint64_t r = a[j];
        r -= (r >= two_q) ? two_q : 0;
        a[j] = r - ((r >= q) ? q : 0);
    }
}

static void inverse_row(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const uint64_t *w = tab + 2 * n, *wp = tab + 3 * n;
    const uint64_t lo = tab[6 * n], lop = tab[6 * n + 1], hi = tab[6 * n + 2], hip = tab[6 * n + 3];
    const uint64_t two_q = 2 * q;
    for (int64_t j = 0; j < n; j++) a[j] = lift(x[j], q);
    int64_t t = 1;
    for (int64_t m = n >> 1; m > 1; m >>= 1, t <<= 1)
        for (int64_t i = 0; i < m; i++) inverse_group(a + 2 * i * t, a + 2 * i * t + t, t, w[m + i], wp[m + i], q);
    uint64_t *u = a, *v = a + t;  /* the last stage: one group of half-size n/2 */
    for (int64_t j = 0; j < t; j++) {
        const uint64_t U = u[j], V = v[j];
        uint64_t s = mul_shoup(U + V, lo, lop, q), d = mul_shoup(U - V + two_q, hi, hip, q);
        u[j] = s - ((s >= q) ? q : 0);
        v[j] = d - ((d >= q) ? q : 0);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define IFMA __attribute__((target("avx512f,avx512dq,avx512ifma")))

/* a*w mod q in [0, 2q) per lane, for a < 2^52 and q < 2^50: the true a*w - quo*q lies in
 * [0, 2q), so the difference of the products' low 52 bits, taken mod 2^52, is exact. */
IFMA static inline __m512i mul_shoup52(__m512i a, __m512i w, __m512i wp, __m512i q) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i quo = _mm512_madd52hi_epu64(zero, a, wp);
    const __m512i r = _mm512_sub_epi64(_mm512_madd52lo_epu64(zero, a, w), _mm512_madd52lo_epu64(zero, quo, q));
    return _mm512_and_si512(r, _mm512_set1_epi64((1LL << 52) - 1));
}

/* The high 64 bits of a*b per lane, from four 32x32-bit products. */
IFMA static inline __m512i mulhi64(__m512i a, __m512i b) {
    const __m512i lo32 = _mm512_set1_epi64(0xffffffffLL);
    const __m512i ah = _mm512_srli_epi64(a, 32), bh = _mm512_srli_epi64(b, 32);
    const __m512i ll = _mm512_mul_epu32(a, b), lh = _mm512_mul_epu32(a, bh);
    const __m512i hl = _mm512_mul_epu32(ah, b), hh = _mm512_mul_epu32(ah, bh);
    const __m512i mid = _mm512_add_epi64(_mm512_srli_epi64(ll, 32),
                                         _mm512_add_epi64(_mm512_and_si512(lh, lo32), _mm512_and_si512(hl, lo32)));
    return _mm512_add_epi64(_mm512_add_epi64(hh, _mm512_srli_epi64(mid, 32)),
                            _mm512_add_epi64(_mm512_srli_epi64(lh, 32), _mm512_srli_epi64(hl, 32)));
}

/* a*w mod q in [0, 2q) per lane for any 64-bit a and q < 2^62 (Shoup's wp = floor(w*2^64/q)):
 * the scalar mul_shoup, 8 lanes at a time. */
IFMA static inline __m512i mul_shoup64(__m512i a, __m512i w, __m512i wp, __m512i q) {
    return _mm512_sub_epi64(_mm512_mullo_epi64(a, w), _mm512_mullo_epi64(mulhi64(a, wp), q));
}

/* The butterflies' product: 52-bit for primes below 2^50 (a < 4q < 2^52), else 64-bit. */
IFMA static inline __m512i vmul_shoup(__m512i a, __m512i w, __m512i wp, __m512i q, int wide) {
    return wide ? mul_shoup64(a, w, wp, q) : mul_shoup52(a, w, wp, q);
}

/* x - m where x >= m (unsigned): x < 2m in, [0, m) out */
IFMA static inline __m512i sub_if_ge(__m512i x, __m512i m) { return _mm512_min_epu64(x, _mm512_sub_epi64(x, m)); }

/* Eight butterflies in lanes: forward (Cooley-Tukey, values in [0, 4q)) or inverse
 * (Gentleman-Sande, values in [0, 2q)), the scalar forward_group / inverse_group's arithmetic. */
IFMA static inline void butterflies(__m512i *u, __m512i *v, __m512i W, __m512i Wp, __m512i Q, __m512i Q2, int wide,
                                    int inverse) {
    const __m512i U = *u, V = *v;
    if (inverse) {
        *u = sub_if_ge(_mm512_add_epi64(U, V), Q2);
        *v = vmul_shoup(_mm512_add_epi64(_mm512_sub_epi64(U, V), Q2), W, Wp, Q, wide);
    } else {
        const __m512i Ur = sub_if_ge(U, Q2), Vw = vmul_shoup(V, W, Wp, Q, wide);
        *u = _mm512_add_epi64(Ur, Vw);
        *v = _mm512_add_epi64(_mm512_sub_epi64(Ur, Vw), Q2);
    }
}

/* The stages with t < 8 butterflies per twiddle (t = 4, 2, 1; the last three forward, the
 * first three inverse): 16 consecutive values hold 16 / (2t) whole groups, and two permutes
 * gather their butterflies' halves into U and V (lane l: group l / t, element l % t), each lane
 * with its group's twiddle; two more put the results back. Same butterflies, same values. */
typedef struct { __m512i u, v, a, b, w; } SmallStage;

IFMA static SmallStage small_stage(int64_t t) {
    int64_t iu[8], iv[8], ia[8], ib[8], iw[8];
    for (int64_t l = 0; l < 8; l++) {
        iu[l] = 2 * t * (l / t) + l % t;
        iv[l] = iu[l] + t;
        iw[l] = l / t;
    }
    for (int64_t e = 0; e < 16; e++) { /* where value e comes back from: U lane, or V lane (+8) */
        const int64_t g = e / (2 * t), r = e % (2 * t);
        (e < 8 ? ia : ib)[e % 8] = r < t ? g * t + r : 8 + g * t + r - t;
    }
    SmallStage st = {_mm512_loadu_si512(iu), _mm512_loadu_si512(iv), _mm512_loadu_si512(ia),
                     _mm512_loadu_si512(ib), _mm512_loadu_si512(iw)};
    return st;
}

/* One stage of m groups of t butterflies over a row, forward or inverse, twiddles w[m + group]
 * with quotients wp: a twiddle per group of 8 or more lanes, else the permuted small stage. */
IFMA static void stage_row(uint64_t *a, int64_t n, int64_t t, int64_t m, const uint64_t *w, const uint64_t *wp,
                           __m512i Q, __m512i Q2, int wide, int inverse) {
    if (t >= 8) {
        for (int64_t i = 0; i < m; i++) {
            uint64_t *u = a + 2 * i * t, *v = u + t;
            const __m512i W = _mm512_set1_epi64((int64_t)w[m + i]), Wp = _mm512_set1_epi64((int64_t)wp[m + i]);
            for (int64_t j = 0; j < t; j += 8) {
                __m512i U = _mm512_loadu_si512(u + j), V = _mm512_loadu_si512(v + j);
                butterflies(&U, &V, W, Wp, Q, Q2, wide, inverse);
                _mm512_storeu_si512(u + j, U);
                _mm512_storeu_si512(v + j, V);
            }
        }
        return;
    }
    const SmallStage st = small_stage(t);
    for (int64_t base = 0; base < n; base += 16) {
        const __m512i A = _mm512_loadu_si512(a + base), B = _mm512_loadu_si512(a + base + 8);
        __m512i u = _mm512_permutex2var_epi64(A, st.u, B), v = _mm512_permutex2var_epi64(A, st.v, B);
        const int64_t first = m + base / (2 * t); /* reads up to first + 7 < n: this table's twiddles */
        butterflies(&u, &v, _mm512_permutexvar_epi64(st.w, _mm512_loadu_si512(w + first)),
                    _mm512_permutexvar_epi64(st.w, _mm512_loadu_si512(wp + first)), Q, Q2, wide, inverse);
        _mm512_storeu_si512(a + base, _mm512_permutex2var_epi64(u, st.a, v));
        _mm512_storeu_si512(a + base + 8, _mm512_permutex2var_epi64(u, st.b, v));
    }
}

IFMA static void forward_row_ifma(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const int wide = q >= IFMA_MAX_Q;
    const uint64_t *w = tab, *wp = tab + n, *wpv = wide ? wp : tab + 4 * n;
    const uint64_t two_q = 2 * q;
    const __m512i Q = _mm512_set1_epi64((int64_t)q), Q2 = _mm512_set1_epi64((int64_t)two_q);
    for (int64_t j = 0; j < n; j++) a[j] = lift(x[j], q);
    for (int64_t m = 1, t = n >> 1; m < n; m <<= 1, t >>= 1) stage_row(a, n, t, m, w, wpv, Q, Q2, wide, 0);
    for (int64_t j = 0; j < n; j += 8) {
        const __m512i r = sub_if_ge(_mm512_loadu_si512(a + j), Q2);
        _mm512_storeu_si512(a + j, sub_if_ge(r, Q));
    }
}

IFMA static void inverse_row_ifma(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const int wide = q >= IFMA_MAX_Q;
    const uint64_t *w = tab + 2 * n, *wp = tab + 3 * n, *wpv = wide ? wp : tab + 5 * n, *c = tab + 6 * n;
    const uint64_t two_q = 2 * q;
    const __m512i Q = _mm512_set1_epi64((int64_t)q), Q2 = _mm512_set1_epi64((int64_t)two_q);
    for (int64_t j = 0; j < n; j++) a[j] = lift(x[j], q);
    int64_t t = 1;
    for (int64_t m = n >> 1; m > 1; m >>= 1, t <<= 1) stage_row(a, n, t, m, w, wpv, Q, Q2, wide, 1);
    const __m512i LO = _mm512_set1_epi64((int64_t)c[0]), LOP = _mm512_set1_epi64((int64_t)c[wide ? 1 : 4]);
    const __m512i HI = _mm512_set1_epi64((int64_t)c[2]), HIP = _mm512_set1_epi64((int64_t)c[wide ? 3 : 5]);
    uint64_t *u = a, *v = a + t; /* the last stage: one group of half-size n/2 */
    for (int64_t j = 0; j < t; j += 8) {
        const __m512i U = _mm512_loadu_si512(u + j), V = _mm512_loadu_si512(v + j);
        const __m512i s = vmul_shoup(_mm512_add_epi64(U, V), LO, LOP, Q, wide);
        const __m512i d = vmul_shoup(_mm512_add_epi64(_mm512_sub_epi64(U, V), Q2), HI, HIP, Q, wide);
        _mm512_storeu_si512(u + j, sub_if_ge(s, Q));
        _mm512_storeu_si512(v + j, sub_if_ge(d, Q));
    }
}

IFMA static void sub_mul_ifma(uint64_t *dst, const uint64_t *x, const uint64_t *r, int64_t n, uint64_t q, uint64_t c,
                              const uint64_t *y) {
    const __m512i Q = _mm512_set1_epi64((int64_t)q), C = _mm512_set1_epi64((int64_t)c);
    const __m512i CP = _mm512_set1_epi64((int64_t)shoup52(c, q));
    for (int64_t j = 0; j < n; j += 8) {
        const __m512i d = _mm512_add_epi64(_mm512_sub_epi64(_mm512_loadu_si512(x + j), _mm512_loadu_si512(r + j)), Q);
        __m512i v = sub_if_ge(mul_shoup52(d, C, CP, Q), Q);
        if (y) v = sub_if_ge(_mm512_add_epi64(v, _mm512_loadu_si512(y + j)), Q);
        _mm512_storeu_si512(dst + j, v);
    }
}

static int ifma_enabled = -1; /* -1: not decided yet; VEIL_CPU_IFMA=0 turns it off */

static int use_ifma(uint64_t q, int64_t n) {
    if (ifma_enabled < 0) {
        const char *env = getenv("VEIL_CPU_IFMA");
        __builtin_cpu_init();
        ifma_enabled = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                       __builtin_cpu_supports("avx512ifma") && !(env && env[0] == '0');
    }
    return ifma_enabled && q < IFMA_MAX_Q && n >= 16;
}

/* The NTT's vector stages take every prime (64-bit products for those of 2^50 or more). */
static int use_vector_ntt(int64_t n) { return use_ifma(3, n); }
#else
static int use_ifma(uint64_t q, int64_t n) { (void)q; (void)n; return 0; }
static int use_vector_ntt(int64_t n) { (void)n; return 0; }
static void forward_row_ifma(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {}
static void inverse_row_ifma(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {}
static void sub_mul_ifma(uint64_t *dst, const uint64_t *x, const uint64_t *r, int64_t n, uint64_t q, uint64_t c,
                         const uint64_t *y) {}
#endif

#define F64_MAX_Q (1ULL << 44) /* primes below it: the NTT in doubles on AVX2 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* AVX2 + FMA (x86 CPUs without IFMA; VEIL_CPU_AVX2=0 turns it off): the NTT 4 butterflies at a
 * time, for primes below 2^44 (the chain's 36-bit ones) in doubles, for the wider ones on
 * 64-bit integer lanes (further down). AVX2 has no 64-bit multiply, but a double holds these
 * residues exactly and FMA gives a product's rounding error exactly, so x * w mod q for
 * integer-valued |x| < 16q, 0 <= w < q is
 *     h = x * w (rounded), l = x * w - h (exact), k = round(h / q), r = (h - k q) + l,
 * each step exact: h and l are integers; h / q < 2^48 is computed with a relative error of a
 * few 2^-53, so |h / q - k| < 1/2 + 1/8 and |h - k q| < 0.63 q; |l| <= ulp(h) / 2 <=
 * 16 q^2 2^-53 < q / 32; so |r| < 0.66 q. The forward butterflies (u + r, u - r) then grow a
 * value by < 0.66 q a stage, to < 11 q after 14 stages (16 q after 22), with no correction on
 * the way; the inverse ones add two values a stage, so u + v is brought back to [-q/2, q/2]
 * each time (u - v meets a product). Values leave canonical after one rounding division. Same
 * network and twiddles as the scalar loops; the outputs are the same residues, so equal bit
 * for bit. */
#define AVX2 __attribute__((target("avx2,fma")))

/* int64 <-> double for |x| < 2^51, exactly: 1.5 * 2^52 puts x in the mantissa (AVX2 has no
 * 64-bit integer conversions). */
AVX2 static inline __m256d i64_to_f64(__m256i x) {
    const __m256i magic = _mm256_set1_epi64x(0x4338000000000000LL);
    return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(x, magic)), _mm256_castsi256_pd(magic));
}

AVX2 static inline __m256i f64_to_i64(__m256d x) {
    const __m256d magic = _mm256_castsi256_pd(_mm256_set1_epi64x(0x4338000000000000LL));
    return _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(x, magic)), _mm256_castpd_si256(magic));
}

#define F64_ROUND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

AVX2 static inline __m256d mulmod_f64(__m256d x, __m256d w, __m256d q, __m256d qinv) {
    const __m256d h = _mm256_mul_pd(x, w), l = _mm256_fmsub_pd(x, w, h);
    const __m256d k = _mm256_round_pd(_mm256_mul_pd(h, qinv), F64_ROUND);
    return _mm256_add_pd(_mm256_fnmadd_pd(k, q, h), l);
}

/* x - round(x / q) q: [-q/2, q/2] for integer-valued |x| < 2^51. */
AVX2 static inline __m256d balance_f64(__m256d x, __m256d q, __m256d qinv) {
    return _mm256_fnmadd_pd(_mm256_round_pd(_mm256_mul_pd(x, qinv), F64_ROUND), q, x);
}

AVX2 static inline void butterflies_f64(__m256d *u, __m256d *v, __m256d W, __m256d Q, __m256d QI, int inverse) {
    const __m256d U = *u, V = *v;
    if (inverse) {
        *u = balance_f64(_mm256_add_pd(U, V), Q, QI);
        *v = mulmod_f64(_mm256_sub_pd(U, V), W, Q, QI);
    } else {
        const __m256d R = mulmod_f64(V, W, Q, QI);
        *u = _mm256_add_pd(U, R);
        *v = _mm256_sub_pd(U, R);
    }
}

/* The twiddles w[i .. i + 4) as doubles (canonical, below 2^44). */
AVX2 static inline __m256d load_w(const uint64_t *w) { return i64_to_f64(_mm256_loadu_si256((const __m256i *)w)); }

/* One stage of m groups of t butterflies over a row of doubles. t >= 4: a twiddle per group of
 * 4 or more lanes; t = 2: two groups per vector pair (lanes u0 u1 u0' u1'); t = 1: four groups
 * (lanes in the order 0 2 1 3, which the unpacks give, the twiddles permuted to match). */
AVX2 static void stage_f64(double *a, int64_t t, int64_t m, const uint64_t *w, __m256d Q, __m256d QI,
                           int inverse) {
    if (t >= 4) {
        for (int64_t i = 0; i < m; i++) {
            double *u = a + 2 * i * t, *v = u + t;
            const __m256d W = _mm256_set1_pd((double)w[m + i]);
            for (int64_t j = 0; j < t; j += 4) {
                __m256d U = _mm256_loadu_pd(u + j), V = _mm256_loadu_pd(v + j);
                butterflies_f64(&U, &V, W, Q, QI, inverse);
                _mm256_storeu_pd(u + j, U);
                _mm256_storeu_pd(v + j, V);
            }
        }
    } else if (t == 2) {
        for (int64_t i = 0; i < m; i += 2) {
            double *p = a + 4 * i;
            const __m256d A = _mm256_loadu_pd(p), B = _mm256_loadu_pd(p + 4);
            __m256d U = _mm256_permute2f128_pd(A, B, 0x20), V = _mm256_permute2f128_pd(A, B, 0x31);
            const __m256d W = _mm256_permute4x64_pd(load_w(w + m + i), 0x50); /* w0 w0 w1 w1 */
            butterflies_f64(&U, &V, W, Q, QI, inverse);
            _mm256_storeu_pd(p, _mm256_permute2f128_pd(U, V, 0x20));
            _mm256_storeu_pd(p + 4, _mm256_permute2f128_pd(U, V, 0x31));
        }
    } else {
        for (int64_t i = 0; i < m; i += 4) {
            double *p = a + 2 * i;
            const __m256d A = _mm256_loadu_pd(p), B = _mm256_loadu_pd(p + 4);
            __m256d U = _mm256_unpacklo_pd(A, B), V = _mm256_unpackhi_pd(A, B); /* groups 0 2 1 3 */
            const __m256d W = _mm256_permute4x64_pd(load_w(w + m + i), 0xD8);
            butterflies_f64(&U, &V, W, Q, QI, inverse);
            _mm256_storeu_pd(p, _mm256_unpacklo_pd(U, V));
            _mm256_storeu_pd(p + 4, _mm256_unpackhi_pd(U, V));
        }
    }
}

/* x (|x| < q) -> doubles in place of a; back to canonical int64 at the end. */
AVX2 static void load_row_f64(double *a, const int64_t *x, int64_t n) {
    for (int64_t j = 0; j < n; j += 4) _mm256_storeu_pd(a + j, i64_to_f64(_mm256_loadu_si256((const __m256i *)(x + j))));
}

AVX2 static void store_row_f64(uint64_t *a, int64_t n, __m256d Q, __m256d QI) {
    const __m256d zero = _mm256_setzero_pd();
    for (int64_t j = 0; j < n; j += 4) {
        __m256d r = balance_f64(_mm256_loadu_pd((const double *)(a + j)), Q, QI);
        r = _mm256_add_pd(r, _mm256_and_pd(_mm256_cmp_pd(r, zero, _CMP_LT_OQ), Q));
        _mm256_storeu_si256((__m256i *)(a + j), f64_to_i64(r));
    }
}

AVX2 static void forward_row_f64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const __m256d Q = _mm256_set1_pd((double)q), QI = _mm256_set1_pd(1.0 / (double)q);
    double *d = (double *)a;
    load_row_f64(d, x, n);
    for (int64_t m = 1, t = n >> 1; m < n; m <<= 1, t >>= 1) stage_f64(d, t, m, tab, Q, QI, 0);
    store_row_f64(a, n, Q, QI);
}

AVX2 static void inverse_row_f64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const __m256d Q = _mm256_set1_pd((double)q), QI = _mm256_set1_pd(1.0 / (double)q);
    const uint64_t *w = tab + 2 * n, *c = tab + 6 * n;
    double *d = (double *)a;
    load_row_f64(d, x, n);
    int64_t t = 1;
    for (int64_t m = n >> 1; m > 1; m >>= 1, t <<= 1) stage_f64(d, t, m, w, Q, QI, 1);
    const __m256d LO = _mm256_set1_pd((double)c[0]), HI = _mm256_set1_pd((double)c[2]);
    double *u = d, *v = d + t; /* the last stage: one group of half-size n/2 */
    for (int64_t j = 0; j < t; j += 4) {
        const __m256d U = _mm256_loadu_pd(u + j), V = _mm256_loadu_pd(v + j);
        _mm256_storeu_pd(u + j, mulmod_f64(_mm256_add_pd(U, V), LO, Q, QI));
        _mm256_storeu_pd(v + j, mulmod_f64(_mm256_sub_pd(U, V), HI, Q, QI));
    }
    store_row_f64(a, n, Q, QI);
}

/* The wider primes (2^44 to 2^62: q0, q1 and p) on AVX2's integer lanes: the scalar loops'
 * Shoup products and lazy ranges, each 64-bit product built from four (or three, for its low
 * half) 32 x 32 -> 64-bit ones, as AVX2 has no wider multiply; values below 4q < 2^62 compare
 * as signed. */
AVX2 static inline __m256i mullo64_avx2(__m256i a, __m256i b, __m256i bhi) {
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(a, bhi), _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b));
    return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
}

AVX2 static inline __m256i mulhi64_avx2(__m256i a, __m256i b, __m256i bhi) {
    const __m256i ahi = _mm256_srli_epi64(a, 32), lo32 = _mm256_set1_epi64x(0xffffffffLL);
    const __m256i ll = _mm256_mul_epu32(a, b), lh = _mm256_mul_epu32(a, bhi);
    const __m256i hl = _mm256_mul_epu32(ahi, b), hh = _mm256_mul_epu32(ahi, bhi);
    const __m256i mid = _mm256_add_epi64(_mm256_add_epi64(_mm256_srli_epi64(ll, 32), _mm256_and_si256(lh, lo32)),
                                         _mm256_and_si256(hl, lo32));
    return _mm256_add_epi64(_mm256_add_epi64(hh, _mm256_srli_epi64(mid, 32)),
                            _mm256_add_epi64(_mm256_srli_epi64(lh, 32), _mm256_srli_epi64(hl, 32)));
}

/* a * w mod q in [0, 2q) (Shoup), w's and wp's high halves given. */
AVX2 static inline __m256i mul_shoup_i64(__m256i a, __m256i w, __m256i whi, __m256i wp, __m256i wphi, __m256i q,
                                         __m256i qhi) {
    const __m256i t = mulhi64_avx2(a, wp, wphi);
    return _mm256_sub_epi64(mullo64_avx2(a, w, whi), mullo64_avx2(t, q, qhi));
}

AVX2 static inline __m256i sub_if_ge_i64(__m256i x, __m256i m) {
    return _mm256_sub_epi64(x, _mm256_andnot_si256(_mm256_cmpgt_epi64(m, x), m));
}

typedef struct { __m256i q, qhi, q2; } WideQ;

/* whi, wphi: the twiddle's and its quotient's high halves, taken once per twiddle by the caller. */
AVX2 static inline void butterflies_i64(__m256i *u, __m256i *v, __m256i W, __m256i whi, __m256i Wp, __m256i wphi,
                                        const WideQ *Q, int inverse) {
    const __m256i U = *u, V = *v;
    if (inverse) {
        *u = sub_if_ge_i64(_mm256_add_epi64(U, V), Q->q2);
        *v = mul_shoup_i64(_mm256_add_epi64(_mm256_sub_epi64(U, V), Q->q2), W, whi, Wp, wphi, Q->q, Q->qhi);
    } else {
        const __m256i Ur = sub_if_ge_i64(U, Q->q2), Vw = mul_shoup_i64(V, W, whi, Wp, wphi, Q->q, Q->qhi);
        *u = _mm256_add_epi64(Ur, Vw);
        *v = _mm256_add_epi64(_mm256_sub_epi64(Ur, Vw), Q->q2);
    }
}

/* stage_f64's three shapes on integer lanes, the twiddles w[m + group] with quotients wp. */
AVX2 static void stage_i64(uint64_t *a, int64_t t, int64_t m, const uint64_t *w, const uint64_t *wp, const WideQ *Q,
                           int inverse) {
    if (t >= 4) {
        for (int64_t i = 0; i < m; i++) {
            __m256i *u = (__m256i *)(a + 2 * i * t), *v = (__m256i *)(a + 2 * i * t + t);
            const __m256i W = _mm256_set1_epi64x((int64_t)w[m + i]), Wp = _mm256_set1_epi64x((int64_t)wp[m + i]);
            const __m256i whi = _mm256_srli_epi64(W, 32), wphi = _mm256_srli_epi64(Wp, 32);
            for (int64_t j = 0; j < t / 4; j++) {
                __m256i U = _mm256_loadu_si256(u + j), V = _mm256_loadu_si256(v + j);
                butterflies_i64(&U, &V, W, whi, Wp, wphi, Q, inverse);
                _mm256_storeu_si256(u + j, U);
                _mm256_storeu_si256(v + j, V);
            }
        }
    } else if (t == 2) {
        for (int64_t i = 0; i < m; i += 2) {
            __m256i *p = (__m256i *)(a + 4 * i);
            const __m256i A = _mm256_loadu_si256(p), B = _mm256_loadu_si256(p + 1);
            __m256i U = _mm256_permute2x128_si256(A, B, 0x20), V = _mm256_permute2x128_si256(A, B, 0x31);
            const __m256i W = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(w + m + i)), 0x50);
            const __m256i Wp = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(wp + m + i)), 0x50);
            butterflies_i64(&U, &V, W, _mm256_srli_epi64(W, 32), Wp, _mm256_srli_epi64(Wp, 32), Q, inverse);
            _mm256_storeu_si256(p, _mm256_permute2x128_si256(U, V, 0x20));
            _mm256_storeu_si256(p + 1, _mm256_permute2x128_si256(U, V, 0x31));
        }
    } else {
        for (int64_t i = 0; i < m; i += 4) {
            __m256i *p = (__m256i *)(a + 2 * i);
            const __m256i A = _mm256_loadu_si256(p), B = _mm256_loadu_si256(p + 1);
            __m256i U = _mm256_unpacklo_epi64(A, B), V = _mm256_unpackhi_epi64(A, B); /* groups 0 2 1 3 */
            const __m256i W = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(w + m + i)), 0xD8);
            const __m256i Wp = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(wp + m + i)), 0xD8);
            butterflies_i64(&U, &V, W, _mm256_srli_epi64(W, 32), Wp, _mm256_srli_epi64(Wp, 32), Q, inverse);
            _mm256_storeu_si256(p, _mm256_unpacklo_epi64(U, V));
            _mm256_storeu_si256(p + 1, _mm256_unpackhi_epi64(U, V));
        }
    }
}

AVX2 static WideQ wide_q(uint64_t q) {
    const WideQ Q = {_mm256_set1_epi64x((int64_t)q), _mm256_set1_epi64x((int64_t)(q >> 32)),
                     _mm256_set1_epi64x((int64_t)(2 * q))};
    return Q;
}

/* x (|x| < q) -> [0, q) into a. */
AVX2 static void lift_row_i64(uint64_t *a, const int64_t *x, int64_t n, __m256i q) {
    for (int64_t j = 0; j < n; j += 4) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x + j));
        _mm256_storeu_si256((__m256i *)(a + j),
                            _mm256_add_epi64(v, _mm256_and_si256(_mm256_cmpgt_epi64(_mm256_setzero_si256(), v), q)));
    }
}

AVX2 static void forward_row_i64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const WideQ Q = wide_q(q);
    lift_row_i64(a, x, n, Q.q);
    for (int64_t m = 1, t = n >> 1; m < n; m <<= 1, t >>= 1) stage_i64(a, t, m, tab, tab + n, &Q, 0);
    for (int64_t j = 0; j < n; j += 4) {
        __m256i *p = (__m256i *)(a + j);
        _mm256_storeu_si256(p, sub_if_ge_i64(sub_if_ge_i64(_mm256_loadu_si256(p), Q.q2), Q.q));
    }
}

AVX2 static void inverse_row_i64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const WideQ Q = wide_q(q);
    const uint64_t *c = tab + 6 * n;
    lift_row_i64(a, x, n, Q.q);
    int64_t t = 1;
    for (int64_t m = n >> 1; m > 1; m >>= 1, t <<= 1) stage_i64(a, t, m, tab + 2 * n, tab + 3 * n, &Q, 1);
    const __m256i LO = _mm256_set1_epi64x((int64_t)c[0]), LOP = _mm256_set1_epi64x((int64_t)c[1]);
    const __m256i HI = _mm256_set1_epi64x((int64_t)c[2]), HIP = _mm256_set1_epi64x((int64_t)c[3]);
    const __m256i LOh = _mm256_srli_epi64(LO, 32), LOPh = _mm256_srli_epi64(LOP, 32);
    const __m256i HIh = _mm256_srli_epi64(HI, 32), HIPh = _mm256_srli_epi64(HIP, 32);
    __m256i *u = (__m256i *)a, *v = (__m256i *)(a + t); /* the last stage: one group of half-size n/2 */
    for (int64_t j = 0; j < t / 4; j++) {
        const __m256i U = _mm256_loadu_si256(u + j), V = _mm256_loadu_si256(v + j);
        const __m256i s = mul_shoup_i64(_mm256_add_epi64(U, V), LO, LOh, LOP, LOPh, Q.q, Q.qhi);
        const __m256i d = mul_shoup_i64(_mm256_add_epi64(_mm256_sub_epi64(U, V), Q.q2), HI, HIh, HIP, HIPh, Q.q, Q.qhi);
        _mm256_storeu_si256(u + j, sub_if_ge_i64(s, Q.q));
        _mm256_storeu_si256(v + j, sub_if_ge_i64(d, Q.q));
    }
}

static int avx2_enabled = -1; /* -1: not decided yet; VEIL_CPU_AVX2=0 turns it off */

/* The AVX2 lanes run where the IFMA ones do not (the callers ask those first). */
static int use_avx2(uint64_t q, int64_t n) {
    if (avx2_enabled < 0) {
        const char *env = getenv("VEIL_CPU_AVX2");
        __builtin_cpu_init();
        avx2_enabled = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !(env && env[0] == '0');
    }
    return avx2_enabled && n >= 16;
}
#else
static int use_avx2(uint64_t q, int64_t n) { (void)q; (void)n; return 0; }
static void forward_row_f64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {}
static void inverse_row_f64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {}
static void forward_row_i64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {}
static void inverse_row_i64(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {}
#endif

/* Which NTT a prime's rows take: 2 the AVX-512 lanes, 1 the AVX2 doubles, 0 the scalar loops
 * (decided on the first call: the CPU, VEIL_CPU_IFMA and VEIL_CPU_AVX2). */
int veil_ntt_path(uint64_t q, int64_t n) {
    const int avx2 = use_avx2(q, n); /* both decided on the first call, whichever runs */
    return use_vector_ntt(n) ? 2 : avx2 ? 1 : 0;
}

/* Whether the AVX-512 lanes run (decided on the first call: the CPU and VEIL_CPU_IFMA). */
int veil_ntt_ifma(void) { return use_ifma(3, 16); }

/* |x| < 2^62 -> (-q, q): x - trunc(x / q) * q, the quotient from a double (relative error
 * 2^-52 on |x / q| < 2^42 (q >= 2^20), then truncated: off by at most one, so the remainder
 * lies in (-2q, 2q) and one correction each way brings it into (-q, q)). */
static inline int64_t reduce_any(int64_t x, uint64_t q, double qinv) {
    const int64_t k = (int64_t)((double)x * qinv);
    int64_t r = x - k * (int64_t)q;
    r -= (r >= (int64_t)q) ? (int64_t)q : 0;
    r += (r <= -(int64_t)q) ? (int64_t)q : 0;
    return r;
}

/* Rows [0, rows) of x -> out (contiguous, n each); row r is a residue of limb r % limbs, whose
 * prime and table are qs[limb], tabs[limb]. x's polynomials (limbs contiguous rows each, one row
 * with bcast) start x_stride elements apart: a run of limbs of a wider tensor (the dropped limb
 * of ModDown and the rescale) is read in place, not copied first. out may equal x (not with
 * bcast).
 * bcast: x holds one row per polynomial, any |x| < 2^62 (a centred integer from another
 * basis), and row r transforms x's row r / limbs reduced mod its limb's prime: ModDown's and
 * the rescale's "the dropped limb in every other basis", without a [.., L, N] reduced copy.
 * same (bcast, or NULL): ModUp's digits, x's rows being the centred [c]_{q_j} of a polynomial c
 * whose NTT-form limbs are same's rows (canonical), the limbs being [p, q_0 .. q_{limbs-2}]:
 * digit j in its own prime q_j is c's limb j itself, so that row is copied, not transformed
 * (one NTT in limbs per digit saved).
 * centre (inverse only): the coefficients leave centred, (-q/2, q/2], as the key switch's
 * digits and the dropped limb of ModDown and the rescale want them (a pass over the row while it
 * is in cache, instead of a torch pass over the whole tensor). */
void veil_ntt_rows(int64_t *out, const int64_t *x, int64_t x_stride, int64_t rows, int64_t limbs, int64_t n,
                   const uint64_t *qs, const uint64_t *const *tabs, int inverse, int bcast, const int64_t *same,
                   int centre) {
    veil_ntt_path(3, 16); /* decided before the threads start */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t limb = r % limbs;
        uint64_t *a = (uint64_t *)(out + r * n);
        const int64_t *src = x + (r / limbs) * x_stride + limb * n;
        if (same && limb == (r / limbs) % (limbs - 1) + 1) {
            memcpy(a, same + (r / limbs) * n, (size_t)n * sizeof(int64_t));
            continue;
        }
        if (bcast) { /* reduced into the output row, then transformed in place */
            const int64_t *row = x + (r / limbs) * x_stride;
            const double qinv = 1.0 / (double)qs[limb];
            for (int64_t j = 0; j < n; j++) out[r * n + j] = reduce_any(row[j], qs[limb], qinv);
            src = out + r * n;
        }
        const int path = veil_ntt_path(qs[limb], n);
        if (inverse) {
            (path == 2 ? inverse_row_ifma : path == 1 ? (qs[limb] < F64_MAX_Q ? inverse_row_f64 : inverse_row_i64) : inverse_row)(a, src, n, qs[limb], tabs[limb]);
            if (centre) {
                const uint64_t q = qs[limb], half = q >> 1;
                for (int64_t j = 0; j < n; j++) a[j] -= (a[j] > half) ? q : 0; /* as int64: a[j] - q */
            }
        } else
            (path == 2 ? forward_row_ifma : path == 1 ? (qs[limb] < F64_MAX_Q ? forward_row_f64 : forward_row_i64) : forward_row)(a, src, n, qs[limb], tabs[limb]);
    }
}

/* u128 -> [0, q): x = hi*2^64 + lo, with r64 = 2^64 mod q and one_p = floor(2^64 / q) (Shoup
 * quotients of the constants r64 and 1); each half lands in [0, 2q), their sum below 4q. */
static inline uint64_t reduce128(u128 x, uint64_t q, uint64_t r64, uint64_t r64p, uint64_t one_p) {
    const uint64_t hi = (uint64_t)(x >> 64), lo = (uint64_t)x;
    uint64_t r = mul_shoup(hi, r64, r64p, q) + (lo - mulhi(lo, one_p) * q);
    r -= (r >= 2 * q) ? 2 * q : 0;
    return r - ((r >= q) ? q : 0);
}

#define MAC_BLOCK 256
#define MAC_OUTS 2

/* out[o, r, e] = sum_k a_k[r, e] * w[k * outs + o][e] mod q(limb of e), for rows r in [0, rows),
 * outputs o in [0, outs), and flat positions e of the [L, N] plane. a_k[r] starts at
 * a[k] + r * a_row_stride. w: sets of terms * outs pointers to [L, N] weights, set s for rows
 * [s * w_row_div, (s + 1) * w_row_div): one set that every row shares (w_row_div = rows), or one
 * per session of a batch (its own plaintexts, or its own keys, wherever each lives: row r reads
 * w[((r / w_row_div) * terms + k) * outs + o]). out: [outs / group, rows, group, L, N] -- with
 * group = outs the plain [rows, outs, L, N]; a hoisted set of S keys is outs = 2S, group = 2,
 * so each key's two halves land as [S, rows, 2, L, N], the layout the rotations take next.
 * The terms a may be lazy, in (-q, q); the weights w are canonical.
 * dot_plain is outs = 1; a key inner product outs = 2 (the key's halves); a hoisted set's keys
 * outs = 2S: every key meets the same digits, which a block reads from memory once for all of
 * them (from L1 after the first pair of outputs), where a call per key streams them S times.
 * A block of positions is done for every row before the next block, so a batch reads each
 * weight block from memory once. Terms are summed in 128 bits, reduced every `per` terms so the
 * sum cannot wrap (per = the most products of canonical operands that fit). */
typedef struct {
    int64_t *out;
    const int64_t *const *a, *const *w;
    int64_t a_row_stride, w_row_div, terms, outs, group, rows, n, plane;
} MacJob;

/* One block's work: positions [pos, pos + len) of limb `limb`, outputs [o0, o0 + on), on <= MAC_OUTS. */
typedef struct {
    int64_t limb, pos, len, e, o0, on;
    uint64_t q;
} MacBlock;

/* Term k of row r over the block, lifted to [0, q). */
static inline void load_term(uint64_t *x, const MacJob *m, const MacBlock *b, int64_t k, int64_t r) {
    const int64_t *src = m->a[k] + r * m->a_row_stride + b->e;
    for (int64_t j = 0; j < b->len; j++) x[j] = lift(src[j], b->q);
}

/* The weights of term k, output o (of the whole job), for row r at flat position e. */
static inline const uint64_t *weight_at(const MacJob *m, int64_t k, int64_t o, int64_t r, int64_t e) {
    return (const uint64_t *)(m->w[((r / m->w_row_div) * m->terms + k) * m->outs + o] + e);
}

/* Where output o of row r writes position e. */
static inline int64_t *out_at(const MacJob *m, int64_t o, int64_t r, int64_t e) {
    return m->out + ((o / m->group) * m->rows * m->group + r * m->group + o % m->group) * m->plane + e;
}

static void mac_block_scalar(const MacJob *m, const MacBlock *b) {
    u128 acc[MAC_OUTS][MAC_BLOCK];
    uint64_t x[MAC_BLOCK];
    const uint64_t q = b->q, r64 = (uint64_t)(((u128)1 << 64) % q);
    const uint64_t r64p = shoup(r64, q), one_p = shoup(1, q);
    const u128 prod_max = (u128)(q - 1) * (q - 1);
    const int64_t per = (int64_t)((~(u128)0 - q) / (prod_max ? prod_max : 1)), len = b->len;
    for (int64_t r = 0; r < m->rows; r++) {
        for (int64_t o = 0; o < b->on; o++)
            for (int64_t j = 0; j < len; j++) acc[o][j] = 0;
        int64_t held = 0;
        for (int64_t k = 0; k < m->terms; k++) {
            if (held == per) {
                for (int64_t o = 0; o < b->on; o++)
                    for (int64_t j = 0; j < len; j++) acc[o][j] = reduce128(acc[o][j], q, r64, r64p, one_p);
                held = 0;
            }
            load_term(x, m, b, k, r);
            for (int64_t o = 0; o < b->on; o++) {
                const uint64_t *y = weight_at(m, k, b->o0 + o, r, b->e);
                for (int64_t j = 0; j < len; j++) acc[o][j] += (u128)x[j] * y[j];
            }
            held++;
        }
        for (int64_t o = 0; o < b->on; o++) {
            int64_t *dst = out_at(m, b->o0 + o, r, b->e);
            for (int64_t j = 0; j < len; j++) dst[j] = (int64_t)reduce128(acc[o][j], q, r64, r64p, one_p);
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* MAC_IFMA_FLUSH products of canonical operands below q < 2^50 each add < 2^52 to the low and
 * < 2^48 to the high 52-bit half: after 8 the halves are < 2^55 and < 2^51, and
 * sum = H * 2^52 + L is brought to [0, q) with two 52-bit Shoup products. */
#define MAC_IFMA_FLUSH 8

IFMA static inline __m512i reduce_halves(__m512i H, __m512i L, __m512i Q, __m512i c52, __m512i c52p,
                                        __m512i one_p) {
    const __m512i mask = _mm512_set1_epi64((1LL << 52) - 1);
    const __m512i hi = _mm512_add_epi64(H, _mm512_srli_epi64(L, 52)); /* < 2^52 */
    const __m512i s = _mm512_add_epi64(mul_shoup52(hi, c52, c52p, Q),
                                       mul_shoup52(_mm512_and_si512(L, mask), _mm512_set1_epi64(1), one_p, Q));
    return sub_if_ge(sub_if_ge(s, _mm512_add_epi64(Q, Q)), Q); /* < 4q -> [0, q) */
}

/* Sixteen lazy terms at src, lifted to [0, q). */
IFMA static inline void load16(__m512i *x, const int64_t *src, __m512i Q) {
    const __m512i zero = _mm512_setzero_si512();
    for (int v = 0; v < 2; v++) {
        const __m512i t = _mm512_loadu_si512(src + 8 * v);
        x[v] = _mm512_mask_add_epi64(t, _mm512_cmplt_epi64_mask(t, zero), t, Q);
    }
}

/* A block for primes q < 2^50, len a multiple of 16. Two vectors of 8 positions at a time,
 * every output's two halves in registers across all terms (up to 8 independent accumulator
 * chains keep the multiplier busy), each operand read once. */
IFMA static void mac_block_ifma(const MacJob *m, const MacBlock *b) {
    const uint64_t q = b->q, c52 = (uint64_t)(((u128)1 << 52) % q);
    const __m512i Q = _mm512_set1_epi64((int64_t)q), C52 = _mm512_set1_epi64((int64_t)c52);
    const __m512i C52P = _mm512_set1_epi64((int64_t)shoup52(c52, q)), ONEP = _mm512_set1_epi64((int64_t)shoup52(1, q));
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < m->rows; r++)
        for (int64_t j = 0; j < b->len; j += 16) {
            __m512i lo[MAC_OUTS][2], hi[MAC_OUTS][2];
            for (int64_t o = 0; o < MAC_OUTS; o++)
                lo[o][0] = lo[o][1] = hi[o][0] = hi[o][1] = zero;
            for (int64_t k = 0; k < m->terms; k++) {
                if (k && k % MAC_IFMA_FLUSH == 0)
                    for (int64_t o = 0; o < b->on; o++)
                        for (int v = 0; v < 2; v++) {
                            lo[o][v] = reduce_halves(hi[o][v], lo[o][v], Q, C52, C52P, ONEP);
                            hi[o][v] = zero;
                        }
                __m512i x[2];
                load16(x, m->a[k] + r * m->a_row_stride + b->e + j, Q);
                for (int64_t o = 0; o < b->on; o++) {
                    const uint64_t *y = weight_at(m, k, b->o0 + o, r, b->e + j);
                    for (int v = 0; v < 2; v++) {
                        const __m512i Y = _mm512_loadu_si512(y + 8 * v);
                        lo[o][v] = _mm512_madd52lo_epu64(lo[o][v], x[v], Y);
                        hi[o][v] = _mm512_madd52hi_epu64(hi[o][v], x[v], Y);
                    }
                }
            }
            for (int64_t o = 0; o < b->on; o++) {
                int64_t *dst = out_at(m, b->o0 + o, r, b->e + j);
                for (int v = 0; v < 2; v++)
                    _mm512_storeu_si512(dst + 8 * v, reduce_halves(hi[o][v], lo[o][v], Q, C52, C52P, ONEP));
            }
        }
}

/* Primes of 2^50 up to 2^60 (q0, q1 and p): each operand split at bit 52 (x = xh*2^52 + xl,
 * xh < 2^8), the product's 52-bit pieces summed exactly in three columns of weights 1, 2^52
 * and 2^104 (seven IFMA products per term, where the scalar path makes one 128-bit product
 * per lane); a term adds < 3*2^52 to the middle column, so the columns are carried every
 * MAC_WIDE_FLUSH terms. The sum c0 + c1*2^52 + c2*2^104 is brought to [0, q) with two 64-bit
 * Shoup products by 2^52 mod q and 2^104 mod q. */
#define MAC_WIDE_FLUSH 1024

IFMA static inline void carry52(__m512i *c) {
    const __m512i mask = _mm512_set1_epi64((1LL << 52) - 1);
    c[1] = _mm512_add_epi64(c[1], _mm512_srli_epi64(c[0], 52));
    c[0] = _mm512_and_si512(c[0], mask);
    c[2] = _mm512_add_epi64(c[2], _mm512_srli_epi64(c[1], 52));
    c[1] = _mm512_and_si512(c[1], mask);
}

IFMA static void mac_block_wide(const MacJob *m, const MacBlock *b) {
    const uint64_t q = b->q, r52 = (uint64_t)(((u128)1 << 52) % q), r104 = (uint64_t)(((u128)r52 << 52) % q);
    const __m512i Q = _mm512_set1_epi64((int64_t)q), mask = _mm512_set1_epi64((1LL << 52) - 1);
    const __m512i R52 = _mm512_set1_epi64((int64_t)r52), R52P = _mm512_set1_epi64((int64_t)shoup(r52, q));
    const __m512i R104 = _mm512_set1_epi64((int64_t)r104), R104P = _mm512_set1_epi64((int64_t)shoup(r104, q));
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < m->rows; r++)
        for (int64_t j = 0; j < b->len; j += 16) {
            __m512i c[MAC_OUTS][2][3];
            for (int64_t o = 0; o < MAC_OUTS; o++)
                for (int v = 0; v < 2; v++) c[o][v][0] = c[o][v][1] = c[o][v][2] = zero;
            for (int64_t k = 0; k < m->terms; k++) {
                if (k && k % MAC_WIDE_FLUSH == 0)
                    for (int64_t o = 0; o < b->on; o++) carry52(c[o][0]), carry52(c[o][1]);
                __m512i x[2], xl[2], xh[2];
                load16(x, m->a[k] + r * m->a_row_stride + b->e + j, Q);
                for (int v = 0; v < 2; v++) {
                    xl[v] = _mm512_and_si512(x[v], mask);
                    xh[v] = _mm512_srli_epi64(x[v], 52);
                }
                for (int64_t o = 0; o < b->on; o++) {
                    const uint64_t *y = weight_at(m, k, b->o0 + o, r, b->e + j);
                    for (int v = 0; v < 2; v++) {
                        const __m512i Y = _mm512_loadu_si512(y + 8 * v);
                        const __m512i yl = _mm512_and_si512(Y, mask), yh = _mm512_srli_epi64(Y, 52);
                        __m512i *col = c[o][v];
                        col[0] = _mm512_madd52lo_epu64(col[0], xl[v], yl);
                        col[1] = _mm512_madd52hi_epu64(col[1], xl[v], yl);
                        col[1] = _mm512_madd52lo_epu64(col[1], xl[v], yh);
                        col[1] = _mm512_madd52lo_epu64(col[1], xh[v], yl);
                        col[2] = _mm512_madd52hi_epu64(col[2], xl[v], yh);
                        col[2] = _mm512_madd52hi_epu64(col[2], xh[v], yl);
                        col[2] = _mm512_madd52lo_epu64(col[2], xh[v], yh);
                    }
                }
            }
            for (int64_t o = 0; o < b->on; o++) {
                int64_t *dst = out_at(m, b->o0 + o, r, b->e + j);
                for (int v = 0; v < 2; v++) {
                    __m512i *col = c[o][v];
                    carry52(col); /* c0, c1 < 2^52: the sum < 2^52 + 4q < 8q */
                    __m512i s = _mm512_add_epi64(col[0], _mm512_add_epi64(mul_shoup64(col[1], R52, R52P, Q),
                                                                          mul_shoup64(col[2], R104, R104P, Q)));
                    s = sub_if_ge(sub_if_ge(sub_if_ge(s, _mm512_slli_epi64(Q, 2)), _mm512_add_epi64(Q, Q)), Q);
                    _mm512_storeu_si512(dst + 8 * v, s);
                }
            }
        }
}
#else
static void mac_block_ifma(const MacJob *m, const MacBlock *b) { (void)m, (void)b; }
static void mac_block_wide(const MacJob *m, const MacBlock *b) { (void)m, (void)b; }
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The multiply-accumulate on AVX2 (no IFMA): each product of a = a1 2^32 + a0 and w = w1 2^32 +
 * w0 from AVX2's four 32 x 32 -> 64-bit products, summed in three 64-bit columns: c0 the low
 * halves of a0 w0, c1 its high halves and a0 w1 + a1 w0, c2 a1 w1. A term adds < 2^32 + 2^(b+1)
 * to c1 for a b-bit prime, so the columns are folded into [0, q) (into c0) every `per` terms,
 * per = (2^64 - 1) / that, at most 3 2^30 for c0 (< 2^62 + per 2^32): every 2^26 terms for the
 * 36-bit primes, 63 for the 57-bit ones, at least one up to 2^62; c2 stays below 2^61. */
AVX2 static void mac_block_avx2(const MacJob *m, const MacBlock *b) {
    uint64_t c[3][MAC_OUTS][MAC_BLOCK], x[MAC_BLOCK];
    const uint64_t q = b->q, r64 = (uint64_t)(((u128)1 << 64) % q);
    const uint64_t r64p = shoup(r64, q), one_p = shoup(1, q);
    const int bits = 64 - __builtin_clzll(q);
    const u128 by_c1 = (u128)~0ULL / (((u128)1 << 32) + ((u128)1 << (bits + 1)));
    const int64_t per = by_c1 < ((u128)3 << 30) ? (int64_t)by_c1 : (int64_t)3 << 30, len = b->len;
    const __m256i lo32 = _mm256_set1_epi64x(0xffffffffLL);
    for (int64_t r = 0; r < m->rows; r++) {
        memset(c, 0, sizeof(c));
        for (int64_t k = 0, held = 0; k <= m->terms; k++, held++) {
            if (held == per || k == m->terms) { /* fold the columns into c0, in [0, q) */
                for (int64_t o = 0; o < b->on; o++)
                    for (int64_t j = 0; j < len; j++) {
                        const u128 sum = c[0][o][j] + ((u128)c[1][o][j] << 32) + ((u128)c[2][o][j] << 64);
                        c[0][o][j] = reduce128(sum, q, r64, r64p, one_p);
                        c[1][o][j] = c[2][o][j] = 0;
                    }
                held = 0;
                if (k == m->terms)
                    break;
            }
            load_term(x, m, b, k, r);
            for (int64_t o = 0; o < b->on; o++) {
                const uint64_t *y = weight_at(m, k, b->o0 + o, r, b->e);
                for (int64_t j = 0; j < len; j += 4) {
                    const __m256i A = _mm256_loadu_si256((const __m256i *)(x + j));
                    const __m256i W = _mm256_loadu_si256((const __m256i *)(y + j));
                    const __m256i Ah = _mm256_srli_epi64(A, 32), Wh = _mm256_srli_epi64(W, 32);
                    const __m256i ll = _mm256_mul_epu32(A, W);
                    const __m256i mid = _mm256_add_epi64(_mm256_srli_epi64(ll, 32),
                                                         _mm256_add_epi64(_mm256_mul_epu32(A, Wh), _mm256_mul_epu32(Ah, W)));
                    __m256i *c0 = (__m256i *)(c[0][o] + j), *c1 = (__m256i *)(c[1][o] + j), *c2 = (__m256i *)(c[2][o] + j);
                    _mm256_storeu_si256(c0, _mm256_add_epi64(_mm256_loadu_si256(c0), _mm256_and_si256(ll, lo32)));
                    _mm256_storeu_si256(c1, _mm256_add_epi64(_mm256_loadu_si256(c1), mid));
                    _mm256_storeu_si256(c2, _mm256_add_epi64(_mm256_loadu_si256(c2), _mm256_mul_epu32(Ah, Wh)));
                }
            }
        }
        for (int64_t o = 0; o < b->on; o++)
            memcpy(out_at(m, b->o0 + o, r, b->e), c[0][o], (size_t)len * sizeof(int64_t));
    }
}
#else
static void mac_block_avx2(const MacJob *m, const MacBlock *b) { mac_block_scalar(m, b); }
#endif

/* The three-column lanes take primes below 2^60 (their sum's bound, 8q < 2^64, with room). */
static int use_ifma_wide(uint64_t q, int64_t n) { return use_vector_ntt(n) && q < (1ULL << 60); }

void veil_mac(int64_t *out, const int64_t *const *a, int64_t a_row_stride,
              const int64_t *const *w, int64_t w_row_div, int64_t terms, int64_t outs,
              int64_t group, int64_t rows, int64_t limbs, int64_t n, const uint64_t *qs) {
    const MacJob m = {out, a, w, a_row_stride, w_row_div, terms, outs, group, rows, n, limbs * n};
    const int64_t per_limb = (n + MAC_BLOCK - 1) / MAC_BLOCK;
    veil_ntt_path(3, 16); /* the lanes decided before the threads start */
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < limbs * per_limb; i++) {
        const int64_t limb = i / per_limb, pos = (i % per_limb) * MAC_BLOCK;
        const uint64_t q = qs[limb];
        MacBlock b = {limb, pos, n - pos < MAC_BLOCK ? n - pos : MAC_BLOCK, limb * n + pos, 0, 0, q};
        void (*block)(const MacJob *, const MacBlock *) = mac_block_scalar;
        if (b.len % 16 == 0 && use_ifma(q, n))
            block = mac_block_ifma;
        else if (b.len % 16 == 0 && use_ifma_wide(q, n))
            block = mac_block_wide;
        else if (b.len % 4 == 0 && use_avx2(q, n))
            block = mac_block_avx2;
        for (b.o0 = 0; b.o0 < outs; b.o0 += MAC_OUTS) { /* the block's terms stay in L1 across pairs */
            b.on = outs - b.o0 < MAC_OUTS ? outs - b.o0 : MAC_OUTS;
            block(&m, &b);
        }
    }
}

/* out = (x - r) * c mod q in [0, q) for canonical x, r [rows, L, N] (row = limb-major plane; x's
 * rows x_row_stride apart: a run of limbs of a wider tensor, ModDown's data limbs), c
 * one constant per limb: the rescale's and ModDown's tail in one pass (the torch twin
 * ckks_ops.sub_mul_const_torch makes a dozen).
 * y (or NULL): canonical [y_rows, L, N] added to every y_every-th row, row i meeting y's row
 * (i / y_every) % y_rows: a key switch's c0 (y_every 2: the first of each output pair, a
 * rotation) or c0 and c1 (y_every 1, relinearization), broadcast over a hoisted set's outputs. */
void veil_sub_mul(int64_t *out, const int64_t *x, int64_t x_row_stride, const int64_t *r, int64_t rows,
                  int64_t limbs, int64_t n, const uint64_t *qs, const uint64_t *cs,
                  const int64_t *y, int64_t y_every, int64_t y_rows) {
    use_ifma(3, 16);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < rows * limbs; b++) {
        const int64_t limb = b % limbs, row = b / limbs;
        const uint64_t q = qs[limb], c = cs[limb], cp = shoup(c, q);
        const uint64_t *xs = (const uint64_t *)x + row * x_row_stride + limb * n;
        const uint64_t *rs = (const uint64_t *)r + b * n;
        const uint64_t *ys = y && row % y_every == 0 ? (const uint64_t *)y + ((row / y_every) % y_rows * limbs + limb) * n
                                                     : NULL;
        uint64_t *dst = (uint64_t *)out + b * n;
        if (n % 8 == 0 && use_ifma(q, n)) {
            sub_mul_ifma(dst, xs, rs, n, q, c, ys);
            continue;
        }
        for (int64_t j = 0; j < n; j++) {
            uint64_t v = mul_shoup(xs[j] - rs[j] + q, c, cp, q); /* [0, 2q) */
            v -= (v >= q) ? q : 0;
            if (ys) {
                v += ys[j]; /* < 2q */
                v -= (v >= q) ? q : 0;
            }
            dst[j] = v;
        }
    }
}

/* out = x + y mod q in [0, q) for canonical x, y [rows, L, N] (contiguous): the evaluator's
 * additions in one pass, where the torch twin (Basis.add) makes five and allocates three. */
void veil_add_mod(int64_t *out, const int64_t *x, const int64_t *y, int64_t rows, int64_t limbs, int64_t n,
                  const uint64_t *qs) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < rows * limbs; b++) {
        const uint64_t q = qs[b % limbs];
        const uint64_t *xs = (const uint64_t *)x + b * n, *ys = (const uint64_t *)y + b * n;
        uint64_t *dst = (uint64_t *)out + b * n;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            const uint64_t v = xs[j] + ys[j]; /* < 2q < 2^63 */
            dst[j] = v >= q ? v - q : v;
        }
    }
}

/* out[g, r, e] = x[g, r, idx[g, e] & (n - 1)]: groups of rows, each gathered by its own index
 * (a rotation's automorphism in NTT form, one per rotation of a hoisted set). n is a power of
 * two, so the mask keeps every read inside its row whatever the index holds. */
void veil_gather(int64_t *out, const int64_t *x, const int64_t *idx, int64_t groups, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < groups * rows; b++) {
        const int64_t *ix = idx + (b / rows) * n, *src = x + b * n;
        int64_t *dst = out + b * n;
        for (int64_t e = 0; e < n; e++) dst[e] = src[ix[e] & (n - 1)];
    }
}
