"""Prometheus metrics of one server (its own registry: several apps in one process, as in the
tests, never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("veil_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.tokens = Counter("veil_tokens", "tokens processed", ["kind"], registry=r)  # prompt | output | split
        self.ttft = Histogram("veil_ttft_seconds", "time to first token (fast path)", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("veil_itl_seconds", "inter-token latency (fast path)", buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("veil_e2e_seconds", "end-to-end request latency (fast path)", buckets=LATENCY_BUCKETS,
                             registry=r)
        self.step_latency = Histogram("veil_split_step_seconds", "split step latency on the server",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("veil_batch_size", "sequences per engine iteration",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.batch_tokens = Histogram("veil_batch_tokens", "tokens per engine iteration",
                                      buckets=(1, 4, 16, 64, 128, 256, 512, 1024, 2048), registry=r)
        self.running = Gauge("veil_running_sequences", "sequences holding KV blocks with work pending", registry=r)
        self.waiting = Gauge("veil_waiting_sequences", "sequences waiting for KV blocks", registry=r)
        self.kv_util = Gauge("veil_kv_pool_utilization", "fraction of KV blocks in use", registry=r)
        self.failed_steps = Gauge("veil_engine_failed_steps", "engine steps that raised since start (their "
                                  "sequences failed, or ran again alone)", registry=r)
        self.failed_in_a_row = Gauge("veil_engine_failed_steps_in_a_row", "engine steps that raised since the "
                                     "last one that completed (/health: engine_failing from 8)", registry=r)
        self.sessions = Gauge("veil_sessions", "open sessions", registry=r)
        self.sessions_evicted = Counter("veil_sessions_evicted", "idle sessions dropped for new work at a limit: "
                                        "a session count, or the protected KV cache's total or device "
                                        "budget (capacity)",
                                        ["path", "limit"], registry=r)
        self.bytes_in = Counter("veil_bytes_in", "request body bytes on the split/protected paths", ["path"], registry=r)
        self.bytes_out = Counter("veil_bytes_out", "response body bytes on the split/protected paths", ["path"],
                                 registry=r)
        self.engine_steps = Counter("veil_engine_steps", "engine iterations", registry=r)
        self.engine_host_seconds = Counter("veil_engine_host_seconds", "engine loop's own host work (schedule, "
                                           "prepare, postprocess with the token callbacks)", registry=r)
        self.protected_op_seconds = Counter(
            "veil_protected_op_seconds", "server HE time by operation kind (matvec, ctct, rotations, refresh, "
            "flooding, serialization, other)", ["op"], registry=r)
        self.protected_kv_bytes = Gauge("veil_protected_kv_bytes", "encrypted KV cache bytes, all sessions",
                                        registry=r)
        self.protected_key_bytes = Gauge("veil_protected_key_bytes", "evaluation key bytes stored, all tenants",
                                         registry=r)
        self.protected_device_bytes = Gauge(
            "veil_protected_device_bytes", "what --protected-device-gb counts: encoded weights, imported keys in "
            "memory, and the shuffled W_down of the first protected layer's steps in flight", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
