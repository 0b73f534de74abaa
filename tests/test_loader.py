"""The converted-GGUF cache of ``veil.engine.loader``: a cached load gives exactly what converting
the file gives (every tensor bit for bit, the config, the tokenizer), a damaged entry is
converted again, and a cache that cannot be written costs nothing but time."""

import json

import pytest
import torch

from veil.engine import loader
from veil.engine.loader import load_checkpoint

TEXTS = ["The capital of France is", "1, 2, 3, 4,", "héllo wörld 🙂\n\n\ttabs  ", "<|im_start|>user\nhi<|im_end|>"]


def _same(a, b):
    assert a.config == b.config and a.source == b.source
    assert sorted(a.tensors) == sorted(b.tensors)
    for k, v in a.tensors.items():
        assert v.dtype == b.tensors[k].dtype and torch.equal(v, b.tensors[k]), k
    for text in TEXTS:
        assert a.tokenizer(text)["input_ids"] == b.tokenizer(text)["input_ids"], text
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert (a.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            == b.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    assert a.tokenizer.all_special_ids == b.tokenizer.all_special_ids


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The shipped GGUF converted by transformers (~18 s) into an empty cache: (checkpoint, cache
    directory, the conversions made)."""
    root, calls, real = tmp_path_factory.mktemp("models"), [], loader._convert_gguf
    mp = pytest.MonkeyPatch()
    mp.setenv("VEIL_MODEL_CACHE", str(root))
    mp.setattr(loader, "_convert_gguf", lambda path: calls.append(path) or real(path))  # counts, converts
    try:
        ckpt = load_checkpoint()
    finally:
        mp.undo()
    return ckpt, root, calls


def test_a_cached_load_equals_the_conversion(converted, monkeypatch):
    from safetensors import safe_open

    ckpt, root, calls = converted
    (entry,) = root.iterdir()
    assert entry.name.startswith("SmolLM2-135M-Instruct.Q4_1-") and (entry / "veil-cache.json").is_file()
    assert (entry.stat().st_mode & 0o777) == 0o700  # the provider's weights: for this user only
    with safe_open(str(entry / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied to the embedding: stored once
    monkeypatch.setenv("VEIL_MODEL_CACHE", str(root))
    again = load_checkpoint()
    assert len(calls) == 1  # the second load read the entry
    _same(ckpt, again)
    assert again.tensors["lm_head.weight"] is again.tensors["model.embed_tokens.weight"]


def test_a_damaged_entry_is_converted_again(converted, tmp_path, monkeypatch):
    """The conversion is replaced by the one made above (a fake of transformers' reader, which
    the fixture runs for real); what is under test is the cache's handling of the entry."""
    calls = []
    monkeypatch.setenv("VEIL_MODEL_CACHE", str(tmp_path))
    hf_cfg = _hf_config(converted)
    converted = converted[0]
    monkeypatch.setattr(loader, "_convert_gguf", lambda path: calls.append(path) or (converted, hf_cfg))
    load_checkpoint()
    (entry,) = tmp_path.iterdir()
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    _same(converted, load_checkpoint())
    assert len(calls) == 2 and (entry / "veil-cache.json").is_file()
    _same(converted, load_checkpoint())  # the rewritten entry reads again
    assert len(calls) == 2


def _hf_config(converted) -> dict:
    """The config dict the fixture's real conversion wrote (what ``_convert_gguf`` returns)."""
    (entry,) = converted[1].iterdir()
    return json.loads((entry / "config.json").read_text())


def _block_root(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("VEIL_MODEL_CACHE", str(blocker / "models"))


def _fail_writer(tmp_path, monkeypatch):
    monkeypatch.setenv("VEIL_MODEL_CACHE", str(tmp_path))

    def full(*args, **kwargs):  # safetensors reports a full disk with its own error type
        raise RuntimeError("No space left on device (os error 28)")

    monkeypatch.setattr("safetensors.torch.save_file", full)


@pytest.mark.parametrize("failure", [_block_root, _fail_writer], ids=["root is a file", "writer raises"])
def test_a_cache_that_cannot_be_written_only_costs_time(converted, tmp_path, monkeypatch, failure):
    monkeypatch.setattr(loader, "_convert_gguf", lambda path: (converted[0], _hf_config(converted)))  # as above
    failure(tmp_path, monkeypatch)
    assert load_checkpoint() is converted[0]
    assert [p.name for p in tmp_path.iterdir()] in ([], ["file"])  # no half-written entry or temporary directory


def test_off_converts_and_keeps_nothing(converted, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(loader, "_convert_gguf", lambda path: calls.append(path) or (converted[0], _hf_config(converted)))
    monkeypatch.setenv("HOME", str(tmp_path))  # where the default cache would go
    monkeypatch.setenv("VEIL_MODEL_CACHE", "off")
    assert load_checkpoint() is converted[0] and load_checkpoint() is converted[0]
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_each_file_keeps_its_most_recently_used_entries(converted, tmp_path, monkeypatch):
    """A new transformers or gguf (here: a new cache format, which changes the key the same way)
    writes a new entry; beyond ``KEEP_PER_SOURCE`` the least recently used of the same file go,
    a hit counting as a use. Another file's entries and a live writer's temporary directory
    stay; a crashed writer's goes. The conversion is the fixture's, replayed (a fake of
    transformers' reader; the cache is what is under test)."""
    import os
    import time

    calls = []
    monkeypatch.setattr(loader, "_convert_gguf", lambda path: calls.append(path) or (converted[0], _hf_config(converted)))
    monkeypatch.setenv("VEIL_MODEL_CACHE", str(tmp_path))
    other = tmp_path / "other-0"
    other.mkdir()
    (other / "veil-cache.json").write_text(json.dumps({"format": 1, "source": "/elsewhere/other.gguf"}))
    crashed, live = tmp_path / ".tmp-crashed", tmp_path / ".tmp-live"
    crashed.mkdir(), live.mkdir()
    os.utime(crashed, (time.time() - 7200,) * 2)
    entries = {}
    for fmt in (1, 2, 1, 3):  # the second load of 1 is a hit: it makes 1 more recent than 2
        monkeypatch.setattr(loader, "MODEL_CACHE_FORMAT", fmt)
        time.sleep(0.05)  # marker times apart
        assert load_checkpoint() is not None
        entries[fmt] = loader._cache_entry(tmp_path, loader.default_gguf_path())
    assert len(calls) == 3  # formats 1, 2, 3 converted; the second 1 read its entry
    assert loader.KEEP_PER_SOURCE == 2
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {entries[1].name, entries[3].name, "other-0", ".tmp-live"}  # 2, least recently used, went
