"""Peers and earlier runs in the overhead report (``veil bench --peer F.json [--from R.json]``).

A peer result (schema ``veil.peer/1``, written by a script under ``benchmarks/peers/`` in its own
virtual environment) carries, per context ``ctx<C>``, the figures of ``protected_overhead``
under the same names, what ran where (``k``, the layers it ran in FHE, how it handled what its
back-end cannot take), its setup figures, and, when it measured only some of the server's
layers, an ``extrapolated`` block for all of them. Both become rows of the report: the measured
one under the peer's name, the extrapolated one under ``<name>-k<k>-extrapolated``.

``--from`` renders Veil's rows from a run measured earlier (``veil.bench/1`` results or a
``protected_overhead`` JSON) instead of measuring them again: the must-show at k=2 takes over
an hour of protected prefill, and the report names the file its Veil figures come from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

PEER_SCHEMA = "veil.peer/1"
CTX = re.compile(r"ctx\d+")
#: a peer's description fields copied into the report's ``peers`` block
PEER_FACTS = ("engine", "k", "server_layers", "fhe_layer_ids", "kv", "quantization", "prefill", "setup",
              "per_layer", "machine", "description", "calls")


def _read_json(path: Path) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a JSON result: {e}") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not a JSON object")
    return d


def load_peer(path: Path, name: str | None = None) -> dict:
    """A peer result, checked: the schema, a path name (``name`` replaces the file's), and at
    least one context with a TPOT."""
    d = _read_json(path)
    if d.get("schema") != PEER_SCHEMA:
        raise ValueError(f"{path}: schema {d.get('schema')!r}, expected {PEER_SCHEMA!r} (a peer's result)")
    if name is not None:
        d["path"] = name
    name = d.get("path")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
        raise ValueError(f"{path}: peer path name {name!r} must be lower-case letters, digits, - or _")
    tags = [t for t in d if CTX.fullmatch(t)]
    if not tags or not all(isinstance(d[t], dict) and isinstance(d[t].get("tpot_s"), dict) for t in tags):
        raise ValueError(f"{path}: no ctx<C> block with a tpot_s distribution")
    return d


def add_peer(results: dict, peer: dict, source: Path) -> None:
    """The peer's rows (measured, and extrapolated when present) and facts, into ``results``."""
    name = peer["path"]
    if name in results["paths"]:
        raise ValueError(f"{source}: a path named {name!r} is already in the report")
    results["paths"][name] = {t: v for t, v in peer.items() if CTX.fullmatch(t)}
    facts = {"source": str(source), **{f: peer[f] for f in PEER_FACTS if f in peer}}
    ex = peer.get("extrapolated")
    if isinstance(ex, dict):
        ex_name = f"{name}-k{ex.get('k', peer.get('k'))}-extrapolated"
        results["paths"][ex_name] = {t: v for t, v in ex.items() if CTX.fullmatch(t)}
        facts.update(extrapolated_path=ex_name, extrapolation=ex.get("method", ""))
    results.setdefault("peers", {})[name] = facts


def results_from(path: Path) -> dict:
    """Veil's results of an earlier run, in ``veil.bench/1`` form, marked with their source."""
    d = _read_json(path)
    schema = d.get("schema")
    if schema == "veil.bench/1":
        out = d
    elif schema == "veil.protected_overhead/1":
        paths = {p: {t: v for t, v in by.items() if CTX.fullmatch(t)} for p, by in d["paths"].items()}
        tags = sorted({t for by in paths.values() for t in by}, key=lambda t: int(t[3:]))
        new_tokens = next((r.get("new_tokens") for by in paths.values() for r in by.values()), None)
        out = {"schema": "veil.bench/1", "interrupted": False,
               "machine": {**d.get("machine", {}), "param_set": d.get("param_set"), "k": d.get("k")},
               "settings": {"paths": list(paths), "contexts": [int(t[3:]) for t in tags], "concurrency": [],
                            "max_new_tokens": new_tokens, "k": d.get("k"), "quick": False,
                            "slo_ttft_ms": None, "slo_tpot_ms": None, "concurrency_prompt": None},
               "paths": paths}
        for p in paths:
            for key in ("server_peak_rss_bytes", "client_peak_rss_bytes"):
                if key in d:
                    paths[p][key] = d[key]
    else:
        raise ValueError(f"{path}: schema {schema!r}: expected veil.bench/1 or veil.protected_overhead/1")
    out["source"] = str(path)
    return out
