"""Write the default model (or any checkpoint Veil loads) as a Hugging Face directory, for peer
engines that need one (vLLM): config.json + model.safetensors + generation_config.json +
tokenizer files. Run with the project venv:

    .venv/bin/python benchmarks/export_hf.py OUT_DIR [--model SOURCE]

The weights are exactly the ones the reference and Veil use (the shipped GGUF, dequantized to
fp32), saved through `build_reference(ckpt).save_pretrained`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def export_hf(out_dir: Path, source: str | None = None, dtype: torch.dtype = torch.float32) -> Path:
    from veil.engine.loader import load_checkpoint
    from veil.engine.reference import build_reference

    ckpt = load_checkpoint(source)
    model = build_reference(ckpt, dtype=dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    ckpt.tokenizer.save_pretrained(out_dir)
    # A name for the peers' logs; save_pretrained leaves it empty for a model built in memory.
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if not cfg.get("_name_or_path"):
        cfg["_name_or_path"] = getattr(ckpt.config, "name", "") or out_dir.name
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="export a checkpoint as a Hugging Face directory")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--model", help="checkpoint source (default: the shipped SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="dtype of the saved tensors (peers cast at load time anyway)")
    args = ap.parse_args(argv)
    out = export_hf(args.out_dir, args.model, getattr(torch, args.dtype))
    print(f"wrote {out}: {sorted(p.name for p in out.iterdir())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
