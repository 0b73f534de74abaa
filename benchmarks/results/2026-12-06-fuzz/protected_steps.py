"""Mutated protected steps against a native `veil serve` at k=29 (one protected layer) on
loopback: a session's real messages (its TOKEN upload, then the WEIGHTS upload after it), each
mutated at random (bit flips, byte writes, cuts, insertions; 70% within the first 96 bytes, where
the msgpack map's fields are) and posted; any 5xx is a finding. A 200 to a mutated message (one
whose ciphertext bytes still decode) advances that session, so the next case opens a new one.
At the end a bystander session, paused before this began, finishes its position and must equal
the plaintext layers. Run from the checkout: PYTHONSAFEPATH=1 .venv/bin/python <this> [seconds]."""
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from veil.benchmarks.engine_throughput import launch_server
from veil.client import VeilClient
from veil.crypto.wire import CONTENT_TYPE
from veil.engine.loader import build_model, load_checkpoint
from veil.engine.split import client_half_from
from veil.protected.client import ProtectedClientState
from veil.protected.protocol import ProtectedMessage

K, budget = 29, float(sys.argv[1]) if len(sys.argv) > 1 else 300
rng = random.Random(11)  # the mutations' positions, not key material


def mutate(b: bytes) -> bytes:
    b = bytearray(b)
    for _ in range(rng.choice([1, 1, 2, 4])):
        head = min(len(b), 96)
        pos = rng.randrange(head) if rng.random() < 0.7 else rng.randrange(len(b))
        op = rng.randrange(5)
        if op == 0:
            b[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[pos] = rng.choice([0, 0xFF, 0x7F, 0x80, 0xC0, 0xC1, rng.randrange(256)])
        elif op == 2:
            del b[rng.randrange(len(b)):]
        elif op == 3:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 4])))
        else:
            del b[pos:pos + rng.choice([1, 2, 4])]
    return bytes(b)


ckpt = load_checkpoint()
tmp = Path(tempfile.mkdtemp())
proc, url, key = launch_server(tmp, ("plaintext", "protected"), ["--k", str(K), "--he-backend", "native"])
client = VeilClient(url, key, mode="protected", half=client_half_from(ckpt, K))
client.generate_keys(progress=False)
full = build_model(ckpt)
with torch.no_grad():  # a real activation after the client's layers (random inputs leave ~1e-3 of flooding noise)
    ids = client.tokenizer("The capital of France is", return_tensors="pt")["input_ids"][0][:1]
    h = full.run_layers(full.embed(ids), 0, K)[0].double().numpy()


def post(sid, body):
    return httpx.post(f"{url}/v1/sessions/{sid}/steps", content=body, timeout=300,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": CONTENT_TYPE})


def fresh():
    """A new session standing before its WEIGHTS upload: (id, state, token bytes, weights bytes)."""
    sid = client._create_session()["id"]
    state = ProtectedClientState(client.he, ckpt.config, K, ckpt.config.num_layers, sid)
    token = state.token_message(h)
    r = post(sid, token.to_bytes())
    assert r.status_code == 200, r.text
    weights = state.handle(ProtectedMessage.from_bytes(r.content, max_bytes=1 << 30))
    return sid, state, token.to_bytes(), weights.to_bytes()


try:
    bystander = fresh()
    sid, state, token, weights = fresh()
    statuses, findings, t0 = collections.Counter(), [], time.time()
    while time.time() - t0 < budget:
        which = rng.choice(["token", "weights"])
        body = mutate(token if which == "token" else weights)
        r = post(sid, body)
        statuses[(which, r.status_code)] += 1
        if r.status_code >= 500:
            findings.append((which, r.status_code, r.text[:300], body[:120]))
        if r.status_code == 200:  # the session moved on
            client._delete_session(sid)
            sid, state, token, weights = fresh()
    print("statuses", dict(sorted(statuses.items())))
    print("findings", len(findings))
    for f in findings[:10]:
        print(f)
    b_sid, b_state, _, b_weights = bystander
    msg, out = ProtectedMessage.from_bytes(b_weights, max_bytes=1 << 30), None
    while True:
        r = post(b_sid, msg.to_bytes())
        assert r.status_code == 200, r.text
        out = b_state.handle(ProtectedMessage.from_bytes(r.content, max_bytes=1 << 30))
        if isinstance(out, np.ndarray):
            break
        msg = out
    with torch.no_grad():
        ref = full.run_layers(torch.tensor(h, dtype=torch.float32)[None], K, ckpt.config.num_layers)[0].double().numpy()
    print("bystander relative error", np.linalg.norm(out - ref) / np.linalg.norm(ref))
    print("server alive", proc.poll() is None, "health", httpx.get(f"{url}/health").status_code)
finally:
    client.close()
    proc.terminate()
    proc.wait(60)
