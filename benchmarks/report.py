"""``report.md`` and the PNG plots of ``veil bench`` (results of ``veil.benchmarks.overhead``)."""

from __future__ import annotations

import re
from pathlib import Path

PATH_ORDER = ("reference", "fast", "split-plain", "protected")
OPS = ("matvec", "ctct", "rotations", "refresh", "flooding", "shuffle", "serialization", "other")
# (metric, stat or None, unit label, scale)
CONTEXT_FIGURES = (
    ("ttft_s", None, "TTFT (s)", 1.0),
    ("tpot_s", "mean", "TPOT mean (s)", 1.0),
    ("tpot_s", "p50", "TPOT p50 (s)", 1.0),
    ("tpot_s", "p99", "TPOT p99 (s)", 1.0),
    ("e2el_s", None, "end-to-end latency (s)", 1.0),
    ("bytes_up_per_token", None, "bytes up / token (kB)", 1e-3),
    ("bytes_down_per_token", None, "bytes down / token (kB)", 1e-3),
    ("setup_bytes", None, "setup bytes (MB)", 1e-6),
    ("round_trips_per_token", None, "round trips / token", 1.0),
    ("client_cpu_s_per_token", None, "client CPU s / token", 1.0),
    ("kl_mean", None, "mean KL vs reference", 1.0),
    ("greedy_agreement", None, "greedy agreement", 1.0),
)
CONC_FIGURES = (("output_tok_s", "output tok/s"), ("requests_s", "requests/s"), ("goodput_rps", "goodput (req/s)"),
                ("ttft_s", "TTFT mean (s)"), ("tpot_s", "TPOT mean (s)"))


def _base(path: str) -> str:
    """``fast@r2`` (measured on ``veil serve --replicas 2``) → ``fast``."""
    return path.partition("@r")[0]


def _paths(results: dict) -> list[str]:
    """Veil's paths in their order (each path's replica runs after it), then peers' rows in the
    order they were added."""
    def order(p: str):
        return PATH_ORDER.index(_base(p)), int(p.partition("@r")[2] or 0)

    veil = sorted((p for p in results["paths"] if _base(p) in PATH_ORDER), key=order)
    return veil + [p for p in results["paths"] if _base(p) not in PATH_ORDER]


def _label(results: dict, p: str) -> str:
    """A row's name in the tables: peers' rows say what was measured and what extrapolated."""
    for name, f in results.get("peers", {}).items():
        if p == name and f.get("fhe_layer_ids") is not None:
            steps = {r.get("new_tokens", 1) - 1 for t, r in results["paths"][p].items() if isinstance(r, dict)}
            return (f"{p} (measured: {len(f['fhe_layer_ids'])} of {f.get('server_layers', '?')} server layers in FHE, "
                    f"{'/'.join(map(str, sorted(steps)))} decode steps)")
        if p == f.get("extrapolated_path"):
            return f"{p} (all {f.get('server_layers', '?')} server layers, extrapolated)"
    return p


#: what a client can learn on each path, for the report (SECURITY.md has the details for Veil)
CLIENT_LEARNS = {
    "reference": "everything: it holds the whole model",
    "fast": "its tokens only; the server holds the weights and sees the prompt and the output",
    "split-plain": "its own layers [0, k); the server sees the hidden states after layer k in the clear",
    "protected": "its own layers' values and the statistics PROTOCOL.md lists (σ, σ', pre-softmax scores ŝ, "
                 "SwiGLU inputs û, h_L), never both the input and the output of a server linear layer; the "
                 "server sees only CKKS ciphertexts. Residual leak: the first protected layer's gate/up "
                 "matrices can be fitted from ~d tokens (SECURITY.md)",
}
PEER_LEARNS = {
    "concrete-ml": "every FHE linear module's input (it computes it in the clear) and its decrypted output, "
                   "for every token: each matrix by least squares from as many tokens as its input width; "
                   "all non-linear parts (norms, RoPE, softmax, SiLU) run on the client in the clear; with dynamic "
                   "quantization it also holds each output channel's weight scale, zero point and quantized "
                   "row sum (it dequantizes with them). The server sees only GLWE ciphertexts",
}
KV_LEARNS = {
    "fused": "k_proj and v_proj ran fused with q_proj as one 576→960 GLWE module (their weights stay on the "
             "server, and the client sees their outputs as it sees every module's)",
    "clear": "k_proj and v_proj ran on the client in the clear: the client holds those weights",
}


def _tags(results: dict, prefix: str) -> list[str]:
    """``ctx16, ctx64…`` (prefix "ctx") or ``c1, c4…`` (prefix "c"), in numeric order."""
    pat = re.compile(rf"{prefix}(\d+)")
    tags = {t for by in results["paths"].values() for t, v in by.items() if pat.fullmatch(t) and isinstance(v, dict)}
    return sorted(tags, key=lambda t: int(pat.fullmatch(t)[1]))


def _get(r: dict | None, metric: str, stat: str | None):
    if not isinstance(r, dict):
        return None
    v = r.get(metric)
    if isinstance(v, dict):
        v = v.get(stat or "mean")
    return v


def _short(results: dict, p: str) -> str:
    """A plot label: the row name, with the measured peer row's FHE layer count."""
    f = results.get("peers", {}).get(p)
    if f and f.get("fhe_layer_ids") is not None:
        return f"{p}\n({len(f['fhe_layer_ids'])} FHE layers)"
    return p.replace("-extrapolated", "\n(extrapolated)")


def _fmt(v, scale: float = 1.0) -> str:
    if v is None:
        return "—"
    v = v * scale
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.3g}"
    return f"{v:.3f}".rstrip("0").rstrip(".")


def write_report(path: Path, results: dict) -> None:
    s, m = results["settings"], results["machine"]
    paths = _paths(results)
    ctx_tags, conc_tags = _tags(results, "ctx"), _tags(results, "c")
    out = ["# Veil overhead report", ""]
    if results.get("interrupted"):
        out += ["**Interrupted run: the tables hold what was measured before Ctrl-C.**", ""]
    line = (f"Machine: {m.get('cpu')} ({m.get('cpus')} CPUs), GPU: {m.get('gpu') or 'none'}; torch {m.get('torch')}, "
            f"tenseal {m.get('tenseal')}; parameter set `{m.get('param_set')}`; split k={s['k']} "
            f"(the server runs layers [{s['k']}, L)). Contexts {s['contexts']}, {s['max_new_tokens']} new tokens, greedy")
    if s.get("concurrency"):
        line += (f"; concurrency {s['concurrency']} ({s['concurrency_prompt']}-token prompts); "
                 f"SLO: TTFT ≤ {s['slo_ttft_ms']} ms and TPOT ≤ {s['slo_tpot_ms']} ms")
    if results.get("wall_s") is not None:
        line += f". Wall time {results['wall_s']:.0f} s"
    out += [line + ".", ""]
    if results.get("source"):
        out += [f"Veil's rows were measured earlier and are read from `{results['source']}`; peers' rows come "
                "from their own files (below). Same machine kind, not the same run: compare the orders of "
                "magnitude, not the last digit.", ""]
    if "threads" in s:  # client and server share the machine: how its cores were split
        t = s["threads"]
        out += [f"Cores: {m.get('cpus')}, split between the processes: the server (`veil serve --threads`, "
                f"engine on {s.get('device', 'cpu')}) {t['server']} torch threads, this client process (SDK) "
                f"{t['client']}; the reference ran alone before the server started, with {t['reference']}.", ""]
    out += ["## How to read this", "",
            "Each table is one figure; rows are paths, columns context lengths (prompt tokens) or client "
            "concurrency. `reference` is what a user gets from `transformers` alone; `fast` adds a server "
            "(batching, paged KV cache) but trusts it with everything; `split-plain` keeps the embedding, the first "
            "k layers and the sampling on the client and sends hidden states in the clear; `protected` sends "
            "only CKKS ciphertexts. The price of privacy is the protected/split-plain ratio; the price of "
            "splitting at all is split-plain/fast. TPOT is one decode step; TTFT includes the whole prefill "
            "(the protected path prefills position by position). Bytes and round trips are per decode token; "
            "setup bytes (the client's evaluation keys) are paid once per client. KL is the mean "
            "KL(reference ‖ path) of the next-token distribution over the generated positions, teacher-forced "
            "on the path's own tokens; greedy agreement is the fraction of positions whose argmax matches.", ""]
    ratios = results.get("ratios", {})
    if ratios:
        out += ["## Overhead ratios", "", "| ratio | value |", "| --- | --- |"]
        out += [f"| {k} | {_fmt(v)} |" for k, v in sorted(ratios.items())]
        out.append("")
    if ctx_tags:
        out += ["## Per context", ""]
        for metric, stat, label, scale in CONTEXT_FIGURES:
            rows = []
            for p in paths:
                vals = [_get(results["paths"][p].get(t), metric, stat) for t in ctx_tags]
                if any(v is not None for v in vals):
                    rows.append(f"| {_label(results, p)} | " + " | ".join(_fmt(v, scale) for v in vals) + " |")
            if rows:
                out += [f"### {label}", "", "| path | " + " | ".join(ctx_tags) + " |",
                        "| --- |" + " --- |" * len(ctx_tags), *rows, ""]
        prot = results["paths"].get("protected", {})
        ops_rows = []
        for t in ctx_tags:
            srv = prot.get(t, {}).get("server_s") if isinstance(prot.get(t), dict) else None
            if srv:
                ops_rows.append(f"| {t} | " + " | ".join(_fmt(srv.get(op, 0.0)) for op in OPS) +
                                f" | {_fmt(sum(srv.values()))} |")
        if ops_rows:
            out += ["### Protected server time per token by operation (s)", "",
                    "| context | " + " | ".join(OPS) + " | total |", "| --- |" + " --- |" * (len(OPS) + 1),
                    *ops_rows, ""]
    if conc_tags:
        out += ["## Under load", ""]
        for metric, label in CONC_FIGURES:
            rows = []
            for p in paths:
                vals = [_get(results["paths"][p].get(t), metric, "mean") for t in conc_tags]
                if any(v is not None for v in vals):
                    rows.append(f"| {p} | " + " | ".join(_fmt(v) for v in vals) + " |")
            if rows:
                out += [f"### {label}", "", "| path | " + " | ".join(conc_tags) + " |",
                        "| --- |" + " --- |" * len(conc_tags), *rows, ""]
    out += _peer_sections(results) + _learns_section(results, paths) + _extraction_section(results)
    rss = [(p, results["paths"][p].get("server_peak_rss_bytes"), results["paths"][p].get("client_peak_rss_bytes"))
           for p in paths if p in PATH_ORDER]
    out += ["## Peak memory (after each path; the server is shared, so its figure only grows)", "",
            "| path | server peak RSS (GB) | client peak RSS (GB) |", "| --- | --- | --- |"]
    out += [f"| {p} | {_fmt(a, 1e-9)} | {_fmt(b, 1e-9)} |" for p, a, b in rss]
    out.append("")
    path.write_text("\n".join(out))


def _peer_sections(results: dict) -> list[str]:
    out = []
    for name, f in results.get("peers", {}).items():
        out += [f"## Peer: {name}", "", f"From `{f['source']}`: {f.get('engine', '')}."]
        if f.get("fhe_layer_ids") is not None:
            out += [f"Split k={f.get('k')}: of the server's {f.get('server_layers')} layers, layers "
                    f"{f['fhe_layer_ids']} ran their linear modules in FHE and the rest in the clear; "
                    f"k/v: {f.get('kv')} ({KV_LEARNS.get(f.get('kv'), '')}); quantization {f.get('quantization')}; "
                    f"prefill: {f.get('prefill')}."]
        if f.get("extrapolation"):
            out += [f"Extrapolated row `{f.get('extrapolated_path')}`: {f['extrapolation']}."]
        out.append("")
        for title, block in (("setup", f.get("setup")), ("per FHE layer and decode token", f.get("per_layer"))):
            if isinstance(block, dict):
                out += [f"| {name}: {title} | value |", "| --- | --- |",
                        *[f"| {k} | {_fmt(v)} |" for k, v in block.items() if isinstance(v, int | float)], ""]
        calls = f.get("calls") or {}
        if calls:
            out += [f"| {name}: remote call (module.rows) | calls | server s / call | bytes up / call | "
                    "bytes down / call |", "| --- | --- | --- | --- | --- |"]
            out += [f"| {kind} | {c.get('calls')} | {_fmt(c.get('server_s_mean'))} | {_fmt(c.get('bytes_up_mean'))} | "
                    f"{_fmt(c.get('bytes_down_mean'))} |" for kind, c in calls.items()]
            out.append("")
    return out


def _learns_section(results: dict, paths: list[str]) -> list[str]:
    rows = [(p, CLIENT_LEARNS[p]) for p in paths if p in CLIENT_LEARNS]
    for name, f in results.get("peers", {}).items():
        what = next((w for peer, w in PEER_LEARNS.items() if name.startswith(peer)), "see the peer's documentation")
        if f.get("kv") in KV_LEARNS:
            what += f"; here {KV_LEARNS[f['kv']]}"
        rows.append((name, what))
    if not rows:
        return []
    return ["## What each protocol lets the client learn", "", "| path | the client learns |", "| --- | --- |",
            *[f"| {p} | {w} |" for p, w in rows], ""]


def _extraction_section(results: dict) -> list[str]:
    """The attack's relative errors per matrix and transcript (lower = the weight leaked)."""
    ex = results.get("extraction")
    if not ex:
        return []
    protos = [p for p in ("linear_only", "veil", *ex.get("peers", {})) if p in ex]
    # Veil's and the linear-only fits are of layer k (and L-1 = k for down, o·v): name them by
    # layer like a peer's, with the transcript's token count as their rows
    table = {p: {f"L{ex.get('k')}.{n}": {"rows": ex.get("tokens"), **e} for n, e in ex[p].items()}
             if p in ("linear_only", "veil") else ex[p] for p in protos}
    names = sorted({n for p in protos for n in table[p]}, key=lambda n: (int(n[1:n.index(".")]), n)
                   if re.match(r"L\d+\.", n) else (-1, n))
    out = ["## Weight extraction from the client's transcript", "",
           f"`veil.benchmarks.extraction_attack` at k={ex.get('k')} over {ex.get('tokens')} tokens: relative error "
           "‖Ŵ − W‖/‖W‖ on the input span the transcript probed (`span_err`, or `rel_err` where the fit has no "
           "span; rows = tokens seen; a fit is only as wide as its rows, so compare each column's errors, not "
           "its spans). `linear_only` is what a linear-only protocol reveals, computed with the plaintext "
           "model; `veil` is the real protected protocol's transcript (gate, up, qk_bilinear of layer k; down "
           "and o_v of layer L-1); a peer's column is its real client transcript (its rows in FHE only).", "",
           "| matrix | " + " | ".join(protos) + " |", "| --- |" + " --- |" * len(protos)]
    for n in names:
        cells = []
        for p in protos:
            e = table[p].get(n)
            v = None if e is None else e.get("span_err", e.get("rel_err"))
            cells.append("—" if v is None else _fmt(v) + (f" ({e['rows']} rows)" if "rows" in e else ""))
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out + [""]


def write_plots(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = _paths(results)
    ctx_tags, conc_tags = _tags(results, "ctx"), _tags(results, "c")
    ctxs = [int(t[3:]) for t in ctx_tags]

    # TPOT vs context, log scale
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for p in paths:
        pts = [(c, _get(results["paths"][p].get(t), "tpot_s", "mean")) for c, t in zip(ctxs, ctx_tags, strict=True)]
        pts = [(c, v) for c, v in pts if v]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="s" if p not in PATH_ORDER else "o", label=_short(results, p).replace("\n", " "),
                    linestyle="--" if p.endswith("-extrapolated") else "-")
    ax.set_yscale("log")
    ax.set_xlabel("context (prompt tokens)")
    ax.set_ylabel("TPOT, mean (s, log scale)")
    ax.set_title("Time per output token vs context")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(out / "tpot_vs_context.png", dpi=110)
    plt.close(fig)

    # bytes per token (up / down), at the largest measured context of each path, log scale
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    wire = [p for p in paths if _base(p) not in ("reference", "fast")]
    labels, up, down = [], [], []
    for p in wire:
        t = next((t for t in reversed(ctx_tags) if isinstance(results["paths"][p].get(t), dict)), None)
        if t is None:
            continue
        r = results["paths"][p][t]
        labels.append(f"{_short(results, p)}\n({t})")
        up.append(r.get("bytes_up_per_token", 0) or 0)
        down.append(r.get("bytes_down_per_token", 0) or 0)
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], up, width=0.4, label="up (client → server)")
    ax.bar([i + 0.2 for i in x], down, width=0.4, label="down (server → client)")
    ax.set_xticks(list(x), labels)
    log = any(v > 0 for v in up + down)  # a run whose paths sent nothing (a smoke run) plots linear
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("bytes per decode token" + (" (log scale)" if log else ""))
    ax.set_title("Wire bytes per token (fast path: token ids only, not shown)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "bytes_per_token.png", dpi=110)
    plt.close(fig)

    # round trips per decode token, at the largest measured context of each path
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    bars = []
    for p in paths:
        t = next((t for t in reversed(ctx_tags) if _get(results["paths"][p].get(t), "round_trips_per_token", None)
                  is not None), None)
        if t is not None:
            bars.append((f"{_short(results, p)}\n({t})", results["paths"][p][t]["round_trips_per_token"]))
    if bars:
        ax.bar([b for b, _ in bars], [v for _, v in bars], color="tab:purple")
        for i, (_, v) in enumerate(bars):
            ax.text(i, v, _fmt(v), ha="center", va="bottom")
    else:
        ax.text(0.5, 0.5, "no path with round trips measured", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("round trips per decode token")
    ax.set_title("Client-server round trips per token")
    fig.tight_layout()
    fig.savefig(out / "round_trips_per_token.png", dpi=110)
    plt.close(fig)

    # throughput and goodput vs concurrency: two panels, one colour per path
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for p in [p for p in paths if _base(p) in ("fast", "split-plain")]:
        pts = [(int(t[1:]), results["paths"][p][t]) for t in conc_tags if isinstance(results["paths"][p].get(t), dict)]
        if not pts:
            continue
        cs = [c for c, _ in pts]
        ax.plot(cs, [r["output_tok_s"] for _, r in pts], marker="o", label=p)
        if all("goodput_rps" in r for _, r in pts):
            ax2.plot(cs, [r["goodput_rps"] for _, r in pts], marker="s", label=p)
    s_ = results["settings"]
    slo = (f"Goodput (TTFT ≤ {s_['slo_ttft_ms']:g} ms, TPOT ≤ {s_['slo_tpot_ms']:g} ms)"
           if s_.get("slo_ttft_ms") is not None and s_.get("slo_tpot_ms") is not None else "Goodput (no SLO set)")
    for a_, ylabel, title in ((ax, "output tokens/s", "Throughput"), (ax2, "requests/s within the SLO", slo)):
        a_.set_xscale("log", base=2)
        a_.set_xticks([int(t[1:]) for t in conc_tags], [t[1:] for t in conc_tags])
        a_.set_xlabel("concurrency (requests in flight)")
        a_.set_ylabel(ylabel)
        a_.set_title(title)
        a_.set_ylim(bottom=0)
        a_.grid(True, alpha=0.3)
        if a_.get_legend_handles_labels()[0]:
            a_.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput_vs_concurrency.png", dpi=110)
    plt.close(fig)

    # protected server-time breakdown per context (stacked)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    prot = results["paths"].get("protected", {})
    rows = [(t, prot[t]["server_s"]) for t in ctx_tags if isinstance(prot.get(t), dict) and prot[t].get("server_s")]
    bottom = [0.0] * len(rows)
    for op in OPS:
        vals = [srv.get(op, 0.0) for _, srv in rows]
        if any(vals):
            ax.bar([t for t, _ in rows], vals, bottom=bottom, label=op)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("server HE seconds per decode token")
    ax.set_xlabel("context")
    k = results["settings"]["k"]
    ax.set_title(f"Protected server time by operation (k={k})")
    if rows:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "protected path not measured", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out / "protected_server_breakdown.png", dpi=110)
    plt.close(fig)
