"""The C paged attention alone: 16 rows at context 300, SmolLM2-135M heads (9 q, 3 kv, d 64),
blocks of 16, random caches, 2 threads; microseconds per call in fp32 and bf16."""
import torch, time
from veil.kernels import llama_cpu
torch.set_num_threads(2)
B,L,hq,hkv,d,bs=16,300,9,3,64,16
nb=B*(-(-L//bs))
for dt in (torch.float32, torch.bfloat16):
    q=torch.randn(B,hq,d).to(dt); kc=torch.randn(nb,bs,hkv,d).to(dt); vc=torch.randn(nb,bs,hkv,d).to(dt)
    tables=torch.arange(nb,dtype=torch.int32).view(B,-1); lens=torch.full((B,),L,dtype=torch.int32)
    for _ in range(5): llama_cpu.paged_attention(q,kc,vc,tables,lens,0.125)
    t=time.perf_counter(); n=200
    for _ in range(n): llama_cpu.paged_attention(q,kc,vc,tables,lens,0.125)
    print(dt, f"{(time.perf_counter()-t)/n*1e6:.0f} us per call")
