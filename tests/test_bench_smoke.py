"""Smoke tests of benchmarks: tiny runs, figures and JSON checked.
(Figures themselves are measured by running the benchmark, never asserted here.)"""

import json
import re

import pytest

from veil.benchmarks import engine_throughput
from veil.cli.main import main as veil_main


def test_engine_throughput_smoke(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = engine_throughput.main(["--paths", "reference,fast,fast-process,engine", "--num-requests", "4",
                                 "--input-len", "8,16", "--output-len", "3,6", "--concurrency", "1,4", "--batch-size", "2",
                                 "--kv-cache-gb", "0.1", "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000",
                                 "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    figures = dict(line.split()[1:] for line in printed.splitlines() if line.startswith("figure "))
    for name in ("fast.output_tok_s.c1", "fast.output_tok_s.c4", "fast.ttft_s.p99.c4", "fast.goodput_rps.c4",
                 "fast.errors.c4", "reference.output_tok_s.float32.c2", "reference.output_tok_s.bfloat16.c2",
                 "ratio.fast_over_reference.output_tok_s.c4", "fast.steps_s.c4", "fast.mean_seqs_per_step.c4",
                 "engine.output_tok_s.c4", "engine.steps_s.c4", "engine.mean_seqs_per_step.c4",
                 "ratio.engine_over_reference.output_tok_s.c4", "fast-process.output_tok_s.c4",
                 "fast-process.host_ms_per_step.c4"):
        assert name in figures, name
        assert re.fullmatch(r"[-+0-9.e]+|nan", figures[name]), figures[name]
    assert float(figures["fast.errors.c4"]) == 0 and float(figures["fast.output_tok_s.c4"]) > 0
    res = json.loads(out.read_text())
    assert res["schema"] == "veil.engine_throughput/1"
    ref = res["paths"]["reference"]
    assert res["paths"]["fast"]["c4"]["output_tokens"] == ref["float32.c2"]["output_tokens"]
    # veil serve --engine-process, started by the CLI as an operator would
    assert res["paths"]["fast-process"]["c4"]["output_tokens"] == ref["float32.c2"]["output_tokens"]
    assert res["paths"]["fast-process"]["c4"]["errors"] == 0 and res["paths"]["fast-process"]["c4"]["steps"] > 0
    engine = res["paths"]["engine"]["c4"]
    assert engine["output_tokens"] == ref["float32.c2"]["output_tokens"] and engine["errors"] == 0
    # at most 4 sequences per step, and every step ran at least one
    assert 1 <= engine["mean_seqs_per_step"] <= 4 and engine["steps"] > 0
    assert res["threads"]["fast.server"] >= 1
    # the ratio is taken against the faster reference run
    best = max(ref.values(), key=lambda r: r["output_tok_s"])
    ratio = res["paths"]["fast"]["c4"]["output_tok_s"] / best["output_tok_s"]
    assert abs(float(figures["ratio.fast_over_reference.output_tok_s.c4"]) - ratio) < 1e-3 * ratio


def test_key_sets_smoke(tmp_path, capsys):
    """The key-set benchmark on SEAL, two sets: figures and JSON agree, and the parts add up to
    at most the upload (the msgpack map around them is the rest)."""
    from veil.benchmarks import key_sets

    out = tmp_path / "k.json"
    key_sets.main(["--backends", "seal", "--sets", "compact,minimal", "--out", str(out)])
    printed = capsys.readouterr().out
    figures = {k: float(v) for k, v in (line.split()[1:] for line in printed.splitlines() if line.startswith("figure "))}
    res = json.loads(out.read_text())["results"]["seal"]
    for key_set in ("compact", "minimal"):
        r = res[key_set]
        assert abs(figures[f"keys.seal.{key_set}.setup_bytes"] - r["setup_bytes"]) <= 1e-5 * r["setup_bytes"]  # 6 digits
        assert r["public_key_bytes"] + r["relin_key_bytes"] + r["galois_key_bytes"] < r["setup_bytes"]
    assert res["minimal"]["galois_keys"] < res["compact"]["galois_keys"]


def test_bench_help_lists_every_mode(capsys):
    """`veil bench --help` names the modes that other parsers own (engine throughput, the
    protected-path benchmark, sessions batched, a peer's rows), then the overhead report's flags."""
    with pytest.raises(SystemExit) as done:
        veil_main(["bench", "--help"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    for mode in ("--protected-overhead", "--he-backend native --sessions 1,4,16", "--paths reference,fast[,fast-process][,engine]",
                 "--from EARLIER.json", "--concurrency CONCURRENCY"):
        assert mode in printed, mode


def test_chat_turns_smoke(tmp_path, capsys):
    from veil.benchmarks import chat_turns

    out = tmp_path / "c.json"
    assert chat_turns.main(["--k", "29", "--turns", "2", "--max-new-tokens", "3", "--out", str(out)]) == 0
    figures = dict(line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.startswith("figure "))
    for name in ("session_per_turn.turn2.ttft_s", "kept_session.turn2.prompt_tokens_fed", "kept_session.total_s",
                 "ttft_ratio.turn2", "answers_equal"):
        assert f"chat_turns.plaintext.{name}" in figures, name
    res = json.loads(out.read_text())
    fresh, kept = (res["settings"][n]["turns"] for n in ("session_per_turn", "kept_session"))
    assert fresh[1]["prompt_tokens_fed"] == fresh[1]["prompt_tokens"]
    assert kept[1]["prompt_tokens_fed"] < kept[1]["prompt_tokens"] == fresh[1]["prompt_tokens"]


def _marked_work(device: str):
    """A profile of work inside and outside ``host_device.marked`` ranges (one nested in another)."""
    import torch
    from torch.profiler import profile

    from veil.benchmarks.host_device import activities, marked

    a = torch.ones(64, 64, device=device)
    with profile(activities=activities(device)) as prof:
        a.sum()  # outside: not counted
        with marked("first"):
            b = torch.add(a, a)
            b.to(torch.float64)  # aten::to calls aten::_to_copy and aten::copy_: one op from Python
            with marked("inner"):  # inside another range: its ops count, its time does not twice
                b.mul(2)
        with marked("second"):
            (a @ a).sum()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return prof.events()


def test_host_device_counts_the_marked_ranges_ops_once():
    """``host_device.summarize`` (protected_bench --profile): the marked ranges' host time, and the
    torch ops called from Python inside them, each once (not the ops they call, not ops outside)."""
    from veil.benchmarks.host_device import summarize

    s = summarize(_marked_work("cpu"))
    assert s["ranges"] == 2 and s["host_s"] > 0
    assert s["top_ops"] == {"aten::add": 1, "aten::to": 1, "aten::mul": 1, "aten::matmul": 1, "aten::sum": 1}
    assert s["torch_ops"] == 5
    assert (s["kernels"], s["device_s"], s["device_busy_share"]) == (0, 0.0, 0.0)  # no device on a CPU
    assert (s["profile_kernels"], s["profile_device_s"]) == (0, 0.0)


def test_host_device_counts_the_kernels_launched_in_the_ranges_on_cuda():
    """On CUDA (skipped elsewhere): the kernels the marked work launched, torch's and Triton's,
    with their device time, tied to the ranges; the kernel launched outside them is not counted."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torch.profiler import profile

    from veil.benchmarks.host_device import activities, marked, summarize
    from veil.kernels.rmsnorm import add_rms_norm_triton

    s = summarize(_marked_work("cuda"))
    assert s["kernels"] >= 5 and 0 < s["device_s"] <= s["host_s"]
    assert s["profile_kernels"] > s["kernels"]  # and the sum outside every range
    x, w = torch.randn(8, 576, device="cuda"), torch.ones(576, device="cuda")
    add_rms_norm_triton(x, None, w, 1e-5)  # compiled before the profile
    with profile(activities=activities("cuda")) as prof:
        with marked("triton"):
            add_rms_norm_triton(x, None, w, 1e-5)
        torch.cuda.synchronize()
    t = summarize(prof.events())
    assert t["profile_kernels"] == 1, t  # the device ran it, whichever op the profiler ties it to
    assert t["kernels"] == 1 and "rms" in next(iter(t["top_kernels_s"])) and t["device_s"] > 0, t
