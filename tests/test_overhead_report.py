"""Smoke test of the overhead report: `veil bench --quick` with all four paths on tiny settings
(context 16, 4 new tokens, concurrency 1 and 2, one protected layer). Checks the schema, that
every path produced figures, that the plaintext split agrees with the reference, and that each
plot is a valid non-empty PNG. (Figures are measured by running the tool, never asserted.)
About 3 minutes on the CI machine, most of it CKKS key generation and the protected prefill."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

PNGS = ("tpot_vs_context.png", "bytes_per_token.png", "throughput_vs_concurrency.png", "round_trips_per_token.png",
        "protected_server_breakdown.png")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "veil.cli.main", "bench", "--quick", "--no-progress",
                           "--paths", "reference,fast,split-plain,protected", "--out", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_schema_and_every_path(quick_run):
    out, stdout = quick_run
    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == "veil.bench/1" and res["interrupted"] is False
    assert res["settings"]["quick"] and res["settings"]["k"] == 29
    for key in ("cpu", "cpus", "torch", "tenseal", "param_set", "k"):
        assert key in res["machine"]
    for path in ("reference", "fast", "split-plain", "protected"):
        assert "ctx16" in res["paths"][path], path
        r = res["paths"][path]["ctx16"]
        assert r["ttft_s"] > 0 and r["tpot_s"]["mean"] > 0
    for path in ("fast", "split-plain"):
        for c in ("c1", "c2"):
            s = res["paths"][path][c]
            assert s["errors"] == 0 and s["output_tok_s"] > 0 and "goodput_rps" in s
    prot = res["paths"]["protected"]["ctx16"]
    assert prot["bytes_per_token"] > 1e6 and prot["setup_bytes"] > 1e8 and prot["round_trips_per_token"] == 3
    assert prot["server_s"]["matvec"] > 0 and prot["greedy_agreement"] == 1.0
    # one protected layer: three round trips, no refresh (it runs between layers)
    by_kind = prot["bytes_per_token_by_kind"]
    assert set(by_kind) == {"up.token", "up.weights", "up.mlp_in", "down.scores", "down.mlp", "down.final"}
    assert sum(by_kind.values()) == pytest.approx(prot["bytes_per_token"])
    assert by_kind["up.token"] > 1e5 and by_kind["down.final"] > 1e5
    plain = res["paths"]["split-plain"]["ctx16"]
    assert plain["kl_mean"] < 1e-6 and plain["greedy_agreement"] == 1.0
    assert res["paths"]["fast"]["ctx16"]["greedy_agreement"] == 1.0
    assert "protected_over_split_plain.tpot_s.ctx16" in res["ratios"]
    assert "split_plain_over_fast.tpot_s.ctx16" in res["ratios"]
    figures = dict(line.split()[1:] for line in stdout.splitlines() if line.startswith("figure "))
    for name in ("protected.tpot_s.mean.ctx16", "protected.bytes_per_token.ctx16", "protected.server_s.matvec.ctx16",
                 "split-plain.kl_mean.ctx16", "fast.output_tok_s.c2", "reference.ttft_s.ctx16",
                 "ratio.protected_over_split_plain.tpot_s.ctx16"):
        assert name in figures, name
        assert re.fullmatch(r"[-+0-9.e]+|nan", figures[name])


def test_report_and_plots(quick_run):
    import matplotlib.image as mpimg

    out, _ = quick_run
    report = (out / "report.md").read_text()
    assert "## Overhead ratios" in report and "## How to read this" in report and "protected" in report
    for name in PNGS:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        img = mpimg.imread(out / name)
        assert img.shape[0] > 100 and img.shape[1] > 100
        assert np.ptp(img[..., :3]) > 0.1  # not a blank canvas


def test_interrupt_writes_what_was_measured(tmp_path, monkeypatch):
    """Ctrl-C during the run: results.json, report.md and the plots still appear, marked
    interrupted. (`measure` is replaced by a stand-in that records one path and then raises
    KeyboardInterrupt, as a Ctrl-C would; this tests the writing, not the measuring.)"""
    from veil.benchmarks import overhead

    def fake_measure(args, results):
        results["paths"]["split-plain"] = {"ctx16": {"ttft_s": 0.1, "tpot_s": {"mean": 0.05, "p50": 0.05, "p95": 0.06,
                                                                              "p99": 0.06}, "bytes_per_token": 4800.0}}
        raise KeyboardInterrupt

    monkeypatch.setattr(overhead, "measure", fake_measure)
    monkeypatch.setattr(overhead, "machine", lambda k: {"cpu": "test", "k": k})
    rc = overhead.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    assert rc == 130
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["interrupted"] is True and res["paths"]["split-plain"]["ctx16"]["ttft_s"] == 0.1
    assert "Interrupted run" in (tmp_path / "report.md").read_text()
    for name in PNGS:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
