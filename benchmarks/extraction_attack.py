"""Weight extraction from what a client sees: Veil's protected transcript against a linear-only one.

    python -m veil.benchmarks.extraction_attack [--tokens N] [--k K] [--chunk C] [--out F.json]
    python -m veil.benchmarks.extraction_attack --peer-transcript T.npz [--out F.json]

A curious client runs the real protected protocol (real SEAL, the real parameter set, the
shipped SmolLM2 weights; server executor and client state in one process, no HTTP, since the
transport changes nothing the client sees) over N tokens of real text (default 2·d), in
sessions of C tokens. It keeps everything it sees: its own input h_k of the first protected
layer, every decrypted value of the protocol's table (docs/PROTOCOL.md) (σ, ŝ, σ', û_g, û_u, h_L), and what it
computes from them (the softmax weights w and the SwiGLU outputs m). It then fits least-squares
estimates of the protected weights from that transcript.

The same tokens go through a linear-only protocol (Concrete ML's hybrid mode: the client sees
every linear layer's input and output; computed here with the plaintext model, which is
exactly what that protocol reveals), and the same attacker regresses each output on its input.

Default k = L-1, one protected layer: the cheapest real run (N = 1152 tokens take about an hour
on a 2-core CPU) and the most exposed split (the client knows both the input and the output of
the protected block). ``--layers n`` protects only [k, k+n): for k = 2, ``--layers 1`` is a
cheap proxy of the k = 2 split that shows the client more than the real one (the output of the
range comes right after layer k). What the Veil attacker fits, per matrix of layer k:

* ``gate``/``up``: û = W·diag(γ2)·(h_k + o_k) with o_k the unseen attention output, regressed
  on h_k (least squares, and ridge with the λ that minimises the error: an oracle-tuned upper
  bound on what this attacker gets). The server shuffles the FFN coordinates of the first
  protected layer with a fresh secret permutation per position, so the attacker regresses on
  û in an unknown order; ``gate_gram``/``up_gram`` fit what the shuffle leaves, the Gram matrix
  WᵀW, from the permutation-invariant Σ_i û_i² = h'ᵀ WᵀW h' (a quadratic form, d(d+1)/2 unknowns).
* ``down`` and ``o·v`` (only for a one-layer range): h_L - h_k = Σ_heads W_o,h W_v,h Γ1 x_h + W_down m,
  with x_h = Σ_j w_tj h_j computable by the client: one joint regression on [m, x_1..x_H]
  (I + H·d unknowns per output row).
* ``qk``: the client sees only bilinear forms ŝ. At j = t the rotation cancels and
  ŝ_tt = h_tᵀ M_h h_t with M_h = (W_q,h Γ1)ᵀ (W_k,h Γ1); W_q and W_k themselves are not
  identifiable from ŝ (any A: W_q → A W_q, W_k → A⁻ᵀ W_k gives the same scores). The
  minimum-norm least-squares estimate of sym(M_h) comes from the kernel (h_a·h_b)².

With ``--peer-transcript`` (written by ``benchmarks/peers/concrete_ml_hybrid.py``) the
linear-only attack also runs on a real peer transcript: what Concrete ML's client held in
FHE, each remote linear module's input and decrypted output (q, k and v as one fused module
are split back into their rows). The protected run then goes over the same token ids in one
session, with k = the last layer the transcript covers, so that both transcripts come from the
same text at the same positions.

Errors are ‖Ŵ - W‖/‖W‖ (``rel_err``) and, because N tokens only probe an N-dimensional input
subspace, also on that subspace: ‖(Ŵ - W)P‖/‖WP‖ with P the projector on the span of the
inputs seen (``span_err``; equal to ``rel_err`` once the inputs span the whole space). An
attacker that recovers W on the subspace it probed has succeeded there; one that does not has
learnt nothing useful.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from veil.benchmarks.stats import emit


# --------------------------------------------------------------------------------- the fits
def _projector(x: np.ndarray) -> np.ndarray:
    """Projector on the row space of x [n, d] (the input directions the transcript probed)."""
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    v = vt[s > s[0] * 1e-10]
    return v.T @ v


def errors(w_hat: np.ndarray, w: np.ndarray, x: np.ndarray) -> dict[str, float]:
    p = _projector(x)
    return {"rel_err": float(np.linalg.norm(w_hat - w) / np.linalg.norm(w)),
            "span_err": float(np.linalg.norm((w_hat - w) @ p) / np.linalg.norm(w @ p))}


def lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """W minimising ‖x Wᵀ - y‖ (minimum norm when underdetermined): rows of x are inputs."""
    return np.linalg.lstsq(x, y, rcond=None)[0].T


def best_ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[dict[str, float], float]:
    """Ridge fits over a λ grid, scored against the truth (an oracle-tuned attacker)."""
    gram, xty = x.T @ x, x.T @ y
    scale = np.trace(gram) / gram.shape[0]
    best = None
    for lam in (1e-6, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0):
        e = errors(np.linalg.solve(gram + lam * scale * np.eye(len(gram)), xty).T, w, x)
        if best is None or e["rel_err"] < best[0]["rel_err"]:
            best = (e, lam)
    return best


def quadratic_form_fit(h: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Minimum-norm M with h_aᵀ M h_a = s_a (over symmetric M): M = Σ_a α_a h_a h_aᵀ with
    (K α = s, K_ab = (h_a·h_b)²), the least-squares solution in the space of d×d matrices."""
    k = (h @ h.T) ** 2
    alpha = np.linalg.lstsq(k, s, rcond=None)[0]
    return (h * alpha[:, None]).T @ h


#: the linear maps of a decoder layer, by this attack's names
LINEAR_PATHS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


# ----------------------------------------------------------------------------- transcripts
@dataclass
class VeilTranscript:
    """What the protected client saw or computed, one row per token (layer k = first)."""

    h_in: list[np.ndarray] = field(default_factory=list)  # its own input of layer k
    u_gate: list[np.ndarray] = field(default_factory=list)  # decrypted, layer k
    u_up: list[np.ndarray] = field(default_factory=list)
    self_score: list[np.ndarray] = field(default_factory=list)  # ŝ_tt/sqrt(hd) per head, layer k
    m_last: list[np.ndarray] = field(default_factory=list)  # SwiGLU output it computed, layer L-1
    x_last: list[np.ndarray] = field(default_factory=list)  # Σ_j w_tj h_j per head, layer L-1 (k = L-1)
    h_final: list[np.ndarray] = field(default_factory=list)  # decrypted h_L
    kinds: set = field(default_factory=set)
    seconds: float = 0.0

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in self.__dict__.items() if isinstance(v, list) and v}


def text_chunks(tokenizer, n_tokens: int, chunk: int) -> list[list[int]]:
    """n_tokens of real text (this repository's Python and README) in sessions of `chunk`."""
    root = Path(__file__).resolve().parent.parent
    text = "\n".join(f.read_text() for f in sorted(root.glob("*/*.py")) + [root / "README.md"])
    ids = tokenizer(text)["input_ids"]
    if len(ids) < n_tokens:
        raise SystemExit(f"only {len(ids)} tokens of text, need {n_tokens}")
    return [ids[i:i + chunk] for i in range(0, n_tokens, chunk)]


def collect_veil(ckpt, model, k: int, chunks: list[list[int]], progress=None, last: int | None = None) -> VeilTranscript:
    """Run the real protected protocol for layers [k, last) (default [k, L)) over every chunk
    (one session each)."""
    from veil.crypto.backend import make_backend
    from veil.crypto.params import PROTECTED_PARAMS
    from veil.protected.client import ProtectedClientState, softmax_weights, swiglu_from_u
    from veil.protected.key_levels import relin_key_level, rotation_key_levels
    from veil.protected.layouts import dims_of, unpack_mlp, unpack_scores
    from veil.protected.server import ProtectedExecutor
    from veil.server.config import ServerConfig

    cfg = ckpt.config
    L, d, heads, hd = cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim
    client_be = make_backend(PROTECTED_PARAMS, "seal")
    client_be.generate_keys(rotation_key_levels(dims_of(cfg, PROTECTED_PARAMS.slot_count)), relin_key_level())
    server_be = make_backend(PROTECTED_PARAMS, "seal")
    server_be.import_public_material(client_be.export_public_material())
    L = cfg.num_layers if last is None else last  # the end of the protected range
    ex = ProtectedExecutor.from_checkpoint(server_be, ckpt, k, L, ServerConfig().protected_limits())
    tr = VeilTranscript()
    t0 = time.perf_counter()
    for ids in chunks:
        with torch.no_grad():
            h_in = model.run_layers(model.embed(torch.tensor(ids)), 0, k).double().numpy()
        session = ex.new_session()
        client = ProtectedClientState(client_be, cfg, k, L, session.id)
        r_last: list[float] = []
        for t in range(len(ids)):
            seen = len(client.transcript)
            msg = client.token_message(h_in[t])
            while not isinstance(msg, np.ndarray):
                msg = client.handle(ex.handle(msg))
            tr.h_in.append(h_in[t])
            tr.h_final.append(msg)
            for rec in client.transcript[seen:]:
                tr.kinds.update(rec.kinds)
                if "h_final" in rec.kinds or rec.values is None:
                    continue
                if "scores" in rec.kinds:
                    sigma, scores = unpack_scores(ex.dims, rec.values, t + 1)
                    if rec.layer == k:
                        tr.self_score.append(scores[:, t])
                    if rec.layer == L - 1 and k == L - 1:
                        w, r_t = softmax_weights(sigma, scores, r_last, cfg.rms_norm_eps)
                        r_last.append(r_t)
                        # x_h = Σ_j w_hj h_j: what W_o W_v Γ1 multiplies (the client's own h_j)
                        tr.x_last.append((w @ h_in[:t + 1]).reshape(heads * d))
                elif "u_gate" in rec.kinds:
                    sigma2, ug, uu = unpack_mlp(ex.dims, rec.values)
                    if rec.layer == k:
                        tr.u_gate.append(ug)
                        tr.u_up.append(uu)
                    if rec.layer == L - 1:
                        tr.m_last.append(swiglu_from_u(sigma2, ug, uu, cfg.rms_norm_eps))
            if progress:
                progress()
        ex.drop_session(session.id)
    tr.seconds = time.perf_counter() - t0
    assert hd * heads == cfg.q_size
    return tr


def linear_only(model, k: int, chunks: list[list[int]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Concrete ML's hybrid mode reveals each linear layer's input and output: for every
    linear map of layer k (and W_down of layer L-1), the (inputs, outputs) the client sees."""
    seen: dict[str, tuple[list, list]] = {}
    hooks = []
    for name, path in LINEAR_PATHS.items():
        mod = model.layers[str(k)].get_submodule(path)
        seen[name] = ([], [])

        def hook(_m, args, out, name=name):
            seen[name][0].append(args[0].double().numpy())
            seen[name][1].append(out.double().numpy())

        hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for ids in chunks:
                model.run_layers(model.embed(torch.tensor(ids)), 0, k + 1)
    finally:
        for hk in hooks:
            hk.remove()
    return {n: (np.concatenate(x), np.concatenate(y)) for n, (x, y) in seen.items()}


# ----------------------------------------------------------------------- a peer's transcript
#: module names of a peer transcript -> this attack's matrix names
PEER_MODULES = {path: name for name, path in LINEAR_PATHS.items()}


@dataclass
class PeerTranscript:
    """A peer's client-side transcript: per layer and matrix, the inputs it encrypted and the
    outputs it decrypted (rows are calls' rows, in order), and the token ids of the run."""

    ids: list[int]
    positions: np.ndarray  # the position of each row
    pairs: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]


def load_peer_transcript(path: Path, q_size: int, kv_size: int) -> PeerTranscript:
    """Read a ``.npz`` transcript (keys ``ids``, ``positions``, ``model.layers.<i>.<module>.x|y``);
    a fused ``self_attn.qkv_proj`` is split into q, k and v by rows [q | k | v]."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a transcript (.npz): {e}") from e
    missing = {"ids", "positions"} - set(z.files)
    if missing:
        raise ValueError(f"{path}: transcript lacks {sorted(missing)}")
    pat = re.compile(r"model\.layers\.(\d+)\.(self_attn\.\w+|mlp\.\w+)\.x")
    pairs: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for key in z.files:
        m = pat.fullmatch(key)
        if not m:
            continue
        x, y = z[key].astype(np.float64), z[key[:-1] + "y"].astype(np.float64)
        if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
            raise ValueError(f"{path}: {key[:-2]} has inputs {x.shape} and outputs {y.shape}")
        layer, module = int(m[1]), m[2]
        if module == "self_attn.qkv_proj":
            if y.shape[1] != q_size + 2 * kv_size:
                raise ValueError(f"{path}: fused qkv output has {y.shape[1]} columns, not {q_size + 2 * kv_size}")
            split = {"q": y[:, :q_size], "k": y[:, q_size:q_size + kv_size], "v": y[:, q_size + kv_size:]}
            pairs.setdefault(layer, {}).update({n: (x, v) for n, v in split.items()})
        elif module in PEER_MODULES:
            pairs.setdefault(layer, {})[PEER_MODULES[module]] = (x, y)
    if not pairs:
        raise ValueError(f"{path}: no linear module's inputs and outputs in the transcript")
    return PeerTranscript([int(t) for t in z["ids"]], np.asarray(z["positions"]), pairs)


def attack_peer(tr: PeerTranscript, weight_of) -> dict:
    """The linear-only attack on a real peer transcript: each matrix regressed on its own
    inputs. ``weight_of(layer, name)`` gives the true matrix [out, in] to score against."""
    out: dict = {}
    for layer, mats in sorted(tr.pairs.items()):
        for name, (x, y) in mats.items():
            e = errors(lstsq(x, y), weight_of(layer, name), x)
            out[f"L{layer}.{name}"] = {**e, "rows": len(x)}
    return out


# ------------------------------------------------------------------------------------ attack
def attack(ckpt, model, k: int, tr: VeilTranscript, lin: dict, last: int | None = None) -> dict:
    from veil.crypto.params import PROTECTED_PARAMS
    from veil.protected.layouts import dims_of
    from veil.protected.weights import layer_weights_from_tensors

    cfg = ckpt.config
    L, d, heads, hd, F_ = cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
    L = L if last is None else last  # the end of the protected range
    tensors = ckpt.tensors
    out: dict = {"linear_only": {}, "veil": {}}

    # Linear-only: every matrix of layer k from its own inputs and outputs.
    for name, (x, y) in lin.items():
        w = model.layers[str(k)].get_submodule(LINEAR_PATHS[name]).weight.double().numpy()
        out["linear_only"][name] = errors(lstsq(x, y), w, x)

    a = tr.arrays()
    lw = layer_weights_from_tensors(tensors, cfg, k, dims_of(cfg, PROTECTED_PARAMS.slot_count))
    x = a["h_in"]
    for name, u, w in (("gate", a["u_gate"], lw.w_gu[:F_]), ("up", a["u_up"], lw.w_gu[F_:])):
        e = errors(lstsq(x, u), w, x)
        ridge, lam = best_ridge(x, u, w)
        out["veil"][name] = {**e, "ridge_rel_err": ridge["rel_err"], "ridge_span_err": ridge["span_err"],
                             "ridge_lambda": lam}
        # what a per-token shuffle of the FFN coordinates leaves: permutation-invariant sums,
        # Σ_i û_i² = h'ᵀ (WᵀW) h', a quadratic form of the Gram matrix (d(d+1)/2 unknowns)
        gram = w.T @ w
        g_hat = quadratic_form_fit(x, (u**2).sum(axis=1))
        out["veil"][f"{name}_gram"] = {"rel_err": float(np.linalg.norm(g_hat - gram) / np.linalg.norm(gram)),
                                       "unknowns": d * (d + 1) // 2}

    # q·k: the per-head bilinear form from the diagonal scores ŝ_tt/sqrt(hd) = h_tᵀ M_h h_t / sqrt(hd)
    group = heads // cfg.num_kv_heads
    wq = tensors[f"model.layers.{k}.self_attn.q_proj.weight"].double().numpy()
    wk = tensors[f"model.layers.{k}.self_attn.k_proj.weight"].double().numpy()
    g1 = tensors[f"model.layers.{k}.input_layernorm.weight"].double().numpy()
    qk = []
    for h in range(heads):
        a_q = wq[h * hd:(h + 1) * hd] * g1[None, :]
        a_k = wk[(h // group) * hd:(h // group + 1) * hd] * g1[None, :]
        m_true = a_q.T @ a_k
        m_sym = (m_true + m_true.T) / 2
        m_hat = quadratic_form_fit(x, a["self_score"][:, h] * np.sqrt(hd))
        qk.append(float(np.linalg.norm(m_hat - m_sym) / np.linalg.norm(m_sym)))
    out["veil"]["qk_bilinear"] = {"rel_err": float(np.mean(qk)), "rel_err_per_head": qk,
                                  "unknowns_per_head": d * (d + 1) // 2}

    if k == L - 1:
        # h_L - h_k = W_o W_v Γ1 x + W_down m: one joint regression on [m, x_1..x_H]
        lw_last = layer_weights_from_tensors(tensors, cfg, L - 1, dims_of(cfg, PROTECTED_PARAMS.slot_count))
        feats = np.hstack([a["m_last"], a["x_last"]])
        y = a["h_final"] - x
        w_hat = lstsq(feats, y)
        wo = tensors[f"model.layers.{L - 1}.self_attn.o_proj.weight"].double().numpy()
        wv = tensors[f"model.layers.{L - 1}.self_attn.v_proj.weight"].double().numpy()
        g1l = tensors[f"model.layers.{L - 1}.input_layernorm.weight"].double().numpy()
        ov = np.hstack([wo[:, h * hd:(h + 1) * hd] @ wv[(h // group) * hd:(h // group + 1) * hd] * g1l[None, :]
                        for h in range(heads)])
        out["veil"]["down"] = errors(w_hat[:, :F_], lw_last.w_down, a["m_last"])
        out["veil"]["o_v"] = errors(w_hat[:, F_:], ov, a["x_last"])
        out["veil"]["down"]["unknowns_per_row"] = out["veil"]["o_v"]["unknowns_per_row"] = feats.shape[1]
    return out


def figures(res: dict) -> list[str]:
    lines = []
    for proto in [p for p in ("linear_only", "veil", *res.get("peers", ())) if p in res]:
        for name, e in res[proto].items():
            for key in ("rel_err", "span_err", "ridge_rel_err", "ridge_span_err"):
                if key in e:
                    lines.append(f"figure extraction.{proto}.{name}.{key} {e[key]:.6g}")
    return lines


def run(n_tokens: int | None = None, k: int | None = None, chunk: int = 32, progress: bool = True,
        layers: int | None = None, peer_transcript: Path | None = None, peer_name: str = "concrete-ml") -> dict:
    from veil.engine.loader import build_model, load_checkpoint

    ckpt = load_checkpoint()
    model, cfg = build_model(ckpt), ckpt.config
    peer = None
    if peer_transcript:
        peer = load_peer_transcript(peer_transcript, cfg.q_size, cfg.kv_size)
        if max(peer.pairs) >= cfg.num_layers or max(peer.ids) >= cfg.vocab_size:
            raise SystemExit(f"{peer_transcript} does not fit this model (layers {sorted(peer.pairs)})")
        # the protected run: the peer's last layer, the peer's tokens, one session (same positions)
        k = max(peer.pairs) if k is None else k
        chunks = [peer.ids]
        n_tokens, chunk = len(peer.ids), len(peer.ids)
    else:
        k = cfg.num_layers - 1 if k is None else k
        n_tokens = n_tokens or 2 * cfg.hidden_size
        chunks = text_chunks(ckpt.tokenizer, n_tokens, chunk)
    last = cfg.num_layers if layers is None else k + layers
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n_tokens, desc="protected transcript", unit="tok", file=sys.stderr)
    tr = collect_veil(ckpt, model, k, chunks, bar.update if bar else None, last)
    if bar:
        bar.close()
    res = attack(ckpt, model, k, tr, linear_only(model, k, chunks), last)
    res.update({"schema": "veil.extraction_attack/2", "tokens": n_tokens, "k": k, "last": last, "chunk": chunk,
                "hidden_size": cfg.hidden_size, "kinds_seen": sorted(tr.kinds),
                "protected_seconds": tr.seconds})
    if peer:
        res[peer_name] = attack_peer(peer, lambda i, name: model.layers[str(i)].get_submodule(
            LINEAR_PATHS[name]).weight.double().numpy())
        res["peers"] = {peer_name: {"transcript": str(peer_transcript), "layers": sorted(peer.pairs),
                                    "positions": peer.positions.tolist(),
                                    "input_rel_diff": _input_rel_diff(model, peer)}}
    return res



def _input_rel_diff(model, peer: PeerTranscript) -> dict[str, float]:
    """How far the peer's q/k/v inputs are from this model's own at the same positions (the
    transcript is of the same tokens through the same weights, up to the peer's quantization)."""
    out = {}
    for layer, mats in sorted(peer.pairs.items()):
        if "q" not in mats:
            continue
        with torch.no_grad():
            h = model.run_layers(model.embed(torch.tensor(peer.ids)), 0, layer)
            x = model.layers[str(layer)].input_layernorm(h).double().numpy()[peer.positions]
        px = mats["q"][0]
        out[f"L{layer}"] = float(np.linalg.norm(px - x) / np.linalg.norm(x))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, help="tokens of transcript (default 2·d)")
    p.add_argument("--k", type=int, help="first protected layer (default L-1)")
    p.add_argument("--chunk", type=int, default=32, help="tokens per protected session")
    p.add_argument("--layers", type=int,
                   help="protected layers from k (default: all to L). Fewer is a cheaper proxy that shows the "
                        "client more: the output of the range comes right after layer k")
    p.add_argument("--peer-transcript", type=Path,
                   help="a peer's client transcript (.npz from benchmarks/peers/concrete_ml_hybrid.py): "
                        "attacked too, and the protected run goes over its tokens")
    p.add_argument("--peer-name", default="concrete-ml")
    p.add_argument("--out", type=Path, default=Path("bench_out/extraction_attack.json"))
    args = p.parse_args(argv)
    if args.peer_transcript and args.tokens:
        p.error("--tokens and --peer-transcript exclude each other (the transcript fixes the tokens)")
    try:
        res = run(args.tokens, args.k, args.chunk, layers=args.layers, peer_transcript=args.peer_transcript,
                  peer_name=args.peer_name)
    except ValueError as e:
        p.error(str(e))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    emit(figures(res), res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
