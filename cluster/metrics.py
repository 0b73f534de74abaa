"""``/metrics`` of the cluster: every replica's Prometheus series with a ``replica`` label, and
the ingress's own (replicas running, requests lost with a replica). No Ray here."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


class _Families:
    """A collector yielding already-built metric families (the merged replica series)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def merge(texts: dict[str, str], label: str = "replica") -> list:
    """One family per metric name holding every replica's samples, each labelled with its
    replica (``texts``: replica id → that replica's exposition text)."""
    merged: dict[str, object] = {}
    for replica, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            into = merged.setdefault(fam.name, fam)
            samples = [Sample(s.name, {**s.labels, label: replica}, s.value, s.timestamp, s.exemplar)
                       for s in fam.samples]
            if into is fam:
                fam.samples = samples
            else:
                into.samples.extend(samples)
    return list(merged.values())


class ClusterMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.replicas = Gauge("veil_cluster_replicas", "engine replicas by state (target, running, healthy)",
                              ["state"], registry=r)
        self.lost = Counter("veil_cluster_lost_requests", "requests that were running on a replica when it "
                            "died, by whether they were pinned to a session", ["kind"], registry=r)

    def render(self, replica_texts: dict[str, str]) -> bytes:
        merged = CollectorRegistry()
        merged.register(_Families(merge(replica_texts)))
        return generate_latest(self.registry) + generate_latest(merged)
