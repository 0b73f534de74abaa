"""Split bundles: the right tensors on each side, fingerprints, and split = whole."""

import json

import pytest
import torch
from safetensors.torch import load_file

from veil.engine.split import layer_of, load_client_half, load_server_half, write_bundles


@pytest.fixture(scope="module")
def bundles(ckpt, tmp_path_factory):
    return write_bundles(ckpt, 2, tmp_path_factory.mktemp("bundles"))


def test_client_bundle_holds_no_server_layer(bundles, ckpt):
    client_dir, server_dir = bundles
    client = load_file(str(client_dir / "model.safetensors"))
    server = load_file(str(server_dir / "model.safetensors"))
    assert all(layer_of(n) is None or layer_of(n) < 2 for n in client)
    assert {layer_of(n) for n in client} - {None} == {0, 1}
    assert {layer_of(n) for n in server} == set(range(2, ckpt.config.num_layers))
    assert "model.embed_tokens.weight" in client and "model.norm.weight" in client
    assert not set(client) & set(server)
    # no server weight hides under another name either: compare the bytes
    server_bytes = {t.numpy().tobytes()[:4096] for t in server.values() if t.numel() > 1024}
    assert not any(t.numpy().tobytes()[:4096] in server_bytes for t in client.values() if t.numel() > 1024)


def test_manifests_and_fingerprint(bundles):
    client_dir, server_dir = bundles
    cm = json.loads((client_dir / "manifest.json").read_text())
    sm = json.loads((server_dir / "manifest.json").read_text())
    assert cm["role"] == "client" and sm["role"] == "server" and cm["k"] == sm["k"] == 2
    assert len(cm["server_fingerprint"]) == 64
    assert cm["server_fingerprint"] == sm["server_fingerprint"] == load_server_half(server_dir).fingerprint


def test_tampered_server_bundle_is_refused(bundles, tmp_path):
    import shutil

    from safetensors.torch import save_file

    _, server_dir = bundles
    bad = tmp_path / "server_bundle"
    shutil.copytree(server_dir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["model.layers.5.mlp.up_proj.weight"][0, 0] += 1.0
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="fingerprint"):
        load_server_half(bad)


def test_bundle_halves_compose_to_the_whole_model(bundles, full_model, chat_prompts):
    client_dir, server_dir = bundles
    client, server = load_client_half(client_dir), load_server_half(server_dir)
    assert client.server_fingerprint == server.fingerprint
    ids = chat_prompts[1]
    pos = torch.arange(len(ids))
    with torch.inference_mode():
        h, _ = client.model.forward_layers(client.model.embed(torch.tensor(ids)), pos, [None, None])
        h, _ = server.model.forward_layers(h, pos, [None] * 28)
        split_logits = client.model.logits(h)
        w, _ = full_model.forward_layers(full_model.embed(torch.tensor(ids)), pos, [None] * 30)
        assert torch.equal(split_logits, full_model.logits(w))
    assert client.tokenizer.decode(client.tokenizer.encode("The capital")) == "The capital"
