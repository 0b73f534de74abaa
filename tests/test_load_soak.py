"""Small version of the load/soak benchmark in CI: 8 concurrent plaintext split sessions for 15 s
against a `veil serve` subprocess whose KV pool (0.03 GB, ~700 tokens over 28 layers) is far
smaller than what they hold at once, so the engine must preempt and recompute, and about one step
in 4 preceded by a message a client should not send (garbage, a spent step id, another session's
id, the last step resent): 0 errors, every session deleted at the end, the server alive and its
memory bounded."""

import json

from veil.benchmarks import load_soak


def test_small_soak_with_an_exhausted_kv_pool(tmp_path, capsys):
    out = tmp_path / "soak.json"
    rc = load_soak.main(["--sessions", "8", "--duration", "15", "--kv-cache-gb", "0.03", "--bad-every", "4",
                         "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0, res["error_examples"]
    assert res["errors"] == 0 and res["server_alive_after"] and res["open_sessions_after"] == 0
    assert res["sessions_completed"] >= 8 and res["steps"] > 50 and res["bad_messages"] > 10
    assert res["server_rss_peak_bytes"] < res["server_rss_start_bytes"] + (1 << 30)
    printed = capsys.readouterr().out
    assert "figure soak.errors 0" in printed
