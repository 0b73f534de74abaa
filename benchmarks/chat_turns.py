"""A multi-turn chat with the server session kept between turns, against a session per turn:

    python -m veil.benchmarks.chat_turns [--mode protected] [--k 28] [--turns 3] [--max-new-tokens 8]

A `veil serve --k K` subprocess on loopback; this process is the client SDK. The same greedy
conversation (fixed user turns, the model's own answers in between) runs twice: with
``keep_session=False`` every turn opens a session and feeds the whole conversation again; with
``keep_session=True`` (what ``VeilClient.chat`` does by default) a turn goes on in the session
the turn before kept and feeds only the tokens that session has not seen. Figures per setting
and turn: ``ttft_s``, ``prompt_tokens_fed``, ``round_trips``, ``bytes_up``; per setting the
conversation's ``total_s``; ``answers_equal`` (the two settings' answers, turn by turn).
Exits 1 when the answers differ.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from veil.benchmarks.stats import emit

TURNS = ("What is the capital of France?", "And of Italy?", "Which of the two cities is larger?",
         "Name one river in each.")


def conversation(client, turns: tuple[str, ...], new_tokens: int, keep: bool) -> dict:
    messages, per_turn = [], []
    t0 = time.perf_counter()
    for text in turns:
        messages.append({"role": "user", "content": text})
        answer = client.chat(messages, max_new_tokens=new_tokens, keep_session=keep)
        s = client.last_stats
        per_turn.append({"answer": answer, "ttft_s": s.ttft_s, "prompt_tokens": s.prompt_tokens,
                         "prompt_tokens_fed": s.prompt_tokens - s.reused_tokens, "output_tokens": s.output_tokens,
                         "round_trips": s.round_trips, "bytes_up": s.bytes_up, "bytes_down": s.bytes_down})
        messages.append({"role": "assistant", "content": answer})
    client.release_session()
    return {"turns": per_turn, "total_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="plaintext", choices=["plaintext", "protected"])
    ap.add_argument("--k", type=int, default=28)
    ap.add_argument("--turns", type=int, default=3, help=f"user turns, 1..{len(TURNS)}")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--he-backend", default="native", help="protected: the HE backend, on both ends")
    ap.add_argument("--out", type=Path, default=Path("bench_out/chat_turns.json"))
    args = ap.parse_args(argv)
    if not 1 <= args.turns <= len(TURNS):
        ap.error(f"--turns takes 1..{len(TURNS)}")

    from veil.benchmarks.protected_overhead import start_split_server, warm_up_protected
    from veil.client.sdk import VeilClient
    from veil.engine.loader import load_checkpoint
    from veil.engine.split import client_half_from

    half = client_half_from(load_checkpoint(), args.k)
    turns = TURNS[: args.turns]
    results: dict = {"schema": "veil.chat_turns/1", "mode": args.mode, "k": args.k, "turns": list(turns),
                     "max_new_tokens": args.max_new_tokens, "settings": {}}
    protected = args.mode == "protected"
    extra = ["--he-backend", args.he_backend] if protected else []
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = start_split_server(Path(tmp), args.k, extra)
        try:
            client = VeilClient(url, key, mode=args.mode, half=half, he_backend=args.he_backend if protected else None)
            if protected:
                client.generate_keys(progress=False)  # one key set for both settings
                results["server_protected_warmup_s"] = warm_up_protected(client)  # not in a TTFT
            for name, keep in (("session_per_turn", False), ("kept_session", True)):
                print(f"{name} ...", file=sys.stderr, flush=True)
                results["settings"][name] = conversation(client, turns, args.max_new_tokens, keep)
            client.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    fresh, kept = (results["settings"][n] for n in ("session_per_turn", "kept_session"))
    results["answers_equal"] = [a["answer"] for a in fresh["turns"]] == [b["answer"] for b in kept["turns"]]
    lines = []
    for name, res in results["settings"].items():
        for i, turn in enumerate(res["turns"], 1):
            for metric in ("ttft_s", "prompt_tokens_fed", "round_trips", "bytes_up"):
                lines.append(f"figure chat_turns.{args.mode}.{name}.turn{i}.{metric} {turn[metric]:.6g}")
        lines.append(f"figure chat_turns.{args.mode}.{name}.total_s {res['total_s']:.6g}")
    last = len(turns)
    lines.append(f"figure chat_turns.{args.mode}.ttft_ratio.turn{last} "
                 f"{fresh['turns'][-1]['ttft_s'] / kept['turns'][-1]['ttft_s']:.4g}")
    lines.append(f"figure chat_turns.{args.mode}.answers_equal {int(results['answers_equal'])}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    emit(lines, results, args.out)
    return 0 if results["answers_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
