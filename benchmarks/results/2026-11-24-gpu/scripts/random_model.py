"""Write a random-weight Llama checkpoint of SmolLM2-135M's shape (config + tokenizer from
ARGV[1], safetensors to ARGV[2]) for GPU timing runs where the shipped weights cannot travel."""
import json, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import save_file

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    shutil.copy(f, dst / f.name)
cfg = json.loads((src / "config.json").read_text())
d, f, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
hd = d // cfg["num_attention_heads"]
kv = cfg["num_key_value_heads"] * hd
g = torch.Generator().manual_seed(0)
r = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)
t = {"model.embed_tokens.weight": r(v, d), "model.norm.weight": torch.ones(d, dtype=torch.bfloat16)}
for i in range(L):
    p = f"model.layers.{i}."
    t.update({p + "self_attn.q_proj.weight": r(d, d), p + "self_attn.k_proj.weight": r(kv, d),
              p + "self_attn.v_proj.weight": r(kv, d), p + "self_attn.o_proj.weight": r(d, d),
              p + "mlp.gate_proj.weight": r(f, d), p + "mlp.up_proj.weight": r(f, d),
              p + "mlp.down_proj.weight": r(d, f),
              p + "input_layernorm.weight": torch.ones(d, dtype=torch.bfloat16),
              p + "post_attention_layernorm.weight": torch.ones(d, dtype=torch.bfloat16)})
save_file(t, str(dst / "model.safetensors"))
print("wrote", dst, sum(x.numel() for x in t.values()), "parameters")
