"""Serving metrics as the literature defines them, and the `figure` line format.

Per request: TTFT (arrival → first token), TPOT ((e2el − ttft) / (output tokens − 1)), ITL (gaps
between consecutive streamed chunks), E2EL (arrival → last token). Per run: output tokens/s and
requests/s over the run's duration, goodput = requests/s meeting both SLOs (TTFT and TPOT).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    arrival: float
    prompt_tokens: int
    output_tokens: int = 0
    first_token: float | None = None
    end: float | None = None
    itl: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2el(self) -> float:
        return self.end - self.arrival

    @property
    def tpot(self) -> float:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def distribution(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs) if xs else float("nan"), "p50": percentile(xs, 50),
            "p95": percentile(xs, 95), "p99": percentile(xs, 99)}


def summarize(records: list[RequestRecord], duration_s: float, slo_ttft_s: float | None = None,
              slo_tpot_s: float | None = None) -> dict:
    ok = [r for r in records if r.error is None and r.end is not None]
    out = {
        "requests": len(records), "errors": len(records) - len(ok), "duration_s": duration_s,
        "output_tokens": sum(r.output_tokens for r in ok),
        "output_tok_s": sum(r.output_tokens for r in ok) / duration_s,
        "requests_s": len(ok) / duration_s,
        "ttft_s": distribution([r.ttft for r in ok]), "tpot_s": distribution([r.tpot for r in ok]),
        "itl_s": distribution([x for r in ok for x in r.itl]), "e2el_s": distribution([r.e2el for r in ok]),
    }
    if slo_ttft_s is not None or slo_tpot_s is not None:
        good = [r for r in ok if (slo_ttft_s is None or r.ttft <= slo_ttft_s)
                and (slo_tpot_s is None or r.tpot <= slo_tpot_s)]
        out["goodput_rps"] = len(good) / duration_s
    return out


def figure_lines(path: str, summary: dict, suffix: str = "", skip: tuple[str, ...] = ("requests",)) -> list[str]:
    """`figure <path>.<metric>[.<stat>]<suffix> <value>` for every number in a summary (metrics in
    `skip`, and values that are not numbers, are left out)."""

    def number(x) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool)

    lines = []
    for metric, v in summary.items():
        if metric in skip:
            continue
        if isinstance(v, dict):
            lines += [f"figure {path}.{metric}.{stat}{suffix} {x:.6g}" for stat, x in v.items() if number(x)]
        elif number(v):
            lines.append(f"figure {path}.{metric}{suffix} {v:.6g}")
    return lines


def emit(lines: list[str], results: dict, json_path=None) -> None:
    for line in lines:
        print(line, flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
