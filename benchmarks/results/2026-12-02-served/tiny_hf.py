"""Write a tiny random Llama (3 layers, d = 64, vocabulary 512: ../2026-12-02-engine-host/phases.py)
as a Hugging Face directory with the shipped tokenizer, for runs of the serving overhead, and the
workload of those runs (issue 22's shape, token ids below 500).

    python tiny_hf.py DIR WORKLOAD.json [LAYERS]   # LAYERS: 3 unless given
"""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "2026-12-02-engine-host"))
from safetensors.torch import save_file
from phases import tiny_checkpoint
from veil.benchmarks.workload import random_workload
from veil.engine.loader import load_checkpoint

dst = Path(sys.argv[1]); dst.mkdir(parents=True, exist_ok=True)
c = tiny_checkpoint(layers=int(sys.argv[3]) if len(sys.argv) > 3 else 3)
cfg = c.config
load_checkpoint().tokenizer.save_pretrained(str(dst))
json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
           "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
           "max_position_embeddings": cfg.max_position_embeddings, "tie_word_embeddings": True,
           "eos_token_id": 2, "bos_token_id": 1, "torch_dtype": "float32"}, open(dst / "config.json", "w"))
save_file({k: v.contiguous() for k, v in c.tensors.items()}, str(dst / "model.safetensors"))
random_workload(256, (100, 1024), (100, 1024), vocab=(1, 500)).to_json(Path(sys.argv[2]))
print("wrote", dst, sys.argv[2])
