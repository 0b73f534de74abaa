"""The protected protocol at full depth on the ``plain`` backend: k=2, all 28 protected layers.

The real circuits, layouts, masks and level plan of every layer (the massive-activation layers
included) and the client's math, with CKKS-sized encryption and flooding noise injected, against
the plaintext model: greedy tokens must agree and the next-token distributions must match (KL).
Plain's checks (levels, scales, keys of each rotation, wrap-around of |x|·scale past the
modulus, the refresh mask's room) run on every operation, so a level-plan or overflow bug in any
layer fails here in seconds, before it would cost a SEAL run of an hour. Real CKKS at this depth
is measured by ``benchmarks/protected_overhead.py``.
"""

import numpy as np
import pytest
import torch

from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.generate import generate_local
from veil.protected.client import ProtectedClientState
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.protocol import MAX_SPAN
from veil.protected.server import ProtectedExecutor
from veil.server.config import ServerConfig

K = 2
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n < 2:\n        return n\n    return"]
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def runs(ckpt, full_model, he_pair):
    cfg = ckpt.config
    client_be, server_be = he_pair("plain", PROTECTED_PARAMS, rotation_key_levels(dims_of(cfg, 8192)),
                                   relin_key_level())
    ex = ProtectedExecutor.from_checkpoint(server_be, ckpt, K, cfg.num_layers, ServerConfig().protected_limits())
    out = []
    for prompt in PROMPTS:
        ids = ckpt.tokenizer(prompt)["input_ids"]
        session = ex.new_session()
        client = ProtectedClientState(client_be, cfg, K, cfg.num_layers, session.id, record_values=False)
        tokens, kls, seq = [], [], list(ids)
        with torch.no_grad():
            h_local = full_model.run_layers(full_model.embed(torch.tensor(ids)), 0, K).double().numpy()
            for _ in range(NEW_TOKENS):
                for a in range(0, len(h_local), MAX_SPAN):
                    msg = client.token_message(h_local[a : a + MAX_SPAN])
                    while not isinstance(msg, np.ndarray):
                        msg = client.handle(ex.handle(msg))
                logits = full_model.logits(torch.from_numpy(msg).float()[None])[0].double()
                ref = full_model.logits(full_model.run_layers(full_model.embed(torch.tensor(seq)), 0,
                                                              cfg.num_layers)[-1:])[0].double()
                p, q = torch.log_softmax(ref, -1), torch.log_softmax(logits, -1)
                kls.append(float((p.exp() * (p - q)).sum()))
                tokens.append(int(logits.argmax()))
                seq.append(tokens[-1])
                # the client's own layers for the new token (recomputed over the sequence: short)
                h_local = full_model.run_layers(full_model.embed(torch.tensor(seq)), 0, K)[-1:].double().numpy()
        out.append((ids, tokens, kls, client))
        ex.drop_session(session.id)
    return out


def test_greedy_tokens_and_kl_match_the_plaintext_model(runs, full_model):
    for ids, tokens, kls, _ in runs:
        assert tokens == generate_local(full_model, ids, NEW_TOKENS)
        assert max(kls) < 1e-4, kls


def test_every_layer_ran_three_round_trips_per_step(runs, ckpt):
    n = ckpt.config.num_layers - K
    for ids, _, _, client in runs:
        steps = -(-len(ids) // MAX_SPAN) + NEW_TOKENS - 1
        assert client.step == steps * 3 * n
