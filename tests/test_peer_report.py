"""A peer's result in the overhead report, and a peer's transcript in the extraction attack.

Fast and without concrete-ml: the peer JSON, the earlier Veil run and the transcripts here are
small stand-ins written by the tests in the formats that `benchmarks/peers/concrete_ml_hybrid.py`
and `protected_overhead` write (the real ones are under benchmarks/results/2026-11-24-concrete/).
What is tested is the reading and rendering, not the figures.
"""

import json

import numpy as np
import pytest

from veil.benchmarks import overhead
from veil.benchmarks.extraction_attack import attack_peer, load_peer_transcript
from veil.benchmarks.peer_results import load_peer
from veil.cli.main import main as veil_main

DIST = {"mean": 2.0, "p50": 2.0, "p95": 2.1, "p99": 2.1}


def _peer(**over) -> dict:
    ctx = {"context": 64, "new_tokens": 8, "tokens": [1, 2], "fhe_layers": 2, "ttft_s": 5.0, "tpot_s": DIST,
           "itl_s": DIST, "bytes_up_per_token": 1000.0, "bytes_down_per_token": 900.0, "bytes_per_token": 1900.0,
           "round_trips_per_token": 10.0, "client_cpu_s_per_token": 0.5, "setup_bytes": 1e8, "kl_mean": 1e-3,
           "greedy_agreement": 1.0}
    d = {"schema": "veil.peer/1", "path": "concrete-ml", "engine": "stand-in", "k": 2, "server_layers": 28,
         "fhe_layer_ids": [2, 29], "kv": "fused", "quantization": "dynamic", "prefill": "clear",
         "setup": {"compile_s": 3.0, "keygen_s": 4.0, "compression_key_bytes": 1e8},
         "per_layer": {"bytes_per_token": 950.0, "round_trips_per_token": 5.0}, "ctx64": ctx,
         "calls": {"o_proj.rows1": {"calls": 14, "server_s_mean": 3.5, "bytes_up_mean": 10112.0,
                                    "bytes_down_mean": 8616.0}},
         "extrapolated": {"k": 2, "method": "28 x per layer", "ctx64": {"tpot_s": {"mean": 28.0},
                                                                       "bytes_per_token": 26600.0,
                                                                       "round_trips_per_token": 140.0}}}
    d.update(over)
    return d


def _earlier_veil(tmp_path):
    r = {"context": 64, "new_tokens": 8, "ttft_s": 100.0, "tpot_s": {**DIST, "mean": 70.0}, "bytes_per_token": 7.7e7,
         "bytes_up_per_token": 4.5e7, "bytes_down_per_token": 3.2e7, "round_trips_per_token": 84.0, "kl_mean": 1e-7}
    plain = {**r, "tpot_s": {**DIST, "mean": 0.05}, "bytes_per_token": 4800.0, "round_trips_per_token": 1.0}
    f = tmp_path / "po.json"
    f.write_text(json.dumps({"schema": "veil.protected_overhead/1", "machine": {"cpu": "test", "cpus": 2}, "k": 2,
                             "param_set": "p", "paths": {"split-plain": {"ctx64": plain}, "protected": {"ctx64": r}},
                             "server_peak_rss_bytes": 1, "client_peak_rss_bytes": 1}))
    return f


def _extraction(tmp_path):
    f = tmp_path / "attack.json"
    f.write_text(json.dumps({"k": 29, "tokens": 71, "linear_only": {"q": {"rel_err": 0.9, "span_err": 1e-6}},
                             "veil": {"gate": {"rel_err": 0.5, "span_err": 0.4}},
                             "concrete-ml": {"L29.q": {"rel_err": 0.99, "span_err": 0.02, "rows": 7}},
                             "peers": {"concrete-ml": {"layers": [29]}}}))
    return f


def test_peer_rows_in_report_and_plots(tmp_path, capsys):
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps(_peer()))
    out = tmp_path / "out"
    rc = veil_main(["bench", "--from", str(_earlier_veil(tmp_path)), "--peer", str(peer),
                    "--peer", f"concrete-ml-loaded={peer}",  # a second run of the same peer, renamed
                    "--extraction", str(_extraction(tmp_path)), "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert {"concrete-ml-loaded", "concrete-ml-loaded-k2-extrapolated"} <= set(res["paths"])
    assert res["paths"]["concrete-ml"]["ctx64"]["round_trips_per_token"] == 10.0
    assert res["paths"]["concrete-ml-k2-extrapolated"]["ctx64"]["round_trips_per_token"] == 140.0
    assert res["ratios"]["concrete-ml-k2-extrapolated_over_protected.tpot_s.ctx64"] == pytest.approx(28.0 / 70.0)
    assert not any(r.startswith("concrete-ml_over") for r in res["ratios"])  # 2 of 28 layers: no ratio
    report = (out / "report.md").read_text()
    assert "| concrete-ml (measured: 2 of 28 server layers in FHE, 7 decode steps) | 2 |" in report  # TPOT mean
    assert "concrete-ml-k2-extrapolated (all 28 server layers, extrapolated) | 140 |" in report
    assert "## What each protocol lets the client learn" in report
    assert "| concrete-ml | every FHE linear module's input" in report and "| protected |" in report
    assert "## Weight extraction from the client's transcript" in report
    assert "| L29.q | 1e-06 (71 rows) | — | 0.02 (7 rows) |" in report  # fits of one layer side by side
    assert "po.json" in report  # where Veil's rows came from
    for name in ("tpot_vs_context.png", "bytes_per_token.png", "round_trips_per_token.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = capsys.readouterr().out
    assert "figure concrete-ml.tpot_s.mean.ctx64 2" in lines
    assert "figure concrete-ml-k2-extrapolated.round_trips_per_token.ctx64 140" in lines
    assert "figure concrete-ml.call.o_proj.rows1.server_s_mean 3.5" in lines
    assert "figure concrete-ml.setup.keygen_s 4" in lines
    assert "| o_proj.rows1 | 14 | 3.5 |" in report


@pytest.mark.parametrize("bad, message", [
    ({"schema": "veil.bench/1"}, "expected 'veil.peer/1'"),
    ({"path": "Concrete ML!"}, "peer path name"),
    ({"ctx64": {"tpot_s": 3.0}}, "no ctx<C> block"),
])
def test_bad_peer_json_is_refused_clearly(tmp_path, capsys, bad, message):
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps(_peer(**bad)))
    with pytest.raises(ValueError, match=message):
        load_peer(peer)
    with pytest.raises(SystemExit) as e:
        overhead.main(["--from", str(_earlier_veil(tmp_path)), "--peer", str(peer), "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _transcript(tmp_path, noise: float = 0.0):
    """A transcript shaped like the peer's: layer 29, q|k|v fused (4 + 2 + 2 rows), o and down."""
    rng = np.random.default_rng(0)
    w = {"q": rng.normal(size=(4, 6)), "k": rng.normal(size=(2, 6)), "v": rng.normal(size=(2, 6)),
         "o": rng.normal(size=(6, 4)), "down": rng.normal(size=(6, 9))}
    x6, x4, x9 = rng.normal(size=(5, 6)), rng.normal(size=(5, 4)), rng.normal(size=(5, 9))
    qkv = x6 @ np.vstack([w["q"], w["k"], w["v"]]).T
    arrays = {"ids": np.arange(12), "positions": np.arange(7, 12),
              "model.layers.29.self_attn.qkv_proj.x": x6, "model.layers.29.self_attn.qkv_proj.y": qkv,
              "model.layers.29.self_attn.o_proj.x": x4, "model.layers.29.self_attn.o_proj.y": x4 @ w["o"].T,
              "model.layers.29.mlp.down_proj.x": x9, "model.layers.29.mlp.down_proj.y": x9 @ w["down"].T}
    for key in [k for k in arrays if k.endswith(".y")]:
        arrays[key] = arrays[key] + noise * rng.normal(size=arrays[key].shape)
    f = tmp_path / "t.npz"
    np.savez(f, **arrays)
    return f, w


def test_attack_on_a_peer_transcript(tmp_path):
    f, w = _transcript(tmp_path)
    tr = load_peer_transcript(f, q_size=4, kv_size=2)
    assert sorted(tr.pairs[29]) == ["down", "k", "o", "q", "v"] and tr.ids == list(range(12))
    res = attack_peer(tr, lambda layer, name: w[name])
    assert set(res) == {"L29.q", "L29.k", "L29.v", "L29.o", "L29.down"}
    for name, e in res.items():
        assert e["rows"] == 5 and e["span_err"] < 1e-10, name  # exact outputs: exact on the probed span
    f, w = _transcript(tmp_path, noise=0.3)
    noisy = attack_peer(load_peer_transcript(f, 4, 2), lambda layer, name: w[name])
    assert min(e["span_err"] for e in noisy.values()) > 1e-3  # noise shows up in the fit


def test_bad_peer_transcripts_are_refused_clearly(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not an npz")
    with pytest.raises(ValueError, match="not a transcript"):
        load_peer_transcript(tmp_path / "junk.npz", 4, 2)
    np.savez(tmp_path / "noids.npz", positions=np.arange(3))
    with pytest.raises(ValueError, match="lacks"):
        load_peer_transcript(tmp_path / "noids.npz", 4, 2)
    f, _ = _transcript(tmp_path)
    with pytest.raises(ValueError, match="fused qkv output has 8 columns"):
        load_peer_transcript(f, 4, 3)
    np.savez(tmp_path / "rows.npz", ids=np.arange(3), positions=np.arange(3),
             **{"model.layers.1.self_attn.o_proj.x": np.ones((3, 4)), "model.layers.1.self_attn.o_proj.y": np.ones((2, 4))})
    with pytest.raises(ValueError, match="inputs"):
        load_peer_transcript(tmp_path / "rows.npz", 4, 2)
    np.savez(tmp_path / "empty.npz", ids=np.arange(3), positions=np.arange(3))
    with pytest.raises(ValueError, match="no linear module"):
        load_peer_transcript(tmp_path / "empty.npz", 4, 2)
