"""Running the app under uvicorn: in the foreground (`veil serve`) or on a background thread
on a free loopback port (`veil demo`, tests)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

# The event loop and HTTP parser uvicorn uses, named: on "auto" it would switch to uvloop and
# httptools wherever they are installed (the cluster extra brings both), and the one-process
# server should not change with what else is installed. uvloop and httptools were no faster
# here: the engine loop's host time per served step grew ~1.4x beside them, throughput within
# the noise (benchmarks/results/2026-12-02-served-stack).
STACK = {"loop": "asyncio", "http": "h11"}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class BackgroundServer:
    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_background(app: FastAPI, host: str = "127.0.0.1", port: int | None = None,
                     ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> BackgroundServer:
    port = port or free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", ssl_certfile=ssl_certfile,
                            ssl_keyfile=ssl_keyfile, timeout_keep_alive=30, **STACK)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="veil-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    scheme = "https" if ssl_certfile else "http"
    return BackgroundServer(server, thread, f"{scheme}://{host}:{port}")


def serve_forever(app: FastAPI, host: str, port: int, ssl_certfile: str | None = None,
                  ssl_keyfile: str | None = None) -> None:
    uvicorn.run(app, host=host, port=port, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                timeout_keep_alive=30, log_level="info", **STACK)
