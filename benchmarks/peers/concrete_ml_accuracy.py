"""Concrete ML's accuracy over ALL the server's layers, on its quantized clear path (no FHE).

    .venv-concrete/bin/python benchmarks/peers/concrete_ml_accuracy.py --workload W.json [--k 2] \
        [--kv fused] [--json-out F.json]

`concrete_ml_hybrid.py` runs only a few layers in FHE (each costs tens of seconds per token),
so its KL is that of those layers. This script wraps every projection of layers [k, L) in
Concrete ML's hybrid model exactly as that script does (same fusion, quantization and
calibration) and generates with ``fhe="disable"``: the same quantized integer products without
encryption. What it leaves out is the GLWE back-end's own error (its results are decrypted at
26 bits of modulus); compare the FHE run's KL on its layers with this script's on the same
layers (``--layers``) to see how large that is. Figures: KL and greedy agreement against the
plaintext model, teacher-forced on the generated tokens, as every Veil path reports them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from concrete_ml_hybrid import fhe_module_names, figure_lines, greedy, kl_and_agreement, load_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from concrete.ml.torch.hybrid_model import HybridFHEModel

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, type=Path)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="the layers to quantize (default: every server layer [k, L))")
    ap.add_argument("--kv", choices=("fused", "clear"), default="fused")
    ap.add_argument("--n-bits", type=int, default=8)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    req = json.loads(args.workload.read_text())["requests"][0]
    prompt, n_new = list(req["prompt_ids"]), int(req["max_new_tokens"])

    plain = load_model()
    layers = args.layers or list(range(args.k, plain.config.num_hidden_layers))
    model = load_model()
    hybrid = HybridFHEModel(model, fhe_module_names(model, layers, args.kv))
    hybrid.compile_model(torch.tensor([prompt]), n_bits=args.n_bits, use_dynamic_quantization=True)
    hybrid.set_fhe_mode("disable")
    tokens, logits, _, _ = greedy(model, prompt, n_new)
    with torch.inference_mode():
        ref = plain(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:].float()
    ref_tokens = greedy(plain, prompt, n_new)[0]
    kl, agree = kl_and_agreement(ref, torch.stack(logits))
    r = {"context": len(prompt), "layers": len(layers), "kl_mean": sum(kl) / len(kl), "kl_max": max(kl),
         "greedy_agreement": sum(agree) / len(agree), "tokens_equal_plain": tokens == ref_tokens}
    res = {"schema": "veil.peer_accuracy/1", "path": "concrete-ml", "mode": "quantized clear (fhe=disable)",
           "k": args.k, "layer_ids": layers, "kv": args.kv, "n_bits": args.n_bits, "tokens": tokens,
           "plain_tokens": ref_tokens, f"ctx{len(prompt)}": r}
    for line in figure_lines("concrete-ml.quantized_clear", r, f".ctx{len(prompt)}"):
        print(line, flush=True)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
