"""Splitting a model into the client half and the server half, and their bundles on disk.

client half: embedding, layers [0, k), final norm, LM head (tied: the embedding), tokenizer.
server half: layers [k, L).
A bundle is a directory: `model.safetensors`, `config.json` (our ModelConfig), `manifest.json`
and, for the client, the tokenizer files. The client manifest carries the SHA-256 fingerprint
of the server half, so a client can tell it is talking to the half its own layers belong to.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from veil.engine.config import ModelConfig
from veil.engine.loader import (
    Checkpoint,
    build_model,
    load_checkpoint,
    load_safetensors_dir,
    load_tokenizer,
)
from veil.engine.model import LlamaModel

BUNDLE_FORMAT = "veil-bundle/1"
DEFAULT_K = 2
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def split_tensors(tensors: dict[str, torch.Tensor], cfg: ModelConfig, k: int):
    """Partition HF-named tensors into (client, server) dicts. The head is kept only if untied."""
    if not 0 <= k <= cfg.num_layers:
        raise ValueError(f"split k={k} outside [0, {cfg.num_layers}]")
    client, server = {}, {}
    for name, t in tensors.items():
        layer = layer_of(name)
        if layer is None:
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue  # the client reuses the embedding
            client[name] = t
        elif layer < k:
            client[name] = t
        else:
            server[name] = t
    return client, server


def fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass
class ClientHalf:
    config: ModelConfig
    k: int
    model: LlamaModel  # embedding, layers [0, k), norm, head
    tokenizer: object
    server_fingerprint: str


@dataclass
class ServerHalf:
    """What a server serves: layers [k, L), and optionally the whole model (fast path)."""

    config: ModelConfig
    k: int
    model: LlamaModel  # layers [k, L), or [0, L) with embedding and head when `full`
    fingerprint: str  # of layers [k, L) alone: what split clients check
    tokenizer: object | None = None  # present when full

    @property
    def full(self) -> bool:
        return self.model.first == 0 and self.model.with_ends


def client_half_from(ckpt: Checkpoint, k: int = DEFAULT_K) -> ClientHalf:
    _, server = split_tensors(ckpt.tensors, ckpt.config, k)
    model = build_model(ckpt, 0, k, with_ends=True)
    return ClientHalf(ckpt.config, k, model, ckpt.tokenizer, fingerprint(server))


def server_half_from(ckpt: Checkpoint, k: int = DEFAULT_K, full: bool = False,
                     dtype: torch.dtype = torch.float32) -> ServerHalf:
    """The server's model from a whole checkpoint; `full` keeps every layer and the ends too, for
    the fast path (the split fingerprint still covers layers [k, L) only)."""
    _, server = split_tensors(ckpt.tensors, ckpt.config, k)
    if full:
        return ServerHalf(ckpt.config, k, build_model(ckpt, dtype=dtype), fingerprint(server), ckpt.tokenizer)
    return ServerHalf(ckpt.config, k, build_model(ckpt, k, None, with_ends=False, dtype=dtype), fingerprint(server))


def write_bundles(ckpt: Checkpoint, k: int, out: Path) -> tuple[Path, Path]:
    """`veil split`: write out/client_bundle and out/server_bundle."""
    from safetensors.torch import save_file

    client, server = split_tensors(ckpt.tensors, ckpt.config, k)
    fp = fingerprint(server)
    dirs = []
    for role, tensors in (("client", client), ("server", server)):
        d = Path(out) / f"{role}_bundle"
        d.mkdir(parents=True, exist_ok=True)
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(ckpt.config.to_dict(), indent=2))
        manifest = {
            "format": BUNDLE_FORMAT,
            "role": role,
            "model": ckpt.config.name,
            "k": k,
            "num_layers": ckpt.config.num_layers,
            "layers": [0, k] if role == "client" else [k, ckpt.config.num_layers],
            "tensors": sorted(tensors),
            "server_fingerprint": fp,
        }
        if role == "client":
            ckpt.tokenizer.save_pretrained(str(d))
        (d / "manifest.json").write_text(json.dumps(manifest, indent=2))
        dirs.append(d)
    return dirs[0], dirs[1]


def _read_bundle(path: Path, role: str) -> tuple[dict, ModelConfig, dict[str, torch.Tensor]]:
    path = Path(path)
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest.get("format") != BUNDLE_FORMAT or manifest.get("role") != role:
        raise ValueError(f"{path} is not a Veil {role} bundle ({manifest.get('format')}, {manifest.get('role')})")
    cfg = ModelConfig.from_dict(json.loads((path / "config.json").read_text()))
    return manifest, cfg, load_safetensors_dir(path)


def load_client_half(bundle: Path | None = None, k: int = DEFAULT_K, ckpt: Checkpoint | None = None) -> ClientHalf:
    """From a client bundle, or else by splitting the embedded (or given) model in memory."""
    if bundle is None:
        return client_half_from(ckpt or load_checkpoint(), k)
    manifest, cfg, tensors = _read_bundle(bundle, "client")
    stray = [n for n in tensors if (layer_of(n) or 0) >= manifest["k"]]
    if stray:
        raise ValueError(f"client bundle holds server tensors: {stray[:3]}")
    part = Checkpoint(cfg, tensors, load_tokenizer(Path(bundle)), str(bundle), 0.0)
    model = build_model(part, 0, manifest["k"], with_ends=True)
    return ClientHalf(cfg, manifest["k"], model, part.tokenizer, manifest["server_fingerprint"])


def load_server_half(bundle: Path | None = None, k: int = DEFAULT_K, ckpt: Checkpoint | None = None,
                     dtype: torch.dtype = torch.float32) -> ServerHalf:
    if bundle is None:
        return server_half_from(ckpt or load_checkpoint(), k, dtype=dtype)
    manifest, cfg, tensors = _read_bundle(bundle, "server")
    part = Checkpoint(cfg, tensors, None, str(bundle), 0.0)
    half = ServerHalf(cfg, manifest["k"], build_model(part, manifest["k"], None, with_ends=False, dtype=dtype),
                      fingerprint(tensors))
    if half.fingerprint != manifest["server_fingerprint"]:
        raise ValueError(f"{bundle}: tensors do not match the manifest's fingerprint")
    return half
