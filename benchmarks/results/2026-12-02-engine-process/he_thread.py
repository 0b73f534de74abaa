"""Where the protected path's native HE computes beside the engine, timed on one of its kernels:
the C NTT (kernels/ckks_cpu.ntt_cpu, OpenMP over rows) of a [2, 8, 16384] batch of residues,
through ProtectedService's compute as create_app builds it. In one run: the engine in this process
(Engine.call, on its loop's OpenMP team), the engine in a process of its own (the HE thread with
the engine's thread count), and the calling thread at the one thread veil serve leaves it (what
--engine-process gave the HE before the HE thread)."""
import pathlib, statistics, tempfile, time
import torch

def main():
    torch.set_num_threads(1)  # as veil serve: the engine (or the HE thread) owns the threads
    from veil.crypto.params import PROTECTED_PARAMS
    from veil.engine.loader import load_checkpoint
    from veil.engine.split import server_half_from
    from veil.kernels.ckks_cpu import ntt_cpu
    from veil.server.app import create_app
    from veil.server.config import ServerConfig
    from veil.server.tenants import TenantStore
    primes = tuple(PROTECTED_PARAMS.primes[:8])
    x = torch.stack([torch.randint(0, q, (2, 16384), dtype=torch.int64) for q in primes], 1)
    def op():
        t0 = time.perf_counter()
        for _ in range(10):
            ntt_cpu(primes, x, False)
        return (time.perf_counter() - t0) / 10
    half = server_half_from(load_checkpoint(None), 28, full=True)
    for name, ep in (("engine in this process: Engine.call", False), ("engine process: the HE thread", True)):
        tmp = pathlib.Path(tempfile.mkdtemp())
        cfg = ServerConfig(tenants_file=tmp / "t.json", k=28, he_backend="native", threads=2, engine_process=ep,
                           kv_cache_bytes=64 << 20)
        app = create_app(cfg, half, TenantStore(tmp / "t.json"))
        engine, compute = app.state.engine, app.state.protected._compute
        engine.start()
        compute(op)
        ts = [compute(op) for _ in range(15)]
        print(f"{name}: {1e3 * statistics.median(ts):.2f} ms per NTT batch (median of 15)", flush=True)
        engine.stop()
    op()
    ts = [op() for _ in range(15)]
    print(f"the calling thread at 1 thread: {1e3 * statistics.median(ts):.2f} ms per NTT batch (median of 15)")

if __name__ == "__main__":
    main()
