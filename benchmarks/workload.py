"""Benchmark workloads: reproducible request sets, shared by every path and by the peers.

A workload is a list of requests with exact prompt token ids and exact output lengths (EOS is
ignored by every path, so lengths are exact), plus arrival times for online runs. It can be
written to JSON so that a peer engine in another virtual environment replays the same one.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class BenchRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    arrival_s: float = 0.0  # offset from the start of the run (online mode)


@dataclass
class Workload:
    requests: list[BenchRequest]
    seed: int
    description: str

    def to_json(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"seed": self.seed, "description": self.description,
                                          "requests": [asdict(r) for r in self.requests]}))

    @classmethod
    def from_json(cls, path: Path) -> Workload:
        d = json.loads(Path(path).read_text())
        return cls([BenchRequest(**r) for r in d["requests"]], d["seed"], d["description"])

    @property
    def output_tokens(self) -> int:
        return sum(r.max_new_tokens for r in self.requests)


def random_workload(n: int = 64, input_len: tuple[int, int] = (32, 256), output_len: tuple[int, int] = (16, 256),
                    seed: int = 0, vocab: tuple[int, int] = (100, 49000), request_rate: float = float("inf")) -> Workload:
    """Random prompts (uniform token ids from `vocab`, uniform lengths) as in vLLM's "random"
    dataset; Poisson arrivals at `request_rate` per second (inf → all at t=0)."""
    rng = random.Random(seed)
    reqs, t = [], 0.0
    for _ in range(n):
        plen = rng.randint(*input_len)
        reqs.append(BenchRequest([rng.randint(*vocab) for _ in range(plen)], rng.randint(*output_len), t))
        if request_rate != float("inf"):
            t += rng.expovariate(request_rate)
    desc = f"random n={n} in={input_len[0]}-{input_len[1]} out={output_len[0]}-{output_len[1]} seed={seed}"
    if request_rate != float("inf"):
        desc += f" rate={request_rate}/s"
    return Workload(reqs, seed, desc)
