"""The protected path end to end over a loopback server on SEAL (``--he-backend seal``), the
production backend beside native (``test_protected_path.py`` runs the rest of the path on native):
real SEAL, the real parameter set, the real model at k=28 (2 protected layers). A module, and so
a process, of its own: SEAL's memory pool never returns memory, and beside the native module's
server and keys the two peaked at 15.1 GB."""

import httpx
import pytest

from veil.client import VeilClient
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.generate import generate_local
from veil.engine.split import client_half_from

pytestmark = pytest.mark.he_heavy

K = 28
PROMPT = "1, 2, 3, 4,"  # 11 tokens: two prefill spans


def test_a_seal_server_gives_plain_greedy_tokens(ckpt, full_model, live_server_cls, tmp_path_factory, holds_no_secret):
    """A SEAL server (``--he-backend seal``): the prompt of two prefill spans and 3 tokens give
    plain greedy's tokens. The client is not told the backend: it follows the server's /health,
    which asks a SEAL server's compact key set (SEAL has no hoisting)."""
    srv = live_server_cls(ckpt, tmp_path_factory.mktemp("protected-seal"), k=K, he_backend="seal")
    c = VeilClient(srv.url, srv.keys["carol"], mode="protected", half=client_half_from(ckpt, K))
    try:
        c.generate_keys(progress=False)
        ids = c.tokenizer(PROMPT)["input_ids"]
        assert len(ids) > c.prefill_span
        assert c.generate(ids, 3, stop_at_eos=False).tokens == generate_local(full_model, ids, 3)
        svc = srv.app.state.protected
        assert svc.executor().be.inner.name == "seal" and svc.executor().params_id == PROTECTED_PARAMS.id
        assert [ks.backend.name for ks in svc.keys.values()] == ["seal"]
        info = httpx.get(f"{srv.url}/health").json()["protected"]
        assert info["he_backend"] == "seal" and info["key_set"] == "compact"
        assert c.he_backend == "seal" and c.key_set == "compact"
        held = next(iter(svc.keys.values())).backend.rotation_steps
        assert 1 in held and 3 not in held
        holds_no_secret(svc)
        assert all(ks.backend._decryptor is None for ks in svc.keys.values())  # SEAL's own decryptor object
        assert svc.executor().sessions == {}
    finally:
        c.close()
        srv.stop()
