"""The SDK's server sessions: the plaintext split session (one round trip per step) and the
protected one (``3(L-k)`` round trips per step, driven by ``veil.protected.client``).

Both run the client's own layers [0, k) with their own KV cache and commit their local state
only once the server accepted the step, so the two halves stay in step.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from veil.crypto.wire import CONTENT_TYPE, HiddenReply, HiddenStep
from veil.engine.model import LayerKV
from veil.protected.protocol import MAX_SPAN, ProtectedMessage

if TYPE_CHECKING:
    from veil.client.sdk import GenerationStats, VeilClient

__all__ = ["VeilError", "SplitSession", "ProtectedSession"]


class VeilError(RuntimeError):
    """An error answer (or a client-side failure named like one). ``retry_after_s``: the
    server's Retry-After, where it sent one (a limit, device memory)."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None):
        super().__init__(f"{status} {code}: {message}" + (f" (retry after {retry_after_s:g} s)"
                                                          if retry_after_s is not None else ""))
        self.status, self.code, self.message, self.retry_after_s = status, code, message, retry_after_s


class SplitSession:
    """One server session of the split path: local layers [0, k) with their own KV cache, and
    the server's layers [k, L) behind one round trip per step."""

    def __init__(self, client: VeilClient, sid: str, info: dict):
        self.client, self.id, self.info = client, sid, info
        self.step = 0
        self.pos = 0  # tokens already in both halves' caches
        self.local_kv: list[LayerKV | None] = [None] * client.half.k

    def forward(self, ids: list[int], stats: GenerationStats | None = None) -> torch.Tensor:
        """Feed tokens at the next positions; returns the logits [vocab] after the last one."""
        model = self.client.model
        h, local_kv, positions = self._local_layers(ids, stats)
        out = self._round_trip(HiddenStep(self.id, self.step + 1, h, positions.tolist()), stats)
        # Commit local state only once the server accepted the step, so both halves stay in step.
        self.local_kv, self.step, self.pos = local_kv, self.step + 1, self.pos + len(ids)
        cpu = time.thread_time()
        with torch.inference_mode():
            logits = model.logits(out[-1:])[0]
        if stats is not None:
            stats.client_cpu_s += time.thread_time() - cpu
        return logits

    def _local_layers(self, ids: list[int], stats: GenerationStats | None):
        """Embedding and layers [0, k) for tokens at the next positions (CPU time accounted)."""
        model = self.client.model
        cpu = time.thread_time()
        with torch.inference_mode():
            positions = torch.arange(self.pos, self.pos + len(ids))
            h, local_kv = model.forward_layers(model.embed(torch.tensor(ids)), positions, self.local_kv)
        if stats is not None:
            stats.client_cpu_s += time.thread_time() - cpu
        return h, local_kv, positions

    def _round_trip(self, msg: HiddenStep, stats: GenerationStats | None) -> torch.Tensor:
        body = msg.to_bytes()
        c = self.client
        r = c._post(f"/v1/sessions/{self.id}/steps", content=body, headers={"Content-Type": CONTENT_TYPE})
        if stats is not None:
            stats.bytes_up += len(body)
            stats.bytes_down += len(r.content)
            stats.round_trips += 1
        reply = HiddenReply.from_bytes(r.content)
        if reply.step != msg.step or tuple(reply.hidden.shape) != tuple(msg.hidden.shape):
            raise VeilError(502, "bad_reply", "the server's reply does not match the step")
        return reply.hidden

    def close(self) -> None:
        self.client._delete_session(self.id)


class ProtectedSession(SplitSession):
    """One server session of the protected path: local layers [0, k) in the clear, layers [k, L)
    on the server on ciphertexts under this client's key, ``3(L-k)`` round trips per step: a
    decode token, or a prompt span of up to ``prefill_span`` positions."""

    def __init__(self, client: VeilClient, sid: str, info: dict):
        from veil.protected.client import ProtectedClientState

        super().__init__(client, sid, info)
        cfg = client.cfg
        self.state = ProtectedClientState(client.he, cfg, client.half.k, cfg.num_layers, sid, record_values=False)
        self.span = min(client.prefill_span, int(info.get("max_span", 1)))
        self._verified = 0  # positions of the last verify step not yet kept or dropped
        # the audit trail of what this client decrypted (kinds only), for tests and the curious
        client.last_protected_transcript = self.state.transcript

    def forward(self, ids: list[int], stats: GenerationStats | None = None) -> torch.Tensor:
        model = self.client.model
        h, local_kv, _ = self._local_layers(ids, stats)
        rows = h.double().numpy()
        for a in range(0, len(rows), self.span):  # a prompt goes up in spans of several positions
            h_last = self._span(rows[a : a + self.span], stats)
        self.local_kv, self.pos = local_kv, self.pos + len(ids)
        cpu = time.thread_time()
        with torch.inference_mode():
            logits = model.logits(torch.from_numpy(h_last).to(torch.float32)[None])[0]
        if stats is not None:
            stats.client_cpu_s += time.thread_time() - cpu
        return logits

    def verify(self, ids: list[int], stats: GenerationStats | None = None) -> torch.Tensor:
        """Feed ``ids`` (a sampled token and the drafts after it) as one verify step: every
        position's logits come back, [len(ids), vocab]. ``keep`` then says how many stay."""
        if not 1 <= len(ids) <= MAX_SPAN:
            raise ValueError(f"a verify step carries 1..{MAX_SPAN} tokens")
        model = self.client.model
        h, local_kv, _ = self._local_layers(ids, stats)
        rows = self._span(h.double().numpy(), stats, verify=True)
        self.local_kv, self.pos, self._verified = local_kv, self.pos + len(ids), len(ids)
        cpu = time.thread_time()
        with torch.inference_mode():
            logits = model.logits(torch.from_numpy(rows).to(torch.float32))
        if stats is not None:
            stats.client_cpu_s += time.thread_time() - cpu
        return logits

    def keep(self, n: int) -> None:
        """Keep the first ``n`` positions of the last verify step: the others leave this client's
        local KV cache now and the server's encrypted one on the next step."""
        if not 1 <= n <= self._verified:
            raise ValueError(f"keep 1..{self._verified} positions of the last verify step")
        self.pos -= self._verified - n
        self.local_kv = [None if kv is None else LayerKV(kv.k[:, : self.pos], kv.v[:, : self.pos])
                         for kv in self.local_kv]
        self.state.rollback(self.pos)
        self._verified = 0

    def _span(self, rows: np.ndarray, stats: GenerationStats | None, verify: bool = False) -> np.ndarray:
        """Run positions ``rows`` (one row each) through the server's layers together: every
        round trip carries all of them. Returns h_L of the last one (of every one: ``verify``)."""
        from veil.protected.client import HeadroomExceeded

        c = self.client
        cpu = time.thread_time()
        msg = self.state.token_message(rows, verify=verify)
        while True:
            body = msg.to_bytes()
            if stats is not None:
                stats.client_cpu_s += time.thread_time() - cpu
            r = c._post(f"/v1/sessions/{self.id}/steps", content=body, headers={"Content-Type": CONTENT_TYPE})
            cpu = time.thread_time()
            if stats is not None:
                stats.bytes_up += len(body)
                stats.bytes_down += len(r.content)
                stats.round_trips += 1
            reply = ProtectedMessage.from_bytes(r.content, max_bytes=1 << 30)
            if reply.step != msg.step:
                raise VeilError(502, "bad_reply", "the server's reply does not match the step")
            if stats is not None:  # where the bytes go: each message kind, each direction
                for key, n in ((f"up.{msg.kind}", len(body)), (f"down.{reply.kind}", len(r.content))):
                    stats.bytes_by_kind[key] = stats.bytes_by_kind.get(key, 0) + n
            try:
                nxt = self.state.handle(reply)
            except HeadroomExceeded as e:  # the values may have wrapped: nothing to compute on
                raise VeilError(422, "headroom_exceeded", str(e)) from None
            if isinstance(nxt, np.ndarray):
                if stats is not None:
                    stats.client_cpu_s += time.thread_time() - cpu
                return nxt
            msg = nxt
