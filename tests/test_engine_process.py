"""`veil serve --engine-process`: the engine loop in a child process (engine/process.py). The
server must answer exactly as with the engine in its own process: the fast path's tokens, split
sessions' outputs, out-of-memory steps, and a dead engine."""

import concurrent.futures as cf
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from veil.client import VeilClient
from veil.crypto.wire import HiddenStep
from veil.engine.api import DeviceOutOfMemory, EngineConfig, SessionClosed
from veil.engine.process import EngineProcess, SequenceView
from veil.engine.process_child import serve
from veil.engine.sequence import SeqKind


@pytest.fixture(scope="module")
def srv(live_server_cls, ckpt, tmp_path_factory):
    s = live_server_cls(ckpt, tmp_path_factory.mktemp("engine-process"), engine_process=True)
    yield s
    s.stop()


def _complete(srv, prompt, n, stream=False):
    r = httpx.post(f"{srv.url}/v1/completions", timeout=300, headers={"Authorization": f"Bearer {srv.keys['alice']}"},
                   json={"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream})
    return r


def test_requests_and_split_sessions_at_once_equal_the_whole_model(srv, client_half, chat_prompts, local_greedy):
    """Full-model completions (streamed and not) and split sessions interleaved in the child's
    batches: each gives the whole model's greedy tokens; /metrics reads the child's counts."""
    assert isinstance(srv.app.state.engine, EngineProcess)
    tok, key = client_half.tokenizer, srv.keys["alice"]

    def split(i):
        with VeilClient(srv.url, key, half=client_half) as c:
            return c.generate(chat_prompts[i % 3], 24, stop_at_eos=False).tokens

    def full(i):
        r = _complete(srv, chat_prompts[i % 3], 24, stream=i % 4 == 2)
        assert r.status_code == 200, r.text
        if i % 4 != 2:
            return r.json()["choices"][0]["text"]
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])

    steps_before = srv.app.state.engine.steps
    with cf.ThreadPoolExecutor(6) as pool:
        futs = [(i, pool.submit(split if i % 2 else full, i)) for i in range(6)]
        for i, f in futs:
            expected = local_greedy[i % 3][:24]
            assert f.result() == (expected if i % 2 else tok.decode(expected, skip_special_tokens=True)), i
    assert 0 < srv.app.state.engine.steps - steps_before < 6 * 24  # batched, and counted here
    m = httpx.get(f"{srv.url}/metrics").text
    assert "veil_engine_steps_total" in m and httpx.get(f"{srv.url}/health").json()["status"] == "ok"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_engine_process_on_cuda_equals_the_whole_model(ckpt, tmp_path, chat_prompts, local_greedy,
                                                          live_server_cls):
    """The child builds the engine on the GPU from the server's CPU weights (fp32: CUDA fp32
    gave the CPU's greedy answers, 2026-11-24-gpu)."""
    srv = live_server_cls(ckpt, tmp_path, engine_process=True, device="cuda", dtype="float32")
    try:
        r = _complete(srv, chat_prompts[1], 16)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == srv.half.tokenizer.decode(local_greedy[1][:16],
                                                                             skip_special_tokens=True)
    finally:
        srv.stop()


def test_a_closed_session_and_a_client_gone_mid_stream_free_the_childs_work(srv, client_half, chat_prompts):
    """A stream the client leaves is aborted in the child; a closed split session is closed
    there: no sequence stays behind (the child's counts fall to zero)."""
    key = srv.keys["alice"]
    with httpx.stream("POST", f"{srv.url}/v1/completions", timeout=60, headers={"Authorization": f"Bearer {key}"},
                      json={"prompt": chat_prompts[0], "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
                            "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(3):  # a few chunks, then the client goes away
            next(lines)
    with VeilClient(srv.url, key, half=client_half) as c:
        sess = c.open_session()
        sess.forward(chat_prompts[1])
        sess.close()
    engine = srv.app.state.engine
    _wait_for(lambda: not engine._views)
    r = _complete(srv, chat_prompts[2], 2)  # a step after the aborts refreshes the counts
    assert r.status_code == 200
    _wait_for(lambda: engine.num_running == engine.num_waiting == 0, timeout=10)


def _wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _serve_failing_the_first_split_launch(conn, model, k, cfg, error: Exception) -> None:
    """The engine process with its runner's first launch that holds split rows raising
    ``error``: a fault injected by these tests into the child (a fake inside tests of the
    server's handling, not of the runner)."""
    from veil.engine.model_runner import ModelRunner

    real, failed = ModelRunner.launch, []

    def launch(self, batch, in_flight=None):
        if not failed and batch.hidden is not None:
            failed.append(1)
            raise error
        return real(self, batch, in_flight)

    ModelRunner.launch = launch
    serve(conn, model, k, cfg)


class _OomOnce(EngineProcess):
    """Out of memory, as a CUDA allocation raises it."""

    @staticmethod
    def child_main(conn, model, k, cfg):
        _serve_failing_the_first_split_launch(conn, model, k, cfg,
                                              torch.OutOfMemoryError("CUDA out of memory (injected by the test)"))


class _BugOnce(EngineProcess):
    """Anything else: a bug met by some input."""

    @staticmethod
    def child_main(conn, model, k, cfg):
        _serve_failing_the_first_split_launch(conn, model, k, cfg, RuntimeError("a bug (injected by the test)"))


@pytest.mark.parametrize(("process", "status", "code"), [(_OomOnce, 503, "device_out_of_memory"),
                                                         (_BugOnce, 500, "engine_error")])
def test_a_failed_step_in_the_child_is_answered_and_taken_back(ckpt, tmp_path, client_half, chat_prompts,
                                                               local_greedy, monkeypatch, live_server_cls,
                                                               process, status, code):
    """The child drops the step whole (the engine's own handling); the server answers 503
    device_out_of_memory (out of memory) or 500 engine_error (anything else), the same step id
    is accepted again, and the session and the SDK go on to the whole model's tokens."""
    import veil.server.app as app_module

    # The spawned child unpickles the class by this module's name (pytest's importlib mode names it
    # tests.test_engine_process) and takes this process's sys.path. The checkout itself is not on
    # it (PYTHONSAFEPATH: its kernels/ would shadow Hugging Face's `kernels`), so the child gets a
    # folder that holds only a link to tests/.
    (tmp_path / "importable").mkdir()
    (tmp_path / "importable" / "tests").symlink_to(Path(__file__).resolve().parent)
    monkeypatch.syspath_prepend(str(tmp_path / "importable"))
    monkeypatch.setattr(app_module, "EngineProcess", process)
    srv = live_server_cls(ckpt, tmp_path, engine_process=True)
    try:
        key = srv.keys["alice"]
        with VeilClient(srv.url, key, half=client_half) as c:
            sess = c.open_session()
            step = HiddenStep(sess.id, 1, torch.zeros(5, 576), list(range(5))).to_bytes()
            r = httpx.post(f"{srv.url}/v1/sessions/{sess.id}/steps", content=step, timeout=60,
                           headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-veil"})
            assert r.status_code == status and r.json()["error"]["code"] == code
            assert r.headers.get("retry-after") == ("1" if status == 503 else None)
            # the rows were taken back here too: the same step at the same positions is accepted
            r = httpx.post(f"{srv.url}/v1/sessions/{sess.id}/steps", content=step, timeout=60,
                           headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-veil"})
            assert r.status_code == 200, r.text
            sess.close()
            assert c.generate(chat_prompts[0], 8, stop_at_eos=False).tokens == local_greedy[0][:8]
        assert httpx.get(f"{srv.url}/health").status_code == 200
        failed = f"veil_engine_failed_steps {1.0 if status == 500 else 0.0}"  # the child's count, sent every 0.5 s
        _wait_for(lambda: failed in (m := httpx.get(f"{srv.url}/metrics").text)
                  and "veil_engine_failed_steps_in_a_row 0.0" in m)  # the steps after it completed
    finally:
        srv.stop()


def test_a_dead_engine_process_fails_its_work_with_503_and_health_says_so(ckpt, tmp_path, client_half,
                                                                          chat_prompts, live_server_cls):
    srv = live_server_cls(ckpt, tmp_path, engine_process=True)
    try:
        key, engine = srv.keys["alice"], srv.app.state.engine
        with VeilClient(srv.url, key, half=client_half) as c:
            sess = c.open_session()
            sess.forward(chat_prompts[0][:4])
            with cf.ThreadPoolExecutor(1) as pool:
                pending = pool.submit(_complete, srv, chat_prompts[1], 4000)
                _wait_for(lambda: engine._views and len(engine._views) == 2)
                engine._proc.kill()
                assert pending.result().status_code == 503
            assert httpx.get(f"{srv.url}/health").status_code == 503
            assert _complete(srv, chat_prompts[2], 2).status_code == 503
            step = HiddenStep(sess.id, 2, torch.zeros(1, 576), [4]).to_bytes()
            r = httpx.post(f"{srv.url}/v1/sessions/{sess.id}/steps", content=step, timeout=60,
                           headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-veil"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
    finally:
        srv.stop()


def test_native_he_beside_an_engine_process_computes_on_one_thread_with_the_engines_threads(
        ckpt, tmp_path, live_server_cls):
    """With the engine's OpenMP team in the child, the protected path's native HE gets one
    thread of the server's process with the engine's thread count, not the one thread that
    `veil serve` leaves the HE worker and the request threads."""
    import threading

    srv = live_server_cls(ckpt, tmp_path, engine_process=True, he_backend="native", threads=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as veil serve leaves this process's threads
        where = [srv.app.state.protected._compute(lambda: (threading.current_thread().name, torch.get_num_threads()))
                 for _ in range(2)]
        assert where[0] == where[1] and where[0][0].startswith("veil-he") and where[0][1] == 2
    finally:
        torch.set_num_threads(before)
        srv.stop()


def test_views_follow_what_the_child_reports(full_model):
    """The server side's bookkeeping on messages as the child sends them (built here, no child
    started): tokens after an abort are dropped; an out-of-memory step gives its rows back; a
    close answers a step in flight at once."""
    ep = EngineProcess(full_model, 0, EngineConfig())
    ep._conn = _Sink()
    got = []
    req = ep.add_request("t", [1, 2, 3], 4, None, on_token=got.append, on_finish=got.append)
    ep._deliver([(req.id, "tok", 7)], None)
    ep.abort(req)
    ep._deliver([(req.id, "tok", 8), (req.id, "fin", "abort")], None)
    assert got == [7, "abort"] and req.finished and ep._conn.sent[-1] == ("abort", req.id)

    sess, results = ep.open_hidden("t"), []
    ep.submit_hidden(sess, torch.ones(3, 4), results.append)
    assert sess.num_inputs == 3
    ep._deliver([(sess.id, "step", DeviceOutOfMemory("dropped"))], None)
    assert sess.num_inputs == 0 and isinstance(results[-1], DeviceOutOfMemory)
    ep.submit_hidden(sess, torch.ones(2, 4), results.append)
    ep._deliver([(sess.id, "step", np.zeros((2, 4), np.float32))], None)
    assert sess.num_inputs == 2 and torch.equal(results[-1], torch.zeros(2, 4))
    ep.submit_hidden(sess, torch.ones(1, 4), results.append)
    with pytest.raises(RuntimeError):  # one step at a time, as the engine has it
        ep.submit_hidden(sess, torch.ones(1, 4), results.append)
    ep.close(sess)
    assert isinstance(results[-1], SessionClosed) and sess.finished and not ep._views
    assert SequenceView(1, SeqKind.HIDDEN).num_inputs == 0


class _Sink:
    """Stands in for the pipe to the child in the bookkeeping test above: records what is sent."""

    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)
