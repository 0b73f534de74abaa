"""Protected sessions batched across: ``python -m veil.benchmarks.protected_sessions``.

For each session count S (``--sessions 1,4``) it opens S sessions, each with its own client and
its own evaluation keys, on one executor of the protected layers ``[layer, layer + 2)`` (default
28: the k=28 split of SmolLM2's 30 layers, whose last two layers are the protected ones), seeds
each session's encrypted KV cache with ``ctx - 1`` positions (bench-only shortcut, as in
``protected_bench``) and times decode steps of all S sessions in lockstep (``--steps``, each one
position further on the same sessions, keys and caches, as a served batch runs): every round trip
hands the S messages to ``ProtectedExecutor.handle_batch``, which runs them as one batched
evaluation on the native backend (``veil.protected.batch``); S = 1 is the ordinary one-session
step. With ``--spread`` session b steps at position ``ctx - 1 - b`` instead, so the batch's rows
stand at different positions (as sessions of a real service do). Clients run one after another
between round trips in this process; ``tpot_s.own_clients`` is the step with each round trip
waiting for its slowest client only, as S SDKs on their own machines would (derived from the
clients' timed steps, no network).

Per session count, the means over the timed steps (the JSON keeps each step): the step's wall
time, the TPOT every session sees (all finish together),
aggregate tokens/s (S / wall), server seconds by operation (on CUDA from one more step, with
``--split-round``, the default there: the timed steps run as a server runs them, the host
queueing kernels ahead of the device, so an op kind's wall time would carry the queued work of
earlier ones; the split step waits for the device at every op kind's boundary, and its total,
``server_s.synced``, says what those waits cost), the cores the server's work kept
busy (its CPU seconds, every thread's, over its wall seconds) and the page faults it took, and
each session's next token from its decrypted h_L (final norm and LM head in the clear) against
the plaintext model's.
``--modes batched,alone`` times the same sessions both ways, step by step in turn (``alone``: each
round trip's messages handed over one per call, as a server with ``--protected-max-batch 1``
runs them; its figures carry ``.alone``): what batching sessions buys, paired in one run.
``--warmup [STEPS]`` first steps the sessions untimed, once or STEPS times, so that compiled code
is timed warm and, on the CPU, the heap has grown to the size the step needs
(benchmarks/results/2026-12-03-context-leak: with fresh sessions and keys for every step, as this
benchmark had it until then, 4-session steps faulted fresh pages for about three steps).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch

from veil.benchmarks.protected_bench import PROMPT, _seed_cache
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.client import ProtectedClientState
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.server import ProtectedExecutor
from veil.protected.weights import layer_weights_from_tensors
from veil.server.config import ServerConfig

FIGURES: dict[str, float] = {}
STEPS: dict[int, list[dict]] = {}  # session count -> each timed step's record (the JSON's)


def fig(name: str, value: float) -> None:
    FIGURES[name] = float(value)
    print(f"figure protected.{name} {value:.6g}", flush=True)


def _step(ex: ProtectedExecutor, states: list, pos: list[int], h0: np.ndarray, logits, device: str,
          alone: bool = False, synchronize: bool = False) -> dict:
    """One decode step of every session in lockstep at its position in ``pos``: each round trip
    hands all pending messages to ``handle_batch`` (``alone``: one message per call);
    the clients run one after another; each session's token from its h_L by ``logits`` (final
    norm and LM head in the clear). ``synchronize``: on CUDA, the server waits for the device at
    every timed boundary (protected/timing.py), so that each op kind's seconds are its own."""
    ex.be.reset()
    ex.be.synchronize = synchronize
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    n = len(states)
    server = server_cpu = client = slowest = 0.0  # slowest: each round trip's slowest client, summed
    faults = 0
    t0 = time.perf_counter()
    msgs = [c.token_message(h0[p]) for c, p in zip(states, pos, strict=True)]
    outs: list = [None] * n
    while any(m is not None for m in msgs):
        live = [i for i, m in enumerate(msgs) if m is not None]
        ts, tp = time.perf_counter(), time.process_time()  # process time: every thread's CPU seconds
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        pending = [msgs[i] for i in live]
        # alone: a batch of one per message, as the scheduler hands them over at --protected-max-batch 1
        replies = [r for m in pending for r in ex.handle_batch([m])] if alone else ex.handle_batch(pending)
        server += time.perf_counter() - ts
        server_cpu += time.process_time() - tp
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        round_max = 0.0
        for i, reply in zip(live, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            tc = time.perf_counter()
            nxt = states[i].handle(reply)
            dt = time.perf_counter() - tc
            client, round_max = client + dt, max(round_max, dt)
            if isinstance(nxt, np.ndarray):
                outs[i], msgs[i] = nxt, None
            else:
                msgs[i] = nxt
        slowest += round_max
    wall = time.perf_counter() - t0
    tokens = [int(logits(torch.from_numpy(h).float()[None])[-1].argmax()) for h in outs]
    return {"positions": list(pos), "wall": wall, "server": server, "server_cpu": server_cpu, "client": client,
            "slowest": slowest, "faults": faults, "tokens": tokens, "times": dict(ex.be.times),
            "matvec_by_shape": {str(k): v for k, v in ex.be.matvec_by_shape.items()}, "counts": dict(ex.be.counts),
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if device.startswith("cuda") else 0.0,
            "synchronized": synchronize}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", default="1,4")
    ap.add_argument("--layer", type=int, default=28, help="first of the two protected layers")
    ap.add_argument("--ctx", type=int, default=16, help="the first step's position + 1")
    ap.add_argument("--spread", action="store_true",
                    help="session b steps at position ctx - 1 - b: the batch's rows stand at different positions")
    ap.add_argument("--warmup", type=int, nargs="?", const=1, default=0, metavar="STEPS",
                    help="step the sessions STEPS times (1 without a number) untimed first: compiled code "
                         "warm (with VEIL_NATIVE_COMPILE=1 the first step of a batch size compiles) and, on "
                         "the CPU, the heap grown to its steady size")
    ap.add_argument("--steps", type=int, default=1,
                    help="timed decode steps of the same sessions, one position further each (figures: their mean)")
    ap.add_argument("--modes", default="batched",
                    help="comma-separated, taken in turn step by step: batched (all of a round trip's messages "
                         "in one handle_batch), alone (one message per call)")
    ap.add_argument("--split-round", action=argparse.BooleanOptionalAction, default=None,
                    help="one more step per mode, the server waiting for the device at every op kind's "
                         "boundary, for the server time by op kind (default: on CUDA only, where the timed "
                         "steps run unsynchronized, as a server runs them, and a kind's own seconds are not known)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", help="a .gguf file or a Hugging Face directory (default: the shipped SmolLM2)")
    ap.add_argument("--out", type=Path, default=Path("bench_out/protected_sessions.json"))
    args = ap.parse_args(argv)
    counts = [int(s) for s in args.sessions.split(",")]
    modes = args.modes.split(",")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps >= 1 and --warmup >= 0")
    if not modes or any(m not in ("batched", "alone") for m in modes) or len(set(modes)) != len(modes):
        ap.error("--modes: batched and/or alone, each once")
    rounds = (args.warmup + args.steps) * len(modes)  # every step one position further
    if args.split_round is None:
        args.split_round = args.device.startswith("cuda")

    from veil.engine.loader import build_model, load_checkpoint

    ckpt = load_checkpoint(args.model)
    model, cfg = build_model(ckpt), ckpt.config
    if args.layer + 2 != cfg.num_layers:
        ap.error(f"--layer must be num_layers - 2 = {cfg.num_layers - 2}: the last layer's h_L gives the token")
    dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
    layers = (args.layer, args.layer + 1)
    ids = ckpt.tokenizer(PROMPT, return_tensors="pt")["input_ids"][0][: args.ctx + rounds + len(modes) - 1]
    with torch.no_grad():
        h0 = model.run_layers(model.embed(ids), 0, layers[0])
        h1 = model.run_layers(h0, layers[0], layers[1])
        want = model.logits(model.run_layers(h1, layers[1], layers[1] + 1)).argmax(-1).tolist()  # per position
    h0, h1 = h0.double().numpy(), h1.double().numpy()

    steps = rotation_key_levels(dims)
    clients, t = [], time.perf_counter()
    for _ in range(max(counts)):
        be = make_backend(PROTECTED_PARAMS, "native", device=args.device)
        be.generate_keys(steps, relin_key_level())
        clients.append(be)
    fig("sessions.keygen_s_per_client", (time.perf_counter() - t) / max(counts))
    server_be = make_backend(PROTECTED_PARAMS, "native", device=args.device)  # encodes the weights only
    weights = [layer_weights_from_tensors(ckpt.tensors, cfg, i, dims) for i in layers]
    ex = ProtectedExecutor(server_be, cfg, weights, ServerConfig().protected_limits())

    for n in counts:
        pos0 = [args.ctx - 1 - (b if args.spread else 0) for b in range(n)]
        sessions, states = [], []
        for be, p in zip(clients[:n], pos0, strict=True):
            key_set = make_backend(PROTECTED_PARAMS, "native", device=args.device)
            key_set.import_public_material(be.export_public_material())
            s = ex.new_session(key_set)
            c = ProtectedClientState(be, cfg, layers[0], layers[1] + 1, s.id)
            _seed_cache(ex, c, s, weights[0], cfg, layers[0], h0, p)
            _seed_cache(ex, c, s, weights[1], cfg, layers[1], h1, p)
            sessions.append(s)
            states.append(c)
        # the timed rounds as a server runs them; then, with --split-round, one more per mode that
        # waits for the device at each op kind's boundary, for the server time by op kind
        runs = [(i, modes[i % len(modes)], False) for i in range(rounds)]
        runs += [(rounds + j, mode, True) for j, mode in enumerate(modes)] if args.split_round else []
        done = [(i, mode, _step(ex, states, [p + i for p in pos0], h0, model.logits, args.device, mode == "alone",
                                synced)) for i, mode, synced in runs]
        for s in sessions:
            ex.drop_session(s.id)
        for mode in modes:
            sfx = "" if mode == "batched" else ".alone"
            timed = [(i, r) for i, m, r in done[args.warmup * len(modes):rounds] if m == mode]
            split = [(i, r) for i, m, r in done[rounds:] if m == mode]
            _report(n, sfx, timed, split, pos0, want, args.device)
            STEPS[n if mode == "batched" else f"{n}.alone"] = [r for _, r in timed + split]
    if len(counts) > 1 and counts[0] == 1:
        for n in counts[1:]:
            for sfx in ("" if m == "batched" else ".alone" for m in modes):
                fig(f"sessions.aggregate_speedup{sfx}.s{n}", FIGURES[f"aggregate_tok_s{sfx}.s{n}"] / FIGURES[f"aggregate_tok_s{sfx}.s1"])
    if "batched" in modes and "alone" in modes:
        for n in counts:
            fig(f"sessions.batched_over_alone.s{n}", FIGURES[f"aggregate_tok_s.s{n}"] / FIGURES[f"aggregate_tok_s.alone.s{n}"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sessions": counts, "layers": list(layers), "ctx": args.ctx, "spread": args.spread,
                                    "warmup": args.warmup, "steps": args.steps, "modes": modes, "device": args.device,
                                    "model": ckpt.source, "figures": FIGURES, "steps_by_sessions": STEPS}, indent=2))


def _report(n: int, sfx: str, timed: list[tuple[int, dict]], split: list[tuple[int, dict]], pos0: list[int],
            want: list[int], device: str) -> None:
    """One session count's figures over its timed steps ``(round, record)`` of one mode; the
    server time by op kind from its ``split`` step where there is one (else the timed steps')."""
    recs = [r for _, r in timed]
    by_kind = [r for _, r in split] or recs
    mean = {k: sum(r[k] for r in recs) / len(recs) for k in ("wall", "server", "server_cpu", "client", "slowest",
                                                            "faults")}
    fig(f"sessions.tpot_s{sfx}.s{n}", mean["wall"])
    fig(f"aggregate_tok_s{sfx}.s{n}", n / mean["wall"])
    fig(f"sessions.server_s{sfx}.s{n}", mean["server"])
    fig(f"sessions.client_s{sfx}.s{n}", mean["client"])
    # how many of the machine's cores the server's work kept busy: on a CPU, what batching
    # sessions can still win is the idle remainder plus what shared weight reads save
    fig(f"sessions.server_cpu_cores{sfx}.s{n}", mean["server_cpu"] / mean["server"])
    # pages the server's work touched for the first time: each is a fault and a zeroed page
    # (30 us apiece on the development VM), what a heap that keeps growing costs
    fig(f"sessions.server_page_faults{sfx}.s{n}", mean["faults"])
    # derived, not timed: the step as S SDKs on their own machines would see it, each round
    # trip waiting for its slowest client instead of all of them in turn (no network)
    own = mean["wall"] - mean["client"] + mean["slowest"]
    fig(f"sessions.tpot_s.own_clients{sfx}.s{n}", own)
    fig(f"aggregate_tok_s.own_clients{sfx}.s{n}", n / own)
    if split:  # what waiting at each op kind's boundaries costs the same step
        fig(f"sessions.server_s.synced{sfx}.s{n}", sum(r["server"] for r in by_kind) / len(by_kind))
    for kind in sorted({k for r in by_kind for k in r["times"]}):
        fig(f"sessions.server_s{sfx}.{kind}.s{n}", sum(r["times"].get(kind, 0.0) for r in by_kind) / len(by_kind))
    if device.startswith("cuda"):  # weights, every session's keys and caches, the steps' peak
        fig(f"sessions.device_peak_gb{sfx}.s{n}", max(r["peak_gb"] for r in recs))
    plain = [[want[p + i] for p in pos0] for i, _ in timed + split]
    fig(f"sessions.tokens_equal_plaintext{sfx}.s{n}", float([r["tokens"] for _, r in timed + split] == plain))
    for (i, r), w in zip(timed + split, plain, strict=True):
        print(f"# s{n}{sfx} round {i}: positions {r['positions']}, wall {r['wall']:.3f} s, server {r['server']:.3f} s, "
              f"faults {r['faults']}, tokens {r['tokens']}, plaintext {w}", flush=True)
    for shape, dt in sorted(by_kind[-1]["matvec_by_shape"].items()):
        print(f"# s{n}{sfx}: last step's matvec {shape}: {dt:.3f} s", flush=True)
    print(f"# s{n}{sfx}: last step's counts {by_kind[-1]['counts']}", flush=True)


if __name__ == "__main__":
    main()
