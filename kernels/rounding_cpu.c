/* The rounded downloads' coefficient maps (veil.crypto.rounding) in one pass per coefficient.
 *
 * veil_round_pack: residues r_i of c in [0, Q) -> round(c * 2^bits / Q) mod 2^bits, written
 * bit-packed (LSB first, coefficient after coefficient). With f_i = r_i * K_i mod q_i,
 * K_i = (Q/q_i)^-1 * 2^bits mod q_i:  c * 2^bits / Q = sum_i f_i / q_i + a  (mod 2^bits), where
 * a = sum_i f_i * C_i mod 2^bits and C_i = -q_i^-1 mod 2^bits (W 32-bit limbs). The fractions
 * decide the rounding only: up = floor(sum_i f_i / q_i + 1/2) in doubles (each term within a
 * few ulps of the twin's, rounding._round). A coefficient whose sum lies within 2^-30 of a half
 * is flagged (return value: how many) and the caller takes the exact path for the whole
 * ciphertext; every other one has the same `up` in both (their sums differ by ~1e-15), hence
 * the same bytes. Products modulo q_i: Shoup's, with constants precomputed per prime.
 *
 * veil_unround: the packed values v -> the residues of round(v * Q / 2^bits):
 * low = (v * Q + 2^(bits-1)) mod 2^bits, and each residue is (2^(bits-1) - low) * 2^-bits mod q_i.
 *
 * Layout: residues [P][L][N] uint64 (P polynomials of N coefficients); coefficient x = p*N + j.
 * OpenMP: the coefficients go in runs of 8, each run starting on a byte (8 * bits bits).
 */
#include <stdint.h>
#include <string.h>

typedef unsigned __int128 u128;

#define MAXW 16 /* 512 bits: more than any modulus of the chain */

/* a * w mod q by Shoup's product, wp = floor(w * 2^64 / q) (q < 2^62; the caller's constants) */
static inline uint64_t mul_shoup(uint64_t a, uint64_t w, uint64_t wp, uint64_t q) {
    uint64_t r = a * w - (uint64_t)(((u128)a * wp) >> 64) * q;
    return r >= q ? r - q : r;
}

/* a [W] limbs += f (< 2^64) * c [W] limbs, column sums; each column stays far below 2^64 */
static inline void mul_add(uint64_t *acc, uint64_t f, const uint32_t *c, int w) {
    uint64_t f0 = f & 0xFFFFFFFFu, f1 = f >> 32;
    for (int k = 0; k < w; k++) {
        uint64_t p0 = f0 * c[k];
        acc[k] += p0 & 0xFFFFFFFFu;
        if (k + 1 < w) {
            acc[k + 1] += p0 >> 32;
            uint64_t p1 = f1 * c[k];
            acc[k + 1] += p1 & 0xFFFFFFFFu;
            if (k + 2 < w) acc[k + 2] += p1 >> 32;
        }
    }
}

static inline void carry(uint64_t *acc, int w, int bits) {
    for (int k = 0; k + 1 < w; k++) {
        acc[k + 1] += acc[k] >> 32;
        acc[k] &= 0xFFFFFFFFu;
    }
    int top = bits - 32 * (w - 1);
    acc[w - 1] &= (1ULL << top) - 1; /* top in [1, 32] */
}

int64_t veil_round_pack(uint8_t *out, const uint64_t *res, int64_t polys, int64_t limbs, int64_t n,
                        const uint64_t *q, const uint64_t *k, const uint64_t *kp, const double *qinv,
                        const uint32_t *c, int w, int bits) {
    int64_t count = polys * n, runs = (count + 7) / 8, near = 0;
    int top = bits - 32 * (w - 1);
#pragma omp parallel for schedule(static) reduction(+ : near)
    for (int64_t g = 0; g < runs; g++) {
        uint8_t *o = out + g * bits;
        uint64_t bitbuf = 0;
        int have = 0;
        int64_t end = g * 8 + 8 < count ? g * 8 + 8 : count;
        int64_t pj = (g * 8) / n, j0 = (g * 8) % n; /* polynomial and coefficient of the run's first */
        for (int64_t x = g * 8; x < end; x++, j0 = j0 + 1 == n ? (pj++, 0) : j0 + 1) {
            const uint64_t *r = res + pj * limbs * n + j0;
            uint64_t acc[MAXW];
            memset(acc, 0, sizeof(uint64_t) * w);
            double frac = 0.0;
            for (int64_t i = 0; i < limbs; i++) {
                uint64_t f = mul_shoup(r[i * n], k[i], kp[i], q[i]);
                frac += (double)f * qinv[i];
                mul_add(acc, f, c + i * w, w);
            }
            /* frac is in [0, limbs): truncation is floor (no libm call on a baseline x86-64) */
            uint64_t up = (uint64_t)(frac + 0.5);
            double off = frac - (double)(uint64_t)frac - 0.5;
            near += (off < 0 ? -off : off) < 0x1p-30;
            acc[0] += up;
            carry(acc, w, bits);
            for (int j = 0; j < w; j++) {
                int nb = j + 1 < w ? 32 : top;
                bitbuf |= acc[j] << have;
                have += nb;
                while (have >= 8) {
                    *o++ = (uint8_t)bitbuf;
                    bitbuf >>= 8;
                    have -= 8;
                }
            }
        }
        if (have > 0) *o = (uint8_t)bitbuf; /* the last, partial run only */
    }
    return near;
}

void veil_unround(uint64_t *res, const uint8_t *body, int64_t polys, int64_t limbs, int64_t n,
                  const uint32_t *qlimbs, int w, int bits, const uint64_t *q, const uint64_t *radix,
                  const uint64_t *radixp, const uint64_t *half, const uint64_t *inv, const uint64_t *invp) {
    int64_t count = polys * n, runs = (count + 7) / 8;
    int top = bits - 32 * (w - 1);
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < runs; g++) {
        const uint8_t *p = body + g * bits;
        uint64_t bitbuf = 0;
        int have = 0;
        int64_t end = g * 8 + 8 < count ? g * 8 + 8 : count;
        int64_t pj = (g * 8) / n, j0 = (g * 8) % n;
        for (int64_t x = g * 8; x < end; x++, j0 = j0 + 1 == n ? (pj++, 0) : j0 + 1) {
            uint64_t v[MAXW], low[MAXW];
            memset(low, 0, sizeof(uint64_t) * w);
            for (int j = 0; j < w; j++) {
                int nb = j + 1 < w ? 32 : top;
                while (have < nb) {
                    bitbuf |= (uint64_t)(*p++) << have;
                    have += 8;
                }
                v[j] = bitbuf & ((1ULL << nb) - 1);
                bitbuf >>= nb;
                have -= nb;
            }
            for (int j = 0; j < w; j++) { /* low = v * Q mod 2^bits, column sums */
                for (int kk = 0; j + kk < w; kk++) {
                    uint64_t prod = v[j] * qlimbs[kk];
                    low[j + kk] += prod & 0xFFFFFFFFu;
                    if (j + kk + 1 < w) low[j + kk + 1] += prod >> 32;
                }
            }
            low[(bits - 1) / 32] += 1ULL << ((bits - 1) % 32);
            carry(low, w, bits);
            uint64_t *out = res + pj * limbs * n + j0;
            for (int64_t i = 0; i < limbs; i++) {
                uint64_t lm = 0; /* low mod q_i = sum_j low_j * 2^(32j) mod q_i */
                for (int j = 0; j < w; j++) {
                    lm += mul_shoup(low[j], radix[i * w + j], radixp[i * w + j], q[i]);
                    lm = lm >= q[i] ? lm - q[i] : lm;
                }
                uint64_t d = half[i] >= lm ? half[i] - lm : half[i] + q[i] - lm;
                out[i * n] = mul_shoup(d, inv[i], invp[i], q[i]);
            }
        }
    }
}
