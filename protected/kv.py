"""A protected session's encrypted KV cache of one layer: append a span, take positions back off.

Chunk ``c`` holds positions ``8c .. 8c+7``: each position's key (and value) is rotated into its
block of the chunk and *added* to the chunk's ciphertext (``Circuit.kv_blocks``). Ciphertext
addition is exact modular arithmetic, so a span's positions can be taken back off exactly: keep
the touched chunks as they were before the span and each position's blocks, then rebuild the
chunks from the old ones plus the blocks of the positions that stay. A speculative step uses it:
the drafted positions the client rejects leave no trace in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from veil.crypto.backend import Ciphertext

__all__ = ["LayerKV", "SpanUndo", "append_span", "truncate_span"]


@dataclass
class LayerKV:
    keys: list = field(default_factory=list)  # chunk ciphertexts at Levels.keys
    values: list = field(default_factory=list)  # at Levels.kv


@dataclass(frozen=True)
class SpanUndo:
    """How to take a span's positions back off one layer's cache."""

    start: int  # the span's first position
    chunks: tuple[int, ...]  # the chunk indices the span touched
    before: tuple[tuple[Ciphertext, Ciphertext] | None, ...]  # those chunks before the span (None: new)
    blocks: tuple[tuple[Ciphertext, Ciphertext], ...]  # each span position's key and value block
    nbytes: int  # memory these ciphertexts hold beyond the cache itself


def _bytes(be, pair) -> int:
    return sum(be.nbytes(ct) for ct in pair)


def append_span(be, kv: LayerKV, start: int, blocks: list[tuple[Ciphertext, Ciphertext]], per_chunk: int,
                undo: bool = False) -> tuple[LayerKV, int, SpanUndo | None]:
    """A new cache with the span's blocks (position ``start + i`` gets ``blocks[i]``) added; the
    cache bytes it adds; with ``undo``, what ``truncate_span`` needs (``kv`` itself is unchanged)."""
    out, added = LayerKV(list(kv.keys), list(kv.values)), 0
    chunks = sorted({(start + i) // per_chunk for i in range(len(blocks))})
    before = tuple((kv.keys[c], kv.values[c]) if c < len(kv.keys) else None for c in chunks)
    for i, (k_b, v_b) in enumerate(blocks):
        c = (start + i) // per_chunk
        if c < len(out.keys):
            out.keys[c], out.values[c] = be.add(out.keys[c], k_b), be.add(out.values[c], v_b)
        else:
            out.keys.append(k_b)
            out.values.append(v_b)
            added += be.nbytes(k_b) + be.nbytes(v_b)
    if not undo:
        return out, added, None
    held = sum(_bytes(be, pair) for pair in blocks) + sum(_bytes(be, pair) for pair in before if pair)
    return out, added, SpanUndo(start, tuple(chunks), before, tuple(blocks), held)


def truncate_span(be, kv: LayerKV, undo: SpanUndo, keep: int, per_chunk: int) -> tuple[LayerKV, int]:
    """The cache with only the span's first ``keep`` positions; the cache bytes that frees."""
    if not 0 <= keep <= len(undo.blocks):
        raise ValueError(f"keep {keep} outside [0, {len(undo.blocks)}]")
    out, freed = LayerKV(list(kv.keys), list(kv.values)), 0
    for c, old in zip(undo.chunks, undo.before, strict=True):
        kept = [undo.blocks[i] for i in range(keep) if (undo.start + i) // per_chunk == c]
        if old is None and not kept:  # a chunk the span created and nothing of it stays
            freed += _bytes(be, (out.keys[c], out.values[c]))
            out.keys[c] = out.values[c] = None
            continue
        k, v = old if old is not None else kept.pop(0)
        for k_b, v_b in kept:
            k, v = be.add(k, k_b), be.add(v, v_b)
        out.keys[c], out.values[c] = k, v
    while out.keys and out.keys[-1] is None:  # created chunks sit at the end
        out.keys.pop()
        out.values.pop()
    return out, freed
