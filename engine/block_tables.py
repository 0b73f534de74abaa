"""The engine's block tables on its device, kept up to date instead of rebuilt every step.

Each sequence the engine is running owns one row of a [rows, max_blocks] int32 tensor on the
device. Before a step, only the entries a sequence's table gained or changed since the last
step are written (a decode step writes nothing until a sequence crosses a block boundary), all
of the step's in one copy and one scatter (`stage` each sequence, then `flush`: with ~134
sequences about eight cross a boundary every step, and a copy each was ~30% of `prepare` in a
line profile); a step's block tables are then one index_select of its sequences' rows.
"""

from __future__ import annotations

import torch

from veil.engine.kv_cache import BlockTable
from veil.kernels.host import to_device


class DeviceBlockTables:
    def __init__(self, max_blocks: int, device: torch.device, rows: int = 64):
        self.max_blocks, self.device = max_blocks, device
        self.buf = torch.zeros(rows, max_blocks, dtype=torch.int32, device=device)
        self.row_of: dict[int, int] = {}  # sequence id -> row
        self.free_rows = list(range(rows - 1, -1, -1))
        self._writes: list[int] = []  # staged (row, column, block id) triples, flat
        self._staged: list[tuple[BlockTable, int]] = []  # tables staged since the flush, synced before

    def row(self, seq_id: int) -> int:
        row = self.row_of.get(seq_id)
        if row is None:
            if not self.free_rows:  # grow: double the rows (rare; sequences release theirs)
                n = self.buf.shape[0]
                self.buf = torch.cat([self.buf, torch.zeros_like(self.buf)])
                self.free_rows = list(range(2 * n - 1, n - 1, -1))
            row = self.row_of[seq_id] = self.free_rows.pop()
        return row

    def release(self, seq_id: int) -> None:
        row = self.row_of.pop(seq_id, None)
        if row is not None:
            self.free_rows.append(row)

    def stage(self, seq_id: int, table: BlockTable) -> int:
        """Stage the entries of `table` the device has not seen yet for the next `flush`; returns
        the row."""
        row = self.row(seq_id)
        n = len(table.blocks)
        if n > self.max_blocks:
            raise ValueError(f"a sequence of {n} blocks exceeds the engine's {self.max_blocks}")
        if table.synced < n:
            self._staged.append((table, table.synced))
            for col in range(table.synced, n):
                self._writes += (row, col, table.blocks[col])
            table.synced = n
        return row

    def flush(self) -> None:
        """Write every staged entry: one host-to-device copy, one scatter."""
        if self._writes:
            w = to_device(self._writes, self.device, torch.long).view(-1, 3)
            self.buf[w[:, 0], w[:, 1]] = w[:, 2].to(torch.int32)
        self._writes, self._staged = [], []

    def discard(self) -> None:
        """Forget what was staged since the last flush, as when the flush itself ran out of
        device memory: those tables count the entries as not on the device, and the next step
        stages them again (else its sequences would read blocks the device never got)."""
        for table, synced in reversed(self._staged):
            table.synced = synced
        self._writes, self._staged = [], []

    def sync(self, seq_id: int, table: BlockTable) -> int:
        """`stage` and `flush` one sequence's table; returns the row."""
        row = self.stage(seq_id, table)
        self.flush()
        return row
