"""Two protected sessions' 8-token prompts, one after the other, on one fresh single-process
`veil serve --k 28`: each prompt's seconds and the server's minor page faults meanwhile; then the
server is sent SIGUSR1 (with `pregrow.patch` applied and VEIL_MALLOC_STATS=1, it prints glibc's
malloc_stats) and its log copied to /tmp/first_prompts_server.log. `pregrow.patch` also makes
VEIL_PREGROW_GB=G allocate, fill and free G GiB in the server's heap when it makes its first
native backend. Arguments as serve_arena.py's (LABEL late-limit).

    [VEIL_PREGROW_GB=4] PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-first-prompt/first_prompts.py LABEL late-limit
"""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from veil.benchmarks.engine_throughput import launch_server
from veil.client import VeilClient
from veil.engine.loader import load_checkpoint
from veil.engine.split import client_half_from
from veil.kernels import heap

K, PROMPT, NEW = 28, "The capital of France is a city that", 3


def faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])  # minflt


def main(label: str, limit: str, extra: list[str]) -> None:
    ckpt = load_checkpoint(None)
    if limit == "start-limit":
        os.environ.update(heap.worker_env())
    else:
        os.environ.pop("GLIBC_TUNABLES", None)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = launch_server(Path(tmp), ("protected",), ["--k", str(K), "--kv-cache-gb", "0.03", *extra])
        try:
            with VeilClient(url, key, mode="protected", half=client_half_from(ckpt, K)) as client:
                client.generate_keys(progress=False)
                ids = client.tokenizer(PROMPT)["input_ids"]
                for _ in range(2):
                    s = client.open_session()
                    f0, t0 = faults(proc.pid), time.perf_counter()
                    nxt = int(s.forward(ids).argmax())
                    ttft, f1 = time.perf_counter() - t0, faults(proc.pid)
                    print("prompt", round(ttft, 2), f1 - f0, flush=True)
                tpot = []
                for _ in range(NEW - 1):
                    t = time.perf_counter()
                    nxt = int(s.forward([nxt]).argmax())
                    tpot.append(time.perf_counter() - t)
                f2 = faults(proc.pid)
                s.close()
        finally:
            import shutil, signal; proc.send_signal(signal.SIGUSR1); time.sleep(2); shutil.copy(Path(tmp) / 'server.log', '/tmp/first_prompts_server.log')
            proc.terminate()
            proc.wait(60)
    print(json.dumps({"label": label, "limit": limit, "args": extra, "ttft_s": round(ttft, 2),
                      "tpot_s": [round(x, 2) for x in tpot], "prompt_faults": f1 - f0, "decode_faults": f2 - f1}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
