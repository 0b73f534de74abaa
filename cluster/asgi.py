"""Running one forwarded HTTP request through an ASGI app in this process.

The ingress reads a request whole (bodies are bounded by the server's limits) and hands it to a
replica as a ``Forwarded``; the replica runs it through its FastAPI app and answers with a
``Head`` (status, headers, and the whole body; or its first chunk when the answer has no
length, as an SSE stream) and then, for such an answer, the remaining body chunks. A consumer that stops early (the HTTP client went
away) makes the app see ``http.disconnect``, exactly as under uvicorn, so the engine aborts the
request's work.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import AsyncIterator
from dataclasses import dataclass

log = logging.getLogger("veil.cluster")


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes | bytearray  # bytearray only where the ingress read it: unpickled, bytes
    client: tuple[str, int] | None = None

    def header(self, name: bytes) -> str | None:
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == name), None)

    def __reduce_ex__(self, protocol):
        # The body goes out of band where the pickler takes buffers (Ray does): a key upload of
        # up to 1 GB then goes into Ray's object store straight from the ingress's bytes. In
        # band, Ray pickled it into a buffer of its own first (the ingress peaked at 4 times
        # the body; benchmarks/results/2026-12-08-key-upload-copies).
        body = pickle.PickleBuffer(self.body) if protocol >= 5 else self.body
        return _rebuilt, (self.method, self.path, self.query, self.headers, body, self.client)


def _rebuilt(method, path, query, headers, body, client) -> Forwarded:
    """A ``Forwarded`` unpickled: its body as bytes, whatever buffer it arrived in."""
    return Forwarded(method, path, query, headers, bytes(body), client)


@dataclass(frozen=True)
class Head:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes  # the whole body, or its first chunk when `streaming` (an answer without a length)
    streaming: bool


def scope_of(req: Forwarded) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.path.encode(),
            "query_string": req.query, "root_path": "", "headers": list(req.headers), "client": req.client,
            "server": None, "state": {}}


async def call_app(app, req: Forwarded, extra_headers: tuple[tuple[bytes, bytes], ...] = ()
                   ) -> AsyncIterator[Head | bytes]:
    """Yields one ``Head``, then (streaming answers only) body chunks. ``extra_headers`` are
    added to the answer's."""
    messages: asyncio.Queue = asyncio.Queue()
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(scope_of(req), receive, messages.put)
        except Exception:  # Starlette has already answered 500 if it could; the rest is for the log
            log.exception("%s %s failed", req.method, req.path)
        finally:
            await messages.put(None)

    task = asyncio.create_task(run())
    try:
        start = await messages.get()
        if start is None:  # the app died before answering
            yield Head(500, ((b"content-type", b"application/json"),),
                       b'{"error":{"code":"internal_error","message":"the replica failed","type":"internal_error"}}',
                       False)
            return
        headers = tuple(start.get("headers", ()))
        # An answer of known length is gathered whole (middleware may still send it in pieces);
        # one without (SSE) is passed on piece by piece.
        whole = any(k.lower() == b"content-length" for k, _ in headers)
        msg = await messages.get()
        chunk, more = (msg.get("body", b""), bool(msg.get("more_body"))) if msg else (b"", False)
        while whole and more:
            msg = await messages.get()
            chunk, more = (chunk + msg.get("body", b""), bool(msg.get("more_body"))) if msg else (chunk, False)
        yield Head(start["status"], headers + extra_headers, chunk, more)
        while more:
            msg = await messages.get()
            if msg is None:
                return
            more = bool(msg.get("more_body"))
            if msg.get("body"):
                yield msg["body"]
    finally:
        disconnected.set()
        if not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
