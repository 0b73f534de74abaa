"""Does a Ray actor's worker thread reuse freed 100 MiB blocks once keep_freed_memory has run?"""
import os, sys, json
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
import ray

PROBE = """
import resource, threading, torch
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def run():
    steady = []
    def work():
        x = torch.ones(100 << 17, dtype=torch.int64)
        for i in range(60):
            if i == 20: start = faults()
            y = torch.empty_like(x); y.fill_(1); del y
        steady.append(faults() - start)
    t = threading.Thread(target=work); t.start(); t.join()
    return steady[0]
"""

@ray.remote(num_cpus=0)
class Probe:
    async def __init__(self):
        from veil.kernels import heap
        self.kept = heap.keep_freed_memory()
    async def run(self):
        ns = {}; exec(PROBE, ns)
        return self.kept, os.environ.get("GLIBC_TUNABLES"), ns["run"]()

env = {}
if len(sys.argv) > 1:
    env = {"env_vars": {"GLIBC_TUNABLES": sys.argv[1]}}
ray.init(num_cpus=2, include_dashboard=False, runtime_env=env or None)
p = Probe.remote()
print(json.dumps(ray.get([p.run.remote() for _ in range(2)])))
ray.shutdown()
