/* Bit-packed runs of residues (veil.crypto.bitpack): the wire form of every ciphertext and key
 * residue that travels whole, at its prime's width.
 *
 * Run r holds the n values of row r, value after value, each in widths[r] bits, least
 * significant bit first (numpy's bitorder="little"), and starts on a byte: n * widths[r] is a
 * multiple of 8 (n is a multiple of 8). Both loops are branch-free (with a 36-bit width a
 * branch on "the word is full" goes either way at random, and mispredicting it cost most of
 * the time): the packer writes its 64-bit accumulator after every value and moves on by 8
 * bytes when it filled, the unpacker reads each value from the two words around its bit offset.
 * So the caller leaves 8 bytes of slack after the packer's output and 16 after the unpacker's
 * input. x86 and the other CPUs torch ships for are little-endian: memcpy moves bytes in order.
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
            memcpy(out, &acc, 8);
            const int full = have + w >= 64;
            out += full ? 8 : 0;
            /* the bits of a that did not fit: a >> (64 - have), and 0 when have == 0 */
            acc = full ? (a >> 1) >> (63 - have) : acc;
            have += w - (full ? 64 : 0);
        }
        memcpy(out, &acc, 8); /* n * w is a multiple of 8: have / 8 bytes of it belong to the run */
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
        uint64_t *v = x + r * n;
        for (int64_t i = 0; i < n; i++) {
            const int64_t bit = i * w;
            const int shift = (int)(bit & 7);
            uint64_t lo, hi;
            memcpy(&lo, buf + (bit >> 3), 8);
            memcpy(&hi, buf + (bit >> 3) + 8, 8);
            /* up to 71 bits from the byte: lo's top 64 - shift, then hi's low ones */
            const uint64_t a = ((lo >> shift) | ((hi << 1) << (63 - shift))) & mask;
            v[i] = a;
            bad += bounds && a >= bound;
        }
        buf += n * w / 8;
    }
    return bad;
}
