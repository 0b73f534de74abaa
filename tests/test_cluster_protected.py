"""Protected sessions on `veil serve --replicas 2 --k 29 --engine-process` (Ray Serve): the tenant
uploads its evaluation keys once, and whichever replica opens one of its protected sessions imports
them from the cluster's key store; both replicas then run real HE layers for it. Each replica runs
its engine loop in a child process (tests/test_cluster.py serves the in-process engine), which
ends with its replica. Skipped without the cluster extra; he_heavy (each replica encodes its
protected layer and imports the keys, ~1 GB)."""

import os
import signal
import time

import httpx
import pytest

pytest.importorskip("ray.serve")

from veil.benchmarks.cluster import launch_cluster  # noqa: E402
from veil.client import VeilClient  # noqa: E402
from veil.cluster.routing import REPLICA_HEADER  # noqa: E402
from veil.engine.generate import generate_local  # noqa: E402
from veil.engine.split import client_half_from  # noqa: E402

pytestmark = [pytest.mark.he_heavy, pytest.mark.solo]
K = 29  # one protected layer


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    srv = launch_cluster(tmp_path_factory.mktemp("cluster"), 2, ("protected",),
                         ["--k", str(K), "--kv-cache-gb", "0.03", "--engine-process"])
    yield srv
    srv.stop()


def test_keys_uploaded_once_serve_every_replica(cluster, ckpt, full_model):
    uploads, answered, deletes = [], [], []
    with VeilClient(cluster.url, cluster.key, mode="protected", half=client_half_from(ckpt, K)) as client:
        client.generate_keys(progress=False)

        def seen(r):
            if r.request.url.path == "/v1/keys":
                uploads.append(r.status_code)
            elif r.request.url.path.startswith("/v1/keys/"):
                deletes.append(r.status_code)
            elif r.request.url.path.endswith("/steps"):
                answered.append((r.request.url.path.split("/")[3].split(".")[0], r.headers.get(REPLICA_HEADER)))

        client.http.event_hooks["response"].append(seen)
        # Unpinned creations go to the less loaded of two replicas as Ray sees their queues,
        # which can favour one for a while (a suite run here put 8 in a row on one and hit the
        # server's session limit): a session on a replica already covered is closed again, and
        # the next try comes half a second later.
        sessions, tries = {}, 0
        while len(sessions) < 2:
            tries += 1
            assert tries <= 40, f"40 session creations reached only {sorted(sessions)}"
            s = client.open_session()
            rid = s.id.split(".")[0]
            if rid in sessions:
                s.close()
                time.sleep(0.5)
            else:
                sessions[rid] = s
        sessions = list(sessions.values())
        ids = client.tokenizer("The capital of France is")["input_ids"]
        expected = generate_local(full_model, ids, 1)
        for s in sessions:  # one session per replica
            assert [int(s.forward(ids).argmax())] == expected
        for s in sessions:
            s.close()
        again = {"path": "protected", "k": K, "model_fingerprint": client.half.server_fingerprint,
                 "keys_id": client._keys_id, "param_set": client.he.params.id}
        text = httpx.get(f"{cluster.url}/metrics", timeout=60).text
        replicas = {s.id.split(".")[0] for s in sessions}
        for rid in replicas:  # each replica imported the keys (from the store, for all but the first)
            line = next(ln for ln in text.splitlines() if ln.startswith(f'veil_protected_key_bytes{{replica="{rid}"}}'))
            assert float(line.split()[-1]) > 100e6
    assert uploads == [201]  # once, although two replicas use the keys
    assert answered and all(pin == by for pin, by in answered)
    assert deletes == [204]  # the client's close: the store's copy and that replica's
    # The delete reached one replica; the other's copy must not open sessions either, as on one server.
    answers = {}
    with httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.key}"}, timeout=60) as http:
        for _ in range(40):
            r = http.post("/v1/sessions", json=again)
            answers.setdefault(r.headers.get(REPLICA_HEADER), set()).add((r.status_code, r.json().get("error", {}).get("code")))
            if len(answers) == 2:
                break
            time.sleep(0.25)
    assert answers.keys() == replicas and all(a == {(404, "keys_not_found")} for a in answers.values()), answers


def test_replicas_start_with_one_malloc_arena_in_the_jobs_working_dir(cluster):
    """A replica computes HE on a thread its process makes after Ray's own have made arenas, so
    only the limit read at its start (``heap.worker_env``) keeps it on the main arena; the
    replica's own runtime_env must not drop the job's empty working_dir (``launch.py``)."""
    import psutil

    pids = cluster.replica_pids().values()
    assert len(pids) == 2
    for pid in pids:
        tunables = psutil.Process(pid).environ().get("GLIBC_TUNABLES", "")
        assert "glibc.malloc.arena_max=1" in tunables.split(":"), tunables
        assert "working_dir_files" in psutil.Process(pid).cwd()


def _engine_children(pid: int) -> list:
    import psutil

    return [c for c in psutil.Process(pid).children() if "spawn_main" in " ".join(c.cmdline())]


def test_a_replica_s_engine_child_ends_with_the_replica(cluster):
    """Runs last: a replica killed outright leaves no engine process behind (it would hold the
    replica's weights, KV pool and, on a GPU, its device memory), nor does the server's stop."""
    children = {rid: _engine_children(pid) for rid, pid in cluster.replica_pids().items()}
    assert len(children) == 2 and all(len(c) == 1 for c in children.values()), children
    victim = next(iter(children))
    os.kill(cluster.replica_pids()[victim], signal.SIGKILL)
    (child,) = children[victim]
    child.wait(30)  # raises psutil.TimeoutExpired if the child outlives its replica
    cluster.stop()
    for (c,) in children.values():
        c.wait(30)
