"""cProfile of the protected client's decode steps at k=28 against a loopback `veil serve` (native):
four decode tokens after the prompt and one untimed token; the main thread only (the server is a
subprocess). ``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-xeon-orientation/client_k28_profile.py [K]``"""
import cProfile, pstats, sys, tempfile, time
from pathlib import Path
from veil.benchmarks.protected_overhead import start_split_server, context_prompt, warm_up_protected
from veil.client.sdk import VeilClient, GenerationStats
from veil.engine.loader import load_checkpoint
from veil.engine.split import client_half_from

k = int(sys.argv[1]) if len(sys.argv) > 1 else 28
ckpt = load_checkpoint()
half = client_half_from(ckpt, k)
with tempfile.TemporaryDirectory() as tmp:
    proc, url, key = start_split_server(Path(tmp), k, ["--he-backend", "native"])
    try:
        with VeilClient(url, key, mode="protected", half=half, timeout_s=3600, he_backend="native") as c:
            c.generate_keys(); c.ensure_keys(); warm_up_protected(c)
            ids = context_prompt(ckpt.tokenizer, 8)
            s = c.open_session(); st = GenerationStats()
            t = int(s.forward(ids, st).argmax())
            t = int(s.forward([t], st).argmax())
            cpu0 = st.client_cpu_s
            pr = cProfile.Profile(); pr.enable()
            w = time.perf_counter()
            for _ in range(4):
                t = int(s.forward([t], st).argmax())
            pr.disable()
            print("wall per token", (time.perf_counter() - w) / 4, "client cpu per token", (st.client_cpu_s - cpu0) / 4)
            s.close()
            ps = pstats.Stats(pr); ps.sort_stats("tottime").print_stats(30); ps.sort_stats("cumulative").print_stats(45)
    finally:
        proc.terminate(); proc.wait(60)
