"""The client SDK: local layers, the split protocol drivers, local sampling.

The client runs the tokenizer, the embedding and layers [0, k) on the tenant's machine, sends
hidden states to the server (which runs layers [k, L)), and applies the final norm and LM head
to what comes back. Sampling happens here; the server never sees token ids.

Two modes:
* ``plaintext``: one round trip per step carries the hidden states in the clear (trusted tenants).
* ``protected``: docs/PROTOCOL.md. The client generates a CKKS key pair (the secret key stays in
  this process), uploads its public evaluation keys once, and drives ``3(L-k)`` round trips per
  decode token, or per prompt span of up to ``MAX_SPAN`` positions, with
  ``veil.protected.client.ProtectedClientState``, which decrypts only the values the protocol
  lists and computes the norms, softmax and SiLU.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from veil.client.sessions import ProtectedSession, SplitSession, VeilError
from veil.client.speculation import accept, prompt_lookup
from veil.crypto.wire import CONTENT_TYPE
from veil.engine.sampling import Sampler, SamplingParams
from veil.engine.split import DEFAULT_K, ClientHalf, load_client_half
from veil.engine.text import stream_text
from veil.protected.protocol import MAX_SPAN

#: times a step or request the server dropped or refused for lack of device memory is sent again
OOM_RETRIES = 3
#: the codes of those answers: a device out of memory (503), a step whose working memory the
#: device budget could not hold until other sessions' steps give theirs back (429)
DEVICE_CODES = ("device_out_of_memory", "device_memory")
#: times a body the server refused while it held too many others (429 server_busy) is sent again
BUSY_RETRIES = 30
#: refusals for want of room on the server (a session limit, the protected KV cache's total);
#: a client with ``wait_for_room_s`` sends the request again after the server's Retry-After
ROOM_CODES = ("too_many_sessions", "kv_capacity")


def _retry_after(r: httpx.Response, cap: float = 10.0) -> float:
    """The server's Retry-After in seconds (1 when it names none), at most ``cap``."""
    try:
        return min(max(float(r.headers.get("retry-after", 1)), 0.0), cap)
    except ValueError:
        return min(1.0, cap)


class _Pieces:
    """A large body in 1 MiB pieces, from its start at every iteration (a request sent again
    sends it whole again). Pieces, because httpcore writes one large body with
    ``buffer = buffer[n:]`` after every send, copying the rest each time (quadratic: ~80 s for
    660 MB of keys)."""

    def __init__(self, data: bytes, size: int = 1 << 20):
        self.data, self.size = memoryview(data), size

    def __iter__(self):
        return (bytes(self.data[i:i + self.size]) for i in range(0, len(self.data), self.size))


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0  # request start → first token sampled (includes the prefill round trip)
    token_times: list[float] = field(default_factory=list)  # perf_counter of each sampled token
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_by_kind: dict[str, int] = field(default_factory=dict)  # protected: "up.<kind>"/"down.<kind>"
    round_trips: int = 0
    setup_bytes: int = 0  # evaluation keys uploaded for this generation (0 when already cached)
    client_cpu_s: float = 0.0  # CPU time of the calling thread spent on local work
    reestablished: int = 0  # sessions re-opened (and re-prefilled) after the server lost one
    reused_tokens: int = 0  # prompt tokens a kept session had already seen (not fed again)
    verify_steps: int = 0  # speculative steps (a sampled token plus drafts, verified at once)
    drafted: int = 0  # draft tokens sent in them
    accepted: int = 0  # drafts the model agreed with

    @property
    def accepted_tokens_per_step(self) -> float:
        """Tokens a speculative step yields on average: the accepted drafts plus one."""
        return (self.accepted + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first."""
        t = self.token_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0


@dataclass
class GenerationResult:
    tokens: list[int]
    stats: GenerationStats


def _distribution(sampler: Sampler):
    """The sampler's distribution of a logits row; a degenerate row samples greedily, as the
    sampler itself does."""

    def probs(logits: torch.Tensor) -> torch.Tensor:
        p = sampler.distribution(logits)
        return p if p is not None else torch.nn.functional.one_hot(torch.argmax(logits), logits.numel()).double()

    return probs


def client_threads(server_url: str, threads: int | None = None) -> int | None:
    """Torch threads for the client's local layers: `threads` if given; for a server on this
    machine (a loopback address) all cores but one, so that the server's engine keeps one (the
    two processes' threads otherwise starve each other: on a 2-core machine the split-plain SDK
    at k=29 ran ~10x slower per token with 2 threads than with 1); None (torch's default) else."""
    if threads is not None:
        return threads
    host = (httpx.URL(server_url).host or "").strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return max(1, (os.cpu_count() or 2) - 1) if loopback else None


class VeilClient:
    """`threads` sets torch's intra-op threads of this process (they are process-wide); by
    default it leaves a core to a server on loopback (`client_threads`)."""

    def __init__(self, server_url: str, api_key: str, mode: str = "plaintext", bundle: str | Path | None = None,
                 k: int = DEFAULT_K, timeout_s: float = 600.0, verify: bool | str = True,
                 half: ClientHalf | None = None, prefill_span: int = MAX_SPAN, he_backend: str | None = None,
                 speculate: int = 0, threads: int | None = None, key_set: str | None = None,
                 wait_for_room_s: float = 0.0, key_file: str | Path | None = None,
                 key_passphrase: str | bytes | None = None):
        from veil.crypto.backend import backend_names
        from veil.protected.key_levels import KEY_SETS

        self.threads = client_threads(server_url, threads)
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        if mode not in ("plaintext", "protected"):
            raise ValueError(f"mode must be 'plaintext' or 'protected', not {mode!r}")
        if he_backend is not None and he_backend not in backend_names():
            raise ValueError(f"he_backend must be one of {backend_names()}, not {he_backend!r}")
        # protected: which HE backend holds this client's keys (None: the server's, from /health)
        self.he_backend = he_backend
        if not 0 <= speculate < MAX_SPAN or (speculate and mode != "protected"):
            raise ValueError(f"speculate drafts 0..{MAX_SPAN - 1} tokens per step, on the protected path")
        self.speculate = speculate  # protected: drafted tokens per decode step (prompt lookup)
        # protected: which evaluation keys to make (key_levels.KEY_SETS: "full", "compact" or
        # "minimal", each with fewer bytes and more key switches on the server than the one
        # before); None: the set the server's /health prefers (full where it does not say)
        if key_set is not None and key_set not in KEY_SETS:
            raise ValueError(f"key_set must be one of {KEY_SETS}, not {key_set!r}")
        self.key_set = key_set
        if not 1 <= prefill_span <= MAX_SPAN:
            raise ValueError(f"prefill_span must be 1..{MAX_SPAN}")
        self.prefill_span = prefill_span  # protected: prompt positions per round trip
        self.mode = mode
        if wait_for_room_s < 0:
            raise ValueError("wait_for_room_s must be >= 0")
        # how long one request may wait for room on the server (ROOM_CODES), in Retry-After steps;
        # 0: the first refusal is raised (an interactive caller sees it at once)
        self.wait_for_room_s = wait_for_room_s
        # protected: where this client's key pair lives between processes (``veil.client.key_file``):
        # loaded if it exists, else written once the keys are made; its evaluation keys stay on
        # the server after ``close`` for the next process
        if key_file is not None and mode != "protected":
            raise ValueError("a key file holds a protected client's keys: mode='protected'")
        self.key_file = Path(key_file) if key_file is not None else None
        # seals a new key file's secrets and opens a sealed one's (``key_file``, "sealed")
        if key_passphrase is not None and key_file is None:
            raise ValueError("a key passphrase seals a key file: give key_file too")
        self._key_passphrase = key_passphrase
        self.he = None  # protected: this client's CKKS backend, holding the secret key
        self.last_protected_transcript: list = []
        self._keys_id: str | None = None
        self._uploaded_keys_id: str | None = None  # the keys close() deletes: the ones this client uploaded
        self._material: bytes | None = None
        # a session kept open after a generation, with the tokens it has seen (``keep_session``)
        self._kept: tuple[SplitSession, list[int]] | None = None
        self.half = half if half is not None else load_client_half(Path(bundle) if bundle else None, k)
        self.model, self.tokenizer, self.cfg = self.half.model, self.half.tokenizer, self.half.config
        if isinstance(verify, str):  # a CA bundle, e.g. a self-signed development certificate
            verify = ssl.create_default_context(cafile=verify)
        # One keep-alive connection pool for every round trip of every generation.
        self.http = httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout_s, verify=verify,
                                 headers={"Authorization": f"Bearer {api_key}"})

    def close(self) -> None:
        """Close a kept session, drop the evaluation keys this client uploaded (best effort: else
        the server drops them ``key_ttl_s`` after their last session), then the connections."""
        self.release_session()
        if self._uploaded_keys_id is not None:
            try:
                self.http.delete(f"/v1/keys/{self._uploaded_keys_id}")
            except httpx.HTTPError:
                pass
            self._uploaded_keys_id = self._keys_id = None
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- HTTP --------------------------------------------------------------------------------
    def _check(self, r: httpx.Response) -> httpx.Response:
        if r.status_code >= 400:
            retry = _retry_after(r, cap=float("inf")) if "retry-after" in r.headers else None
            try:
                err = r.json()["error"]
                raise VeilError(r.status_code, err.get("code", "error"), err.get("message", r.text), retry)
            except (ValueError, KeyError, TypeError):
                raise VeilError(r.status_code, "error", r.text[:200], retry) from None
        return r

    def _post(self, path: str, retry: bool = True, **kw) -> httpx.Response:
        """POST with one retry on a broken connection (a restarted server closes our keep-alive
        connection); a server that stays unreachable is a clear 503 error, not a stack trace.
        Retrying a step is safe: if the first attempt was processed, the server answers the
        retry, the same bytes, with the reply it gave (``Session.resent``), else it runs it.
        A 503 ``device_out_of_memory`` or 429 ``device_memory`` (the server dropped or refused the
        work whole, its session as before) is sent again after the server's ``Retry-After``, up to
        ``OOM_RETRIES`` times, and one it refused unread while it held too many other bodies (429
        ``server_busy``) up to ``BUSY_RETRIES`` times; a 429 for want of room (``ROOM_CODES``:
        nothing changed on the server either) for as long as ``wait_for_room_s`` allows. A body
        sent again must be bytes or an iterable that starts over (``_Pieces``), not a one-shot
        generator."""
        attempt, busy, deadline = 0, 0, time.monotonic() + self.wait_for_room_s
        while True:
            try:
                r = self.http.post(path, **kw)
            except httpx.TransportError as e:
                if not retry:
                    raise VeilError(503, "server_unreachable", f"{self.http.base_url}: {type(e).__name__}: {e}") from None
                time.sleep(0.5)
                return self._post(path, retry=False, **kw)
            try:
                return self._check(r)
            except VeilError as e:
                left = deadline - time.monotonic()
                if e.code in DEVICE_CODES and attempt < OOM_RETRIES:
                    attempt += 1
                    delay = _retry_after(r)
                elif e.code == "server_busy" and busy < BUSY_RETRIES:
                    busy += 1
                    delay = _retry_after(r)
                elif e.code in ROOM_CODES and left > 0:
                    delay = _retry_after(r, cap=left)
                else:
                    raise
            time.sleep(delay)

    def _create_session(self, stats: GenerationStats | None = None) -> dict:
        body = {"path": self.mode, "k": self.half.k, "model_fingerprint": self.half.server_fingerprint}
        if self.mode == "protected":
            body["keys_id"] = self.ensure_keys(stats)
            body["param_set"] = self.he.params.id
        try:
            r = self._post("/v1/sessions", json=body)
        except VeilError as e:
            if self.mode != "protected" or e.code != "keys_not_found":
                raise
            # the server no longer has our evaluation keys (it restarted): upload them again
            self._keys_id = None
            body["keys_id"] = self.ensure_keys(stats)
            r = self._post("/v1/sessions", json=body)
        return r.json()

    def _server_protected_info(self) -> dict:
        from veil.client.keys import server_protected_info

        return server_protected_info(self.http)

    def generate_keys(self, progress: bool = True) -> None:
        """Protected mode: a fresh CKKS key pair and the evaluation keys the server's layouts
        need (``veil.client.keys``: secret key in this process only). With a ``key_file`` that
        exists, its key pair instead; a new pair is written to it."""
        from veil.client import keys

        if self.key_file is not None and self.key_file.exists():
            # its evaluation keys are taken to be on the server: the first session asks, and where
            # the server has none, they are uploaded
            backend = self.he_backend or self._server_protected_info().get("he_backend")
            self.he, held = keys.load(self.key_file, self._key_passphrase, backend, self.key_set)
            self.he_backend, self.key_set = held.he_backend, held.key_set
            self._material, self._keys_id = held.material, held.keys_id
            return
        if self.he_backend is None or self.key_set is None:
            self.he_backend, self.key_set = keys.choose(self.he_backend, self.key_set, self._server_protected_info())
        self.he, self._material = keys.make(self.cfg, self.he_backend, self.key_set, progress)
        self._keys_id = None
        if self.key_file is not None:
            keys.save(self.key_file, self.he, self.key_set, self._material, self._key_passphrase)

    def ensure_keys(self, stats: GenerationStats | None = None) -> str:
        """Upload the evaluation keys once per client (the server caches them by fingerprint);
        keys from a key file are taken to be on the server until a session says otherwise."""
        if self.he is None:
            self.generate_keys()
        if self._keys_id is None:
            r = self._post("/v1/keys", content=_Pieces(self._material), retry=False,
                           headers={"Content-Type": CONTENT_TYPE, "Content-Length": str(len(self._material))})
            self._keys_id = r.json()["keys_id"]
            if self.key_file is None:  # a key file's keys stay for its next process
                self._uploaded_keys_id = self._keys_id
            if stats is not None:
                stats.setup_bytes += len(self._material)
        return self._keys_id

    @property
    def setup_bytes(self) -> int:
        """Size of the evaluation keys this client uploads (protected; 0 before key generation)."""
        return len(self._material) if self._material else 0

    def _delete_session(self, sid: str) -> None:
        try:
            self.http.delete(f"/v1/sessions/{sid}")
        except httpx.HTTPError:
            pass  # best effort: the server's TTL reclaims it anyway

    # -- generation --------------------------------------------------------------------------
    def chat_ids(self, messages: list[dict]) -> list[int]:
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        return list(ids)

    def generate(self, prompt_ids: list[int], max_new_tokens: int = 64, sampling: SamplingParams | None = None,
                 stop_at_eos: bool = True, keep_session: bool = False) -> GenerationResult:
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        tokens = list(self.iter_tokens(prompt_ids, max_new_tokens, sampling, stats, stop_at_eos, keep_session))
        return GenerationResult(tokens, stats)

    def open_session(self, stats: GenerationStats | None = None) -> SplitSession:
        """Create a server session; the caller drives it with `SplitSession.forward`."""
        info = self._create_session(stats)
        cls = ProtectedSession if self.mode == "protected" else SplitSession
        return cls(self, info["id"], info)

    def iter_tokens(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams | None = None,
                    stats: GenerationStats | None = None, stop_at_eos: bool = True,
                    keep_session: bool = False) -> Iterator[int]:
        """Prefill the prompt, then decode one token per round trip, yielding each token.

        ``keep_session``: leave the server session open afterwards (until the next generation or
        ``close``). A later generation whose prompt starts with every token that session has seen
        (a chat's next turn) feeds only the rest; any other prompt gets a new session."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        sampler = Sampler(sampling or SamplingParams())
        stats = stats if stats is not None else GenerationStats(prompt_tokens=len(prompt_ids))
        self.last_stats = stats
        if self.mode == "protected":
            self.ensure_keys(stats)  # key generation and upload are setup, not time to first token
        t0 = time.perf_counter()
        session, seen = self._resume(list(prompt_ids), stats)
        ids, history = list(prompt_ids[seen:]), list(prompt_ids)
        consistent = False  # at a yield or when done: no step is half-way (a failed one may be)
        try:
            while stats.output_tokens < max_new_tokens:
                try:
                    new = self._step(session, ids, history, sampler, stats, max_new_tokens - stats.output_tokens)
                except VeilError as e:
                    if e.code not in ("session_not_found", "server_unreachable"):
                        raise
                    # The server lost the session (restarted, or the session expired): open a
                    # new one and prefill everything so far again, once per step at most.
                    session = self._reestablish(session, stats)
                    new = [sampler(session.forward(history, stats))]
                now = time.perf_counter()
                for token in new:
                    history.append(token)
                    if stats.output_tokens == 0:
                        stats.ttft_s = now - t0
                    stats.token_times.append(now)
                    stats.output_tokens += 1
                    consistent = True
                    yield token
                    consistent = False
                    if stop_at_eos and token in self.cfg.eos_token_ids:
                        consistent = True
                        return
                ids = [new[-1]]
            consistent = True
        finally:  # a consumer that stops reading closes the generator at a yield: consistent too
            # The caches hold history[:pos] unless a step's accepted drafts run past the token
            # the generation stopped at (an end-of-turn draft, a consumer that stopped reading).
            # One kept at a time: one kept already (by a later turn while this stream sat
            # unread, or by another thread) stays.
            if keep_session and consistent and session.pos <= len(history) and self._kept is None:
                self._kept = (session, history[: session.pos])
            else:
                session.close()

    def _resume(self, prompt_ids: list[int], stats: GenerationStats) -> tuple[SplitSession, int]:
        """The kept session and how many prompt tokens it has seen, when those are a proper
        prefix of ``prompt_ids``; else a new session (the kept one is closed)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            session, seen = kept
            if len(seen) < len(prompt_ids) and prompt_ids[: len(seen)] == seen:
                stats.reused_tokens = len(seen)
                return session, len(seen)
            session.close()
        return self.open_session(stats), 0

    def release_session(self) -> None:
        """Close the session a ``keep_session`` generation left open (if any)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept[0].close()

    def _step(self, session: SplitSession, ids: list[int], history: list[int], sampler: Sampler,
              stats: GenerationStats, room: int) -> list[int]:
        """One step: feed ``ids`` and return the new tokens: one, or with speculation (a decode
        step on the protected path) the drafts the model accepts plus one."""
        drafts = []
        if self.speculate and len(ids) == 1 and isinstance(session, ProtectedSession):
            drafts = prompt_lookup(history, min(self.speculate, room - 1))
        if not drafts:
            return [sampler(session.forward(ids, stats))]
        logits = session.verify(ids + drafts, stats)
        kept, nxt = accept(drafts, logits, None if sampler.params.greedy else _distribution(sampler), sampler.uniform)
        session.keep(1 + kept)
        stats.verify_steps, stats.drafted, stats.accepted = (stats.verify_steps + 1, stats.drafted + len(drafts),
                                                             stats.accepted + kept)
        return drafts[:kept] + [nxt]

    def _reestablish(self, lost: SplitSession, stats: GenerationStats) -> SplitSession:
        try:
            lost.close()
        except VeilError:
            pass
        try:
            session = self.open_session(stats)
        except VeilError as e:
            raise VeilError(e.status, e.code, f"the session was lost and could not be re-established: {e.message}",
                            e.retry_after_s) from None
        stats.reestablished += 1
        stats.reused_tokens = 0  # the new session is fed everything again
        return session

    def chat(self, messages: list[dict], max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
             top_k: int = 0, seed: int | None = None, stream: bool = False,
             keep_session: bool = True) -> str | Iterator[str]:
        """Chat completion on the split path. stream=True yields text pieces as tokens arrive.

        The session stays open for the next turn (``keep_session``, see ``iter_tokens``): when
        ``messages`` goes on from the last call's messages and answer, only the new turn is fed,
        not the whole conversation again. ``close`` (or ``release_session``) ends it."""
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        ids = self.chat_ids(messages)
        if not stream:
            res = self.generate(ids, max_new_tokens, params, keep_session=keep_session)
            return self.tokenizer.decode(res.tokens, skip_special_tokens=True)
        return stream_text(self.tokenizer, self.iter_tokens(ids, max_new_tokens, params, keep_session=keep_session))
