"""The cluster's pieces that need no Ray: routing by session id, the key store's limits, merged
metrics, and running forwarded requests through the real app in process (``asgi.call_app``)."""

import asyncio
import json
import pickle

import pytest
from starlette.requests import Request

from veil.cluster.asgi import Forwarded, Head, call_app
from veil.cluster.keys import KeyStore
from veil.cluster.metrics import ClusterMetrics, merge
from veil.cluster.routing import opens_session, pinned_replica, session_prefix
from veil.server.errors import ApiError
from veil.server.http_common import read_body
from veil.server.metrics import Metrics
from veil.server.sessions import SessionStore
from veil.server.tenants import TenantStore


def test_pinned_replica_reads_the_session_id():
    sid = session_prefix("abc123") + "Zm9v_-x"
    assert pinned_replica(f"/v1/sessions/{sid}/steps") == "abc123"
    assert pinned_replica(f"/v1/sessions/{sid}") == "abc123"
    for path in ("/v1/sessions", "/v1/sessions/", "/v1/sessions/nodot/steps", "/v1/sessions/.x/steps",
                 "/v1/sessions/ab%2F.x", "/v1/sessions/abc./steps", "/v1/completions", "/health", "/"):
        assert pinned_replica(path) is None, path


def test_session_ids_carry_the_prefix():
    store = SessionStore(60, 4, id_prefix=session_prefix("r1"))
    s = store.create("alice", "plaintext", lambda sid: None)
    assert s.id.startswith("r1.") and pinned_replica(f"/v1/sessions/{s.id}/steps") == "r1"
    assert store.get(s.id, "alice") is s and store.get(s.id, "bob") is None


def test_a_session_opening_names_its_path_and_nothing_else_does():
    assert opens_session("POST", "/v1/sessions", b'{"path": "protected", "keys_id": "x"}') == "protected"
    assert opens_session("POST", "/v1/sessions", b'{"path": "plaintext"}') == "plaintext"
    # whatever else the body holds is one "other" path: a client cannot make the router count more
    for body in (b"", b"[1]", b"not json", b'{"path": 3}', b'{"path": "made-up"}', b'{"path": ["protected"]}'):
        assert opens_session("POST", "/v1/sessions", body) == "other", body
    for method, path in (("GET", "/v1/sessions"), ("POST", "/v1/sessions/r.x/steps"), ("POST", "/v1/completions")):
        assert opens_session(method, path, b'{"path": "plaintext"}') is None


def test_a_replica_reports_its_live_sessions_per_path():
    store = SessionStore(60, 8)
    made = [store.create("alice", path, lambda sid: None) for path in ("plaintext", "protected", "protected")]
    assert store.per_path() == {"plaintext": 1, "protected": 2}
    store.delete(made[1].id, "alice")
    assert store.per_path() == {"plaintext": 1, "protected": 1}


def test_a_forwarded_body_goes_out_of_band_and_arrives_as_bytes():
    # Ray pickles a call's arguments with protocol 5 and a buffer callback: a body taken out of
    # band is written into its object store from the ingress's own buffer, with no pickled copy.
    body = bytearray(b"\x01" * 300_000)
    req = Forwarded("POST", "/v1/keys", b"", ((b"content-length", b"300000"),), body, ("1.2.3.4", 5))
    buffers = []
    stream = pickle.dumps(req, protocol=5, buffer_callback=buffers.append)
    assert len(stream) < 1000 and [b.raw().nbytes for b in buffers] == [300_000]
    for got in (pickle.loads(stream, buffers=buffers), pickle.loads(pickle.dumps(req, protocol=5)),
                pickle.loads(pickle.dumps(req, protocol=4))):
        assert type(got.body) is bytes and got.body == body
        assert (got.method, got.path, got.headers, got.client) == (req.method, req.path, req.headers, req.client)


def _request(chunks: list[bytes], declared: int | None) -> Request:
    msgs = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return msgs.pop(0)

    headers = [(b"content-length", str(declared).encode())] if declared is not None else []
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


def test_a_body_in_one_piece_is_that_piece_and_in_pieces_one_buffer():
    whole = b"x" * 1000
    assert asyncio.run(read_body(_request([whole], 1000), 4096)) is whole  # a replica's forwarded body
    got = asyncio.run(read_body(_request([b"", whole[:400], b"", whole[400:]], 1000), 4096))
    assert type(got) is bytearray and got == whole
    assert asyncio.run(read_body(_request([whole[:10], whole[10:20]], None), 4096)) == whole[:20]
    assert asyncio.run(read_body(_request([b""], 0), 4096)) == b""
    for chunks, declared, status in (([whole[:999]], 1000, 400), ([whole], 999, 413), ([whole, b"y"], 1000, 413),
                                     ([whole], None, 413)):
        with pytest.raises(ApiError) as e:
            asyncio.run(read_body(_request(chunks, declared), 999 if declared is None else 4096))
        assert e.value.status == status, (len(chunks), declared)


def test_key_store_limits_lifetime_and_idempotence():
    """The cluster's key store: the same bytes stored once; another tenant's keys look absent; an
    upload over a limit first drops the same tenant's least recently used uploads (never
    another tenant's), and is refused with nothing dropped where that cannot make room; an
    upload no session has named for ``ttl_s`` goes; a tenant deletes its own, and the deletion is
    remembered for ``ttl_s`` or until the same bytes come again."""
    import hashlib

    def sha(b):
        return hashlib.sha256(b).hexdigest()

    ks = KeyStore(max_bytes_per_tenant=10, max_bytes_total=15, ttl_s=60)
    x, y, z = b"x" * 6, b"y" * 5, b"z" * 9
    assert ks.put("a", x, now=0) is None and ks.put("a", x, now=1) is None and ks.nbytes() == 6
    assert ks.get("a", sha(x), now=1) == x and ks.get("b", sha(x), now=1) is None
    assert ks.put("a", b"w" * 11, now=2)[1] == "key_bytes_per_tenant" and ks.get("a", sha(x), now=2) == x
    assert ks.put("b", z, now=3) is None and ks.nbytes() == 15
    assert ks.refusal("c", 1, now=4)[1] == "key_bytes_total" and ks.put("c", b"c", now=4)[1] == "key_bytes_total"
    assert ks.put("a", y, now=5) is None  # over the total: a's own x goes, b's z stays
    assert ks.get("a", sha(x), now=5) is None and ks.get("a", sha(y), now=5) == y and ks.nbytes() == 14
    assert ks.touch("b", sha(z), now=62)  # last used at 3: still within the TTL, and now used again
    assert ks.get("a", sha(y), now=66) is None and ks.touch("b", sha(z), now=100)  # y unused since 5
    assert ks.drop("b", sha(z), now=100) and not ks.drop("b", sha(z)) and not ks.touch("b", sha(z), now=100)
    assert ks.nbytes() == 0 and ks.deleted("b", sha(z), now=100) and not ks.deleted("a", sha(z), now=100)
    assert not ks.deleted("a", sha(y), now=100)  # y went by its TTL, not by a deletion
    assert not ks.deleted("b", sha(z), now=161)  # a deletion is remembered for ttl_s
    assert ks.put("a", x, now=170) is None and ks.drop("a", sha(x), now=171) and ks.deleted("a", sha(x), now=172)
    assert ks.put("a", x, now=173) is None and not ks.deleted("a", sha(x), now=173)  # uploaded again: live


def test_metrics_merge_labels_every_replica():
    from prometheus_client.parser import text_string_to_metric_families

    a, b = Metrics(), Metrics()
    a.tokens.labels("split").inc(3)
    b.tokens.labels("split").inc(5)
    cm = ClusterMetrics()
    cm.replicas.labels("healthy").set(2)
    text = cm.render({"r1": a.render().decode(), "r2": b.render().decode()}).decode()
    fams = list(text_string_to_metric_families(text))
    assert len({f.name for f in fams}) == len(fams)  # each family once
    tokens = {s.labels["replica"]: s.value for f in fams if f.name == "veil_tokens" for s in f.samples
              if s.name == "veil_tokens_total"}
    assert tokens == {"r1": 3.0, "r2": 5.0}
    assert 'veil_cluster_replicas{state="healthy"} 2.0' in text
    assert len(merge({})) == 0


def test_tenant_store_from_json(tmp_path):
    store = TenantStore(tmp_path / "t.json")
    key = store.add("alice", ["plaintext"])
    copy = TenantStore.from_json((tmp_path / "t.json").read_text())
    assert copy.authenticate(key).name == "alice" and copy.path is None


def _req(method, path, key=None, body=b"", ctype=b"application/json"):
    headers = [(b"content-type", ctype)]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    return Forwarded(method, path, b"", tuple(headers), body, ("127.0.0.1", 1))


async def _collect(app, req, stop_after=None):
    items = []
    gen = call_app(app, req, ((b"x-veil-replica", b"r9"),))
    async for item in gen:
        items.append(item)
        if stop_after is not None and len(items) >= stop_after:
            await gen.aclose()  # the HTTP client went away
            break
    return items


def test_call_app_answers_as_the_app_does(live_server):
    app, key = live_server.app, live_server.keys["alice"]
    [head] = asyncio.run(_collect(app, _req("GET", "/health")))
    assert isinstance(head, Head) and not head.streaming and head.status == 200
    assert json.loads(head.body)["status"] == "ok" and (b"x-veil-replica", b"r9") in head.headers
    [head] = asyncio.run(_collect(app, _req("POST", "/v1/sessions", body=b'{"path": "plaintext"}')))
    assert head.status == 401 and json.loads(head.body)["error"]["code"] == "unauthorized"
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    head, *chunks = asyncio.run(_collect(app, _req("POST", "/v1/completions", key, body)))
    assert head.status == 200 and head.streaming
    text = (head.body + b"".join(chunks)).decode()
    assert text.count("data: ") == 6 and text.rstrip().endswith("data: [DONE]")


def test_call_app_stopped_early_aborts_the_engine_work(live_server):
    app, key = live_server.app, live_server.keys["alice"]
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 500, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    items = asyncio.run(_collect(app, _req("POST", "/v1/completions", key, body), stop_after=2))
    assert items[0].streaming
    engine = app.state.engine
    for _ in range(200):  # the abort reaches the engine loop within a step or two
        if engine.scheduler.num_running == 0 and engine.scheduler.num_waiting == 0:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert engine.scheduler.num_running == 0 and engine.scheduler.num_waiting == 0


@pytest.mark.parametrize("path", ["/v1/nothing", "/v1/sessions/r1.nosuch/steps"])
def test_call_app_not_found(live_server, path):
    [head] = asyncio.run(_collect(live_server.app, _req("POST", path, live_server.keys["alice"], b"x")))
    assert head.status == 404


def test_bench_names_and_scaling_ratios_of_replica_runs():
    from veil.benchmarks.overhead import ratios
    from veil.benchmarks.report import _paths

    paths = {"fast@r2": {"c4": {"output_tok_s": 30.0}, "ctx16": {"tpot_s": {"mean": 0.1}}},
             "fast@r1": {"c4": {"output_tok_s": 20.0}}, "fast": {"c4": {"output_tok_s": 25.0}},
             "split-plain@r1": {"c4": {"output_tok_s": 10.0}}, "reference": {}}
    assert _paths({"paths": paths}) == ["reference", "fast", "fast@r1", "fast@r2", "split-plain@r1"]
    r = ratios(paths)
    assert r["fast@r2_over_fast@r1.output_tok_s.c4"] == 1.5 and r["fast@r1_over_fast.output_tok_s.c4"] == 0.8
    assert r["fast@r2_over_fast.output_tok_s.c4"] == 1.2 and not any(k.startswith("split") for k in r)


def test_serve_refuses_zero_replicas(tmp_path, capsys):
    from veil.cli.main import main

    TenantStore(tmp_path / "t.json").add("alice", ["plaintext"])
    assert main(["serve", "--tenants", str(tmp_path / "t.json"), "--replicas", "0"]) == 2
    assert "--replicas" in capsys.readouterr().err


def test_the_gathered_health_counts_a_failing_replica_out():
    """The ingress's /health over stubbed replica answers (no Ray cluster): a replica whose engine
    fails its steps (503 engine_failing) is listed with that code and not counted healthy, so
    the cluster reads "degraded"; with none healthy, 503."""
    pytest.importorskip("ray")
    from veil.cluster.ingress import Ingress
    from veil.server.config import ServerConfig

    class _Handle:  # stands in for the engine deployment's handle: only options() is called here
        def options(self, **kw):
            return self

    ok = Head(200, (), json.dumps({"status": "ok", "model": "m", "sessions": 2}).encode(), False)
    failing = Head(503, (), json.dumps({"error": {"code": "engine_failing", "message": "..."}}).encode(), False)
    ingress = Ingress(_Handle(), ServerConfig(), 2, "{}")

    async def gathered(answers):
        async def ask_all(path):
            assert path == "/health"
            return answers
        ingress.ask_all = ask_all
        return await ingress.health()

    r = asyncio.run(gathered({"r1": ok, "r2": failing}))
    body = json.loads(r.body)
    assert r.status_code == 200 and body["status"] == "degraded" and body["replicas"]["healthy"] == 1
    assert [(x["id"], x["status"]) for x in body["replica_status"]] == [("r1", "ok"), ("r2", "engine_failing")]
    r = asyncio.run(gathered({"r2": failing}))
    assert r.status_code == 503 and json.loads(r.body)["error"]["code"] == "engine_unavailable"
