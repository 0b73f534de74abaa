"""The paged KV cache: one preallocated block pool per layer, block tables per sequence.

Every layer's keys and values live in `[num_blocks, block_size, num_kv_heads, head_dim]`
tensors; a sequence owns a list of block ids (its block table), the same ids in every layer.
Blocks are reference counted. A *full* block of a token sequence is registered under a chained
SHA-256 hash (tenant salt, previous block's hash, the block's token ids), so a later sequence
of the same tenant with the same prefix reuses it instead of recomputing it. The salt is an
HMAC of the tenant name under a server-side secret: two tenants never share a block, so one
cannot learn another's prompts from cache hits or their timing. A shared block is never
written in place: `ensure_writable` copies it first (copy-on-write).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import mmap
import secrets
from collections import deque
from dataclasses import dataclass, field

import torch


def zeroed_pool(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A zero-filled pool tensor. On CPU it lives in an anonymous memory mapping, which the OS
    fills with zero pages on first touch: only the blocks sequences have written become
    resident. ``torch.zeros`` writes, and so keeps resident, the whole pool (a 2 GB pool on a
    server that serves mostly protected sessions, whose KV cache is elsewhere, is 2 GB of RSS)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    nbytes = count * torch.empty(0, dtype=dtype).element_size()
    # the tensor holds a reference to the mapping: it is unmapped when the tensor is freed
    return torch.frombuffer(mmap.mmap(-1, max(nbytes, 1)), dtype=dtype, count=count).view(shape)


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and registered for sharing


@dataclass
class BlockTable:
    """A sequence's view of the pool."""

    blocks: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)  # chained hashes of its leading full blocks
    num_cached_tokens: int = 0  # prefix tokens whose KV came from shared blocks
    # Leading entries already mirrored in the engine's device block table (DeviceBlockTables):
    # appends leave it, a copy-on-write replacement or a free lowers it.
    synced: int = 0


class PagedKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 server_secret: bytes | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the pool needs at least one block of at least one slot")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = [zeroed_pool(shape, dtype, device) for _ in range(num_layers)]
        self.v = [zeroed_pool(shape, dtype, device) for _ in range(num_layers)]
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))
        self.by_hash: dict[bytes, int] = {}
        self._secret = server_secret or secrets.token_bytes(32)
        self._salts: dict[str, bytes] = {}  # tenant -> salt (authenticated tenants: a bounded set)
        self.hits = self.lookups = 0  # prefix-cache statistics (blocks)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    # -- accounting ----------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def utilization(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- hashing -------------------------------------------------------------------------------
    def tenant_salt(self, tenant: str) -> bytes:
        salt = self._salts.get(tenant)
        if salt is None:
            salt = self._salts[tenant] = hmac.new(self._secret, tenant.encode(), hashlib.sha256).digest()
        return salt

    def chain_hash(self, salt: bytes, prev: bytes | None, token_ids: list[int]) -> bytes:
        h = hashlib.sha256(salt)
        h.update(prev or b"\0" * 32)
        h.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
        return h.digest()

    # -- allocation ----------------------------------------------------------------------------
    def _take_free(self) -> int:
        bid = self.free.popleft()
        b = self.blocks[bid]
        if b.hash is not None and self.by_hash.get(b.hash) == bid:
            del self.by_hash[b.hash]  # its cached content is being overwritten now
        b.hash, b.ref_count = None, 1
        return bid

    def _release(self, bid: int) -> None:
        b = self.blocks[bid]
        b.ref_count -= 1
        if b.ref_count == 0:
            # Keep the hash registered: a freed block still serves prefix hits until reused.
            self.free.append(bid)

    def allocate_prefix(self, table: BlockTable, tenant: str, token_ids: list[int]) -> int:
        """First allocation of a token sequence: reuse this tenant's cached full blocks of the
        prompt's prefix. Returns the number of tokens whose KV is already present."""
        assert not table.blocks
        salt, prev = self.tenant_salt(tenant), None
        for i in range(len(token_ids) // self.block_size):
            h = self.chain_hash(salt, prev, token_ids[i * self.block_size:(i + 1) * self.block_size])
            self.lookups += 1
            bid = self.by_hash.get(h)
            if bid is None:
                break
            b = self.blocks[bid]
            if b.ref_count == 0:
                self.free.remove(bid)
            b.ref_count += 1
            self.hits += 1
            table.blocks.append(bid)
            table.hashes.append(h)
            prev = h
        table.num_cached_tokens = len(table.blocks) * self.block_size
        return table.num_cached_tokens

    def grow(self, table: BlockTable, num_tokens: int) -> None:
        """Make the table hold `num_tokens` slots."""
        need = self.blocks_for(num_tokens) - len(table.blocks)
        if need > len(self.free):
            raise MemoryError("KV pool exhausted")
        for _ in range(need):
            table.blocks.append(self._take_free())

    def free_table(self, table: BlockTable) -> None:
        for bid in reversed(table.blocks):
            self._release(bid)
        table.blocks.clear()
        table.hashes.clear()
        table.num_cached_tokens = 0
        table.synced = 0

    def ensure_writable(self, table: BlockTable, first_pos: int, last_pos: int) -> None:
        """Copy-on-write: before positions [first_pos, last_pos] are written, give the table
        private copies of any shared block they fall in."""
        last_idx = min(last_pos // self.block_size, len(table.blocks) - 1)
        for idx in range(first_pos // self.block_size, last_idx + 1):
            bid = table.blocks[idx]
            if self.blocks[bid].ref_count > 1:
                new = self._take_free()
                for layer in range(self.num_layers):
                    self.k[layer][new].copy_(self.k[layer][bid])
                    self.v[layer][new].copy_(self.v[layer][bid])
                self._release(bid)
                table.blocks[idx] = new
                table.synced = min(table.synced, idx)
                del table.hashes[idx:]

    def register_full_blocks(self, table: BlockTable, tenant: str, token_ids: list[int], num_computed: int) -> None:
        """After a step, publish newly completed blocks (whose KV is now computed) for sharing."""
        if num_computed // self.block_size <= len(table.hashes):
            return  # no block completed: most decode steps
        salt = self.tenant_salt(tenant)
        for i in range(len(table.hashes), num_computed // self.block_size):
            prev = table.hashes[-1] if table.hashes else None
            h = self.chain_hash(salt, prev, token_ids[i * self.block_size:(i + 1) * self.block_size])
            table.hashes.append(h)
            b = self.blocks[table.blocks[i]]
            if h not in self.by_hash:
                b.hash = h
                self.by_hash[h] = b.id

    def slot(self, table: BlockTable, pos: int) -> int:
        return table.blocks[pos // self.block_size] * self.block_size + pos % self.block_size
