/* Bit-packed runs of residues (veil.crypto.bitpack): the wire form of every ciphertext and key
 * residue that travels whole, at its prime's width.
 *
 * Run r holds the n values of row r, value after value, each in widths[r] bits, least
 * significant bit first (numpy's bitorder="little"), and starts on a byte: n * widths[r] is a
 * multiple of 8 (n is a multiple of 8). Both loops keep a 64-bit word of bits and move it to or
 * from memory eight bytes at a time, never past a run's last byte. x86 and the other CPUs torch
 * ships for are little-endian: memcpy moves the bytes in order.
 *
 * veil_unpack_runs returns how many values are not below their row's bound (a residue not
 * below its prime: the caller refuses the bytes); bounds may be NULL (no check).
 */
#include <stdint.h>
#include <string.h>

void veil_pack_runs(uint8_t *out, const uint64_t *x, int64_t rows, int64_t n, const int32_t *widths) {
    for (int64_t r = 0; r < rows; r++) {
        const int w = widths[r];
        const uint64_t mask = w == 64 ? ~0ULL : (1ULL << w) - 1;
        const uint64_t *v = x + r * n;
        uint64_t acc = 0;
        int have = 0; /* bits in acc, < 64 */
        for (int64_t i = 0; i < n; i++) {
            const uint64_t a = v[i] & mask;
            acc |= a << have;
            if (have + w >= 64) {
                memcpy(out, &acc, 8);
                out += 8;
                acc = have ? a >> (64 - have) : 0; /* the bits of a that did not fit */
                have += w - 64;
            } else {
                have += w;
            }
        }
        memcpy(out, &acc, (size_t)(have / 8)); /* n * w is a multiple of 8: so is have */
        out += have / 8;
    }
}

int64_t veil_unpack_runs(uint64_t *x, const uint8_t *buf, int64_t rows, int64_t n, const int32_t *widths,
                         const uint64_t *bounds) {
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int w = widths[r];
        const uint64_t mask = w == 64 ? ~0ULL : (1ULL << w) - 1;
        const uint64_t bound = bounds ? bounds[r] : 0;
        const uint8_t *end = buf + n * w / 8;
        uint64_t *v = x + r * n;
        uint64_t acc = 0;
        int have = 0; /* unread bits in acc, < 64 */
        for (int64_t i = 0; i < n; i++) {
            uint64_t a;
            if (have >= w) { /* w < 64 here */
                a = acc & mask;
                acc >>= w;
                have -= w;
            } else {
                uint64_t next = 0; /* the next eight bytes, fewer at the run's end */
                const int64_t left = end - buf;
                memcpy(&next, buf, (size_t)(left >= 8 ? 8 : left));
                buf += left >= 8 ? 8 : left;
                const int used = w - have; /* 1..64 */
                a = (acc | (next << have)) & mask; /* have < 64 */
                acc = used == 64 ? 0 : next >> used;
                have = 64 - used;
            }
            v[i] = a;
            bad += bounds && a >= bound;
        }
        buf = end;
    }
    return bad;
}
