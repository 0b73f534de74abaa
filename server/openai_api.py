"""OpenAI-compatible fast path for `plaintext` tenants: the whole model on the server.

`POST /v1/chat/completions`, `POST /v1/completions` (prompt as text or token ids), `GET /v1/models`.
Requests become engine sequences, batched with every other request and split step. Streaming
is SSE (`data: {chunk}` lines, then `data: [DONE]`). Extensions beyond OpenAI's fields:
`top_k` and `ignore_eos` (benchmarks need exact output lengths).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from veil.engine.api import WorkDropped
from veil.engine.engine import Engine
from veil.engine.sampling import TOP_K_MAX, SamplingParams
from veil.engine.split import ServerHalf
from veil.engine.text import TextAssembler
from veil.server.config import ServerConfig
from veil.server.errors import ApiError
from veil.server.http_common import bearer_tenant
from veil.server.metrics import Metrics
from veil.server.tenants import TenantStore


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields we do not use (user, logit_bias…)
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=TOP_K_MAX)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    n: int = 1
    ignore_eos: bool = False


class ChatRequest(_Common):
    messages: list[dict] = Field(min_length=1)


class CompletionRequest(_Common):
    prompt: str | list[int]


def _check_text(text: str) -> str:
    """Text a request carries, refused unless it is Unicode that UTF-8 can hold: JSON's escapes
    can spell a lone surrogate ("\\ud800"), which the tokenizer refuses with a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "bad_request", "text must be valid Unicode (a lone surrogate is not)") from None
    return text


class Mailbox:
    """Hands items from the engine thread to the event loop: appends are thread-safe, and the
    loop is woken once per batch of them (a step's tokens), not once per token: each wake-up is
    a write to the loop's self-pipe on the engine thread and a turn of the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self._items, self._lock, self._armed = loop, deque(), threading.Lock(), False

    def put(self, q: asyncio.Queue, item) -> None:
        self._items.append((q, item))
        with self._lock:
            if self._armed:
                return  # a delivery is scheduled and has not started emptying: it takes this one
            self._armed = True
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            self._armed = False  # from here on a new item schedules a delivery of its own
        while self._items:
            q, item = self._items.popleft()
            q.put_nowait(item)


@dataclass
class _Job:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stops: list[str]
    stop_ids: tuple[int, ...]
    stream: bool
    include_usage: bool


def openai_router(cfg: ServerConfig, half: ServerHalf, engine: Engine, tenants: TenantStore,
                  metrics: Metrics) -> APIRouter:
    router = APIRouter()
    tok, model_name = half.tokenizer, half.config.name
    output_tokens = metrics.tokens.labels("output")  # counted per token: the child looked up once
    eos_ids = tuple(half.config.eos_token_ids)
    # the longest text one token of this vocabulary spells: a text longer than max_context of
    # them cannot fit, and is refused before the tokenizer spends ~0.6 s and ~100 MB per MB of it
    # (on the event loop) to say so
    most_chars = cfg.max_context * max(map(len, tok.get_vocab()))

    def fits(chars: int, messages: int = 0) -> None:
        if chars > most_chars or messages > cfg.max_context:  # a chat message costs a token at least
            raise ApiError(400, "context_length_exceeded",
                           f"the prompt ({chars} characters{f', {messages} messages' if messages else ''}) "
                           f"cannot fit max_context={cfg.max_context} tokens")

    def tenant_of(request: Request):
        tenant = bearer_tenant(request, tenants)
        if "plaintext" not in tenant.scopes:
            raise ApiError(403, "forbidden", "the full-model endpoint needs the 'plaintext' scope")
        return tenant

    def job(body: _Common, prompt_ids: list[int]) -> _Job:
        if body.model not in (None, model_name):
            raise ApiError(404, "model_not_found", f"model {body.model!r} does not exist; try {model_name!r}")
        if body.n != 1:
            raise ApiError(400, "unsupported", "only n=1 is supported")
        if not prompt_ids:
            raise ApiError(400, "bad_request", "the prompt is empty")
        if any(not 0 <= t < half.config.vocab_size for t in prompt_ids):
            raise ApiError(400, "bad_request", "prompt token ids must lie in [0, vocab_size)")
        room = cfg.max_context - len(prompt_ids)
        if room < 1:  # found by schemathesis: a prompt filling the context asked the engine for 0 tokens (500)
            raise ApiError(400, "context_length_exceeded",
                           f"the prompt ({len(prompt_ids)} tokens) leaves no room under max_context={cfg.max_context}")
        max_tokens = body.max_completion_tokens or body.max_tokens or min(room, 1024)
        if max_tokens > room:
            raise ApiError(400, "context_length_exceeded",
                           f"prompt ({len(prompt_ids)}) + max_tokens ({max_tokens}) exceeds max_context={cfg.max_context}")
        stops = [_check_text(x) for x in ([body.stop] if isinstance(body.stop, str) else list(body.stop or []))]
        if len(stops) > 4:
            raise ApiError(400, "bad_request", "at most 4 stop sequences")
        try:
            sampling = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, seed=body.seed)
        except ValueError as e:  # the engine's own bounds, should the body's ever let more through
            raise ApiError(400, "bad_request", str(e)) from None
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return _Job(prompt_ids, max_tokens, sampling, stops, () if body.ignore_eos else eos_ids, body.stream,
                    include_usage)

    mailboxes: dict[asyncio.AbstractEventLoop, Mailbox] = {}

    async def run(tenant: str, j: _Job) -> AsyncIterator[tuple[str, str | None, int]]:
        """Yields (text piece, finish_reason or None, completion tokens so far): one piece for
        all the tokens that arrived since the last, so a loop that falls behind the engine sends
        fewer, longer chunks instead of lagging further."""
        loop = asyncio.get_running_loop()
        box = mailboxes.get(loop) or mailboxes.setdefault(loop, Mailbox(loop))
        q: asyncio.Queue = asyncio.Queue()
        t0 = time.perf_counter()
        seq = engine.add_request(
            tenant, j.prompt_ids, j.max_tokens, j.sampling, j.stop_ids,
            on_token=lambda t: box.put(q, ("tok", t)), on_finish=lambda r: box.put(q, ("fin", r)))
        metrics.tokens.labels("prompt").inc(len(j.prompt_ids))
        text = TextAssembler(tok, j.stops)
        n, last = 0, None
        try:
            while True:
                items = [await q.get()]
                while not q.empty():
                    items.append(q.get_nowait())
                now = time.perf_counter()
                pieces = []
                for kind, val in items:
                    if kind == "tok":
                        n += 1
                        output_tokens.inc()
                        (metrics.ttft if last is None else metrics.itl).observe(now - (last or t0))
                        last = now
                        pieces.append(text.push(val))
                        if text.stopped:
                            engine.abort(seq)
                            yield "".join(pieces), "stop", n
                            return
                    else:
                        if isinstance(val, WorkDropped):
                            raise val  # the app's handlers: 503 with Retry-After (out of memory), 500
                        if isinstance(val, BaseException):
                            raise ApiError(503, "engine_unavailable", "the inference engine failed")
                        metrics.e2e.observe(now - t0)
                        yield "".join(pieces) + text.flush(), ("length" if val == "length" else "stop"), n
                        return
                if piece := "".join(pieces):
                    yield piece, None, n
        finally:
            if not seq.finished:  # the client went away, or an error: free the engine's work
                engine.abort(seq)

    def sse(obj) -> bytes:
        return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()

    def usage(j: _Job, n: int) -> dict:
        return {"prompt_tokens": len(j.prompt_ids), "completion_tokens": n, "total_tokens": len(j.prompt_ids) + n}

    async def respond(tenant: str, j: _Job, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not j.stream:
            parts, reason, n = [], "stop", 0
            async for piece, fin, count in run(tenant, j):
                parts.append(piece)
                reason, n = fin or reason, count
            text = "".join(parts)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                      if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
            return {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice],
                    "usage": usage(j, n)}

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        # Start the engine work now, so errors in the request surface as a status code.
        events = run(tenant, j)
        first = await events.__anext__()

        def chunk(piece: str | None, fin: str | None, role: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": piece or ""} if role else ({"content": piece} if piece else {})
                choice = {"index": 0, "delta": delta, "finish_reason": fin}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": fin}
            c = {"id": rid, "object": chunk_obj, "created": created, "model": model_name, "choices": [choice]}
            if j.include_usage:
                c["usage"] = None
            return c

        async def body():
            n = 0
            try:
                if chat:
                    yield sse(chunk("", None, role=True))
                item = first
                while True:
                    piece, fin, n = item
                    if piece:
                        yield sse(chunk(piece, None))
                    if fin:
                        yield sse(chunk(None, fin))
                        break
                    item = await events.__anext__()
                if j.include_usage:
                    yield sse({"id": rid, "object": chunk_obj, "created": created, "model": model_name,
                               "choices": [], "usage": usage(j, n)})
                yield b"data: [DONE]\n\n"
            finally:
                await events.aclose()

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @router.get("/v1/models")
    async def models(request: Request):
        tenant_of(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "veil"}]}

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        tenant = tenant_of(request)
        for m in body.messages:
            content = m.get("content")
            if isinstance(content, list):  # OpenAI content parts: keep the text ones
                texts = [p.get("text", "") for p in content if isinstance(p, dict)]
                m["content"] = "".join(texts) if all(isinstance(t, str) for t in texts) else None
            if m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
                raise ApiError(400, "bad_request", "each message needs a role (system|user|assistant) and text content")
            _check_text(m["content"])
        fits(sum(len(m["content"]) for m in body.messages), len(body.messages))
        try:
            enc = tok.apply_chat_template(body.messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        except Exception as e:
            raise ApiError(400, "bad_request", f"messages do not fit the chat template: {e}") from None
        return await respond(tenant.name, job(body, list(enc["input_ids"])), chat=True)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        tenant = tenant_of(request)
        if isinstance(body.prompt, str):
            fits(len(_check_text(body.prompt)))
        ids = body.prompt if isinstance(body.prompt, list) else tok.encode(body.prompt, add_special_tokens=False)
        return await respond(tenant.name, job(body, list(ids)), chat=False)

    return router
