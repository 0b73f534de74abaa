"""A protected session on a single-process `veil serve --k 28 [--engine-process]`: the prompt's and
decode steps' wall time and the server's minor page faults meanwhile (/proc/<pid>/stat). With
`start-limit`, the server starts with `heap.worker_env()` (one malloc arena from its start).
`--prompts N`: N sessions' prompts one after another on the one server, a line each (seconds,
faults); the JSON is the last one's. With VEIL_MALLOC_STATS=1 the server is then sent SIGUSR1 and
its log copied to /tmp/first_prompts_server.log (with ../2026-12-07-first-prompt/pregrow.patch
applied, the server prints glibc's malloc_stats there).

    PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-ci-heap/serve_arena.py LABEL {late-limit,start-limit} [--prompts N] [--engine-process]
"""
import json
import os
import shutil
import signal
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
    prompts = 1
    if "--prompts" in extra:
        i = extra.index("--prompts")
        prompts, extra = int(extra[i + 1]), extra[:i] + extra[i + 2:]
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
                for _ in range(prompts):
                    s = client.open_session()
                    f0, t0 = faults(proc.pid), time.perf_counter()
                    nxt = int(s.forward(ids).argmax())
                    ttft, f1 = time.perf_counter() - t0, faults(proc.pid)
                    if prompts > 1:
                        print("prompt", round(ttft, 2), f1 - f0, flush=True)
                tpot = []
                for _ in range(NEW - 1):
                    t = time.perf_counter()
                    nxt = int(s.forward([nxt]).argmax())
                    tpot.append(time.perf_counter() - t)
                f2 = faults(proc.pid)
                s.close()
        finally:
            if os.environ.get("VEIL_MALLOC_STATS"):
                proc.send_signal(signal.SIGUSR1)
                time.sleep(2)
                shutil.copy(Path(tmp) / "server.log", "/tmp/first_prompts_server.log")
            proc.terminate()
            proc.wait(60)
    print(json.dumps({"label": label, "limit": limit, "args": extra, "ttft_s": round(ttft, 2),
                      "tpot_s": [round(x, 2) for x in tpot], "prompt_faults": f1 - f0, "decode_faults": f2 - f1}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
