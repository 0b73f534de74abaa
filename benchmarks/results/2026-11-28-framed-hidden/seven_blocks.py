"""Can 7 blocks of W_qkv (960x576) fit the hidden layout's two frames with 84-diagonal gaps, as
over one period? A fold of 4 block frames per frame at stride s (960 <= s) and a frame stride
4096 + d puts block cells at f*(4096 + d) + t*s, t < 4, one of the 8 cells empty; each block
needs its input on [cell, cell + 960 + n1*n2) inside its frame's 4032 whole-copy slots (n1 = 16),
and the last frame's fold frames must not wrap (4096 + d + 3s + 960 <= 8192, so d <= 256 and,
with 4 blocks in a frame, s <= 992). Prints the smallest widest gap between the 7 blocks'
diagonal offsets (the diagonals per block) and where it is reached.

    python benchmarks/results/2026-11-28-framed-hidden/seven_blocks.py
"""

rows, cols, frame, valid, slots = 960, 576, 4096, 4032, 8192
best = None
for s in range(960, 1100):
    for d in range(0, 257):
        if frame + d + 3 * s + rows > slots:
            continue
        for empty in range(8):
            cells = [(f, t) for f in range(2) for t in range(4) if 4 * f + t != empty]
            offs = sorted((f * d + t * s) % cols for f, t in cells)
            if len(set(offs)) < 7:
                continue
            k = max((offs[(i + 1) % 7] - offs[i]) % cols for i in range(7))
            if all(f * d + t * s + rows + 16 * -(-k // 16) <= valid for f, t in cells) and (best is None or k < best[0]):
                best = (k, s, d, empty)
print(f"smallest widest gap {best[0]} (stride {best[1]}, frame offset {best[2]}, empty cell {best[3]})")
