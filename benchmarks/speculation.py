"""Speculative decoding on the protected path, with and without, on two kinds of prompt:

    python -m veil.benchmarks.speculation [--k 28] [--speculate 4] [--max-new-tokens 16] [--he-backend seal]

A `veil serve --k K` subprocess on loopback; this process is the client SDK. Two prompts: a
*repetitive* one (the model is asked to repeat a given passage, so prompt lookup drafts well) and
an *ordinary* one (a question). Each runs greedily twice, with ``speculate=0`` and with
``speculate=N``, and the benchmark checks that the tokens are identical. Figures per prompt and
setting: ``tpot_s`` (mean time per output token after the first), ``accepted_tokens_per_step``
(tokens a speculative step yields: accepted drafts + 1), ``bytes_per_token``,
``round_trips_per_token`` (after the prefill), ``verify_steps``; ``tokens_equal``. A verify step
carries each of its positions in its own ciphertexts (several positions per ciphertext is not
built), so the server's HE work per step grows with the drafts, less than in proportion where the
backend batches a span's positions as rows of one product (``HEBackend.batch_pays``: native):
speculation trades HE work for round trips, which pays where round trips cost more than the
work (a slow link, or a server that batches positions).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from veil.benchmarks.stats import emit

PASSAGE = ("The protected path keeps the prompt, the hidden states and the answer away from the server, "
           "and the server's weights away from the client.")
PROMPTS = {
    "repetitive": f"Repeat this sentence exactly, twice.\nSentence: {PASSAGE}\nRepeated: {PASSAGE}\nRepeated:",
    "ordinary": "Question: Why is the sky blue? Explain it to a child in three sentences.\nAnswer:",
}


def run(client, ids: list[int], new_tokens: int) -> dict:
    res = client.generate(ids, new_tokens, stop_at_eos=False)
    s, decode = res.stats, max(1, res.stats.output_tokens - 1)
    return {"tokens": res.tokens, "tpot_s": s.tpot_s, "ttft_s": s.ttft_s,
            "accepted_tokens_per_step": s.accepted_tokens_per_step, "verify_steps": s.verify_steps,
            "drafted": s.drafted, "accepted": s.accepted, "bytes_per_token": (s.bytes_up + s.bytes_down) / decode,
            "round_trips_total": s.round_trips}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=28)
    ap.add_argument("--speculate", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--he-backend", default="seal", help="the protected path's HE backend, on both ends")
    ap.add_argument("--out", type=Path, default=Path("bench_out/speculation.json"))
    args = ap.parse_args(argv)

    from veil.benchmarks.protected_overhead import start_split_server, warm_up_protected
    from veil.client.sdk import VeilClient
    from veil.engine.loader import load_checkpoint
    from veil.engine.split import client_half_from

    ckpt = load_checkpoint()
    half = client_half_from(ckpt, args.k)
    results: dict = {"schema": "veil.speculation/1", "k": args.k, "speculate": args.speculate, "he_backend": args.he_backend,
                     "max_new_tokens": args.max_new_tokens, "prompts": {}}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = start_split_server(Path(tmp), args.k, ["--he-backend", args.he_backend])
        try:
            client = VeilClient(url, key, mode="protected", half=half, speculate=args.speculate,
                                he_backend=args.he_backend)
            client.generate_keys(progress=False)  # one key set for both settings
            results["server_protected_warmup_s"] = warm_up_protected(client)  # not in a TTFT
            for name, text in PROMPTS.items():
                ids = ckpt.tokenizer(text)["input_ids"]
                out = {}
                for n in (0, args.speculate):
                    print(f"{name}: speculate={n} ...", file=sys.stderr, flush=True)
                    client.speculate = n
                    out[f"spec{n}"] = run(client, ids, args.max_new_tokens)
                base, spec = out["spec0"], out[f"spec{args.speculate}"]
                out["prompt_tokens"] = len(ids)
                out["tokens_equal"] = base["tokens"] == spec["tokens"]
                out["tpot_ratio"] = spec["tpot_s"] / base["tpot_s"] if base["tpot_s"] else 0.0
                results["prompts"][name] = out
                for setting in ("spec0", f"spec{args.speculate}"):
                    for metric in ("tpot_s", "accepted_tokens_per_step", "bytes_per_token", "round_trips_total"):
                        lines.append(f"figure protected.{metric}.{name}.{setting} {out[setting][metric]:.6g}")
                lines.append(f"figure protected.tokens_equal.{name} {int(out['tokens_equal'])}")
            client.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    emit(lines, results, args.out)
    return 0 if all(r["tokens_equal"] for r in results["prompts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
