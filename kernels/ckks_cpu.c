/* The native CKKS backend's CPU kernels on int64 residues [..., L, N] (canonical: [0, q)).
 *
 * veil_ntt_rows: the negacyclic NTT / INTT of veil.crypto.native.ntt (SEAL's network: Cooley-Tukey
 * forward with psi^brev(k), Gentleman-Sande inverse with psi^-brev(k) and 1/N folded into the last
 * stage), one row at a time, all stages in place. Why C: the torch twin makes one pass over the
 * whole [B, L, N] array per stage, and a 16,384-point limb (128 KB) no longer sits in L1 between
 * passes; here a row stays in cache across its 14 stages.
 *
 * veil_mac: sum_k a_k * w_k mod q, the products summed exactly in 128 bits and reduced once per
 * output: dot_plain's ct x pt sums (twin ckks_ops.mac_torch) and the key inner product of a key
 * switch, the Galois gather read inside it (twin rns._key_inner).
 *
 * Products: Shoup's, with wp = floor(w * 2^64 / q): for any 64-bit a,
 * a*w - mulhi(a, wp)*q lies in [0, 2q). Lazy bounds (Harvey): forward values stay in [0, 4q),
 * inverse values in [0, 2q); both need 4q < 2^64, i.e. q < 2^62 (the loader checks it).
 *
 * Table of one prime, n = ring degree (veil_ntt_table fills it from w and winv):
 *   [0, n) w, [n, 2n) wp, [2n, 3n) winv, [3n, 4n) winvp, then lo, lop, hi, hip
 * where lo = n^-1 and hi = psi^-brev(1) * n^-1 (the last inverse stage's constants).
 */
#include <stdint.h>

typedef unsigned __int128 u128;

static inline uint64_t mulhi(uint64_t a, uint64_t b) { return (uint64_t)(((u128)a * b) >> 64); }

/* a*w mod q in [0, 2q) for any 64-bit a. */
static inline uint64_t mul_shoup(uint64_t a, uint64_t w, uint64_t wp, uint64_t q) {
    return a * w - mulhi(a, wp) * q;
}

static inline uint64_t shoup(uint64_t w, uint64_t q) { return (uint64_t)(((u128)w << 64) / q); }

void veil_ntt_table(uint64_t *tab, const uint64_t *w, const uint64_t *winv, int64_t n, uint64_t q,
                    uint64_t lo, uint64_t hi) {
    for (int64_t i = 0; i < n; i++) {
        tab[i] = w[i];
        tab[n + i] = shoup(w[i], q);
        tab[2 * n + i] = winv[i];
        tab[3 * n + i] = shoup(winv[i], q);
    }
    tab[4 * n] = lo;
    tab[4 * n + 1] = shoup(lo, q);
    tab[4 * n + 2] = hi;
    tab[4 * n + 3] = shoup(hi, q);
}

/* (-q, q) -> [0, q) */
static inline uint64_t lift(int64_t x, uint64_t q) { return (uint64_t)x + (x < 0 ? q : 0); }

static void forward_row(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const uint64_t *w = tab, *wp = tab + n;
    const uint64_t two_q = 2 * q;
    for (int64_t j = 0; j < n; j++) a[j] = lift(x[j], q);
    for (int64_t m = 1, t = n >> 1; m < n; m <<= 1, t >>= 1) {
        for (int64_t i = 0; i < m; i++) {
            const uint64_t W = w[m + i], Wp = wp[m + i];
            uint64_t *u = a + 2 * i * t, *v = u + t;
            for (int64_t j = 0; j < t; j++) {
                uint64_t U = u[j];
                U -= (U >= two_q) ? two_q : 0;
                const uint64_t V = mul_shoup(v[j], W, Wp, q);
                u[j] = U + V;
                v[j] = U - V + two_q;
            }
        }
    }
    for (int64_t j = 0; j < n; j++) {
        uint64_t r = a[j];
        r -= (r >= two_q) ? two_q : 0;
        a[j] = r - ((r >= q) ? q : 0);
    }
}

static void inverse_row(uint64_t *a, const int64_t *x, int64_t n, uint64_t q, const uint64_t *tab) {
    const uint64_t *w = tab + 2 * n, *wp = tab + 3 * n;
    const uint64_t lo = tab[4 * n], lop = tab[4 * n + 1], hi = tab[4 * n + 2], hip = tab[4 * n + 3];
    const uint64_t two_q = 2 * q;
    for (int64_t j = 0; j < n; j++) a[j] = lift(x[j], q);
    int64_t t = 1;
    for (int64_t m = n >> 1; m > 1; m >>= 1, t <<= 1) {
        for (int64_t i = 0; i < m; i++) {
            const uint64_t W = w[m + i], Wp = wp[m + i];
            uint64_t *u = a + 2 * i * t, *v = u + t;
            for (int64_t j = 0; j < t; j++) {
                const uint64_t U = u[j], V = v[j];
                uint64_t s = U + V;
                s -= (s >= two_q) ? two_q : 0;
                u[j] = s;
                v[j] = mul_shoup(U - V + two_q, W, Wp, q);
            }
        }
    }
    uint64_t *u = a, *v = a + t;  /* the last stage: one group of half-size n/2 */
    for (int64_t j = 0; j < t; j++) {
        const uint64_t U = u[j], V = v[j];
        uint64_t s = mul_shoup(U + V, lo, lop, q), d = mul_shoup(U - V + two_q, hi, hip, q);
        u[j] = s - ((s >= q) ? q : 0);
        v[j] = d - ((d >= q) ? q : 0);
    }
}

/* Rows [0, rows) of x (contiguous, n each) -> out; row r is a residue of limb r % limbs, whose
 * prime and table are qs[limb], tabs[limb]. out may equal x. */
void veil_ntt_rows(int64_t *out, const int64_t *x, int64_t rows, int64_t limbs, int64_t n,
                   const uint64_t *qs, const uint64_t *const *tabs, int inverse) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t limb = r % limbs;
        uint64_t *a = (uint64_t *)(out + r * n);
        const int64_t *src = x + r * n;
        if (inverse)
            inverse_row(a, src, n, qs[limb], tabs[limb]);
        else
            forward_row(a, src, n, qs[limb], tabs[limb]);
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

/* out[r, o, e] = sum_k a_k[r, gather(e)] * w[k * outs + o][e] mod q(limb of e), for rows r in
 * [0, rows), outputs o in [0, outs <= MAC_OUTS), and flat positions e of the [L, N] plane.
 * a_k[r] starts at a[k] + r * a_row_stride; gather(e) = e, or with an index (a Galois
 * automorphism, [N]) limb * n + index[e - limb * n]. w[.]: [L, N], shared by every row
 * (w_row_stride 0), or one per w_row_div consecutive rows (a batch's per-session plaintexts:
 * row r reads w[.] + (r / w_row_div) * w_row_stride); out: [rows, outs, L, N].
 * The terms a may be lazy, in (-q, q); the weights w are canonical.
 * dot_plain is outs = 1 without an index; the key inner product outs = 2 (the key's halves),
 * one pass over the digits for both. A block of positions is done for every row before the
 * next block, so a batch reads each weight block from memory once. Terms are summed in 128
 * bits, reduced every `per` terms so the sum cannot wrap (per = the most products of
 * canonical operands that fit). */
void veil_mac(int64_t *out, const int64_t *const *a, int64_t a_row_stride, const int64_t *index,
              const int64_t *const *w, int64_t w_row_stride, int64_t w_row_div, int64_t terms, int64_t outs,
              int64_t rows, int64_t limbs, int64_t n, const uint64_t *qs) {
    const int64_t plane = limbs * n, per_limb = (n + MAC_BLOCK - 1) / MAC_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < limbs * per_limb; b++) {
        u128 acc[MAC_OUTS][MAC_BLOCK];
        uint64_t x[MAC_BLOCK];
        const int64_t limb = b / per_limb, pos = (b % per_limb) * MAC_BLOCK, e = limb * n + pos;
        const int64_t len = n - pos < MAC_BLOCK ? n - pos : MAC_BLOCK;
        const uint64_t q = qs[limb], r64 = (uint64_t)(((u128)1 << 64) % q);
        const uint64_t r64p = shoup(r64, q), one_p = shoup(1, q);
        const u128 prod_max = (u128)(q - 1) * (q - 1);
        const int64_t per = (int64_t)((~(u128)0 - q) / (prod_max ? prod_max : 1));
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t o = 0; o < outs; o++)
                for (int64_t j = 0; j < len; j++) acc[o][j] = 0;
            int64_t held = 0;
            for (int64_t k = 0; k < terms; k++) {
                if (held == per) {
                    for (int64_t o = 0; o < outs; o++)
                        for (int64_t j = 0; j < len; j++) acc[o][j] = reduce128(acc[o][j], q, r64, r64p, one_p);
                    held = 0;
                }
                const int64_t *src = a[k] + r * a_row_stride + limb * n;
                if (index)
                    for (int64_t j = 0; j < len; j++) x[j] = lift(src[index[pos + j]], q);
                else
                    for (int64_t j = 0; j < len; j++) x[j] = lift(src[pos + j], q);
                for (int64_t o = 0; o < outs; o++) {
                    const uint64_t *y = (const uint64_t *)(w[k * outs + o] + (r / w_row_div) * w_row_stride + e);
                    for (int64_t j = 0; j < len; j++) acc[o][j] += (u128)x[j] * y[j];
                }
                held++;
            }
            for (int64_t o = 0; o < outs; o++) {
                int64_t *dst = out + (r * outs + o) * plane + e;
                for (int64_t j = 0; j < len; j++) dst[j] = (int64_t)reduce128(acc[o][j], q, r64, r64p, one_p);
            }
        }
    }
}
