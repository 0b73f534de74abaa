"""`veil serve` and `veil tenants add`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from veil.cluster.launch import ClusterConfig
    from veil.crypto.backend import server_backend_choices
    from veil.server.config import ServerConfig as C  # the defaults below are its field defaults

    gb = 1 << 30
    p = sub.add_parser("serve", help="run the Veil server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--tenants", type=Path, required=True, help="tenants file (veil tenants add)")
    p.add_argument("--k", type=int, default=C.k, help="split point when no bundle is given")
    p.add_argument("--bundle", type=Path, help="server bundle directory (veil split)")
    p.add_argument("--model", help="a .gguf file or HF checkpoint dir to split instead of the default")
    p.add_argument("--session-ttl", type=float, default=C.session_ttl_s, help="idle session TTL in seconds")
    p.add_argument("--session-evict-idle", type=float, default=C.session_evict_idle_s, metavar="S",
                   help="where a session limit (--max-protected-sessions, per tenant) or the protected KV "
                        "cache's total is reached, a session idle for S seconds gives its place up, least "
                        "recently used first; its client opens a new session on its next turn (negative: "
                        "never, the new session or step gets 429)")
    p.add_argument("--key-ttl", type=float, default=C.key_ttl_s,
                   help="seconds an evaluation-key set no session uses is kept (its client uploads it again)")
    p.add_argument("--device", default=C.device, choices=["cpu", "cuda"],
                   help="the device of the engine (fast path and split sessions) and, with the native HE backend, "
                        "of the protected path")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="weights dtype (default: bfloat16 on CUDA, float32 on CPU; the KV cache follows the "
                        "weights where bf16 is fast: CUDA, CPUs with AMX-BF16, and CPUs with AVX512-BF16 where the C "
                        "kernels run; float32 elsewhere)")
    p.add_argument("--threads", type=int,
                   help="torch intra-op threads of the engine loop (default: torch's, i.e. the cores or "
                        "OMP_NUM_THREADS; on the 2-core development VM 2 threads served the engine_throughput "
                        "workload 1.31x faster than 1, with its load generator on the same cores)")
    p.add_argument("--engine-process", action="store_true",
                   help="run the engine loop in a process of its own, so that it does not share one GIL with "
                        "the HTTP event loop (streamed 0.69-0.78x of the engine driven directly on tiny models "
                        "in one process); the protected path then computes in the server's process")
    p.add_argument("--kv-cache-gb", type=float, default=C.kv_cache_bytes / gb, help="memory budget of the paged KV pool")
    p.add_argument("--max-tokens-per-step", type=int, default=C.max_tokens_per_step,
                   help="token budget of one engine iteration")
    p.add_argument("--max-seqs-per-step", type=int,
                   help="sequences of one engine iteration, and the largest CUDA-graph batch (default: 256 on "
                        "CUDA, where a decode step of 256 sequences took 3.17 ms against 2.61 ms for 64 on an "
                        "H100, 64 on CPU)")
    p.add_argument("--max-context", type=int, default=C.max_context, help="tokens per session or request (413 above)")
    p.add_argument("--he-backend", default=C.he_backend, choices=server_backend_choices(),
                   help="HE backend of the protected path (auto: native on CUDA and where its C kernels build, "
                        "else seal)")
    p.add_argument("--max-protected-sessions", type=int, default=C.max_protected_sessions,
                   help="concurrent protected (CKKS) sessions")
    p.add_argument("--protected-device-gb", type=float, default=None,
                   help="memory the protected path may hold on its device (encoded weights, imported "
                        "evaluation keys and the first layer's shuffled FFN of the steps in flight); a key "
                        "upload or step beyond it is refused with 429 (default: no bound)")
    p.add_argument("--protected-warmup", action="store_true",
                   help="encode the protected path's weights at start (in the background; /health says when "
                        "they are ready) instead of when the first protected session opens; on the CPU, also grow the "
                        "heap there by what the first prompt's span takes (it would fault those pages in)")
    p.add_argument("--protected-max-batch", type=int, default=C.protected_max_batch,
                   help="protected steps of different sessions evaluated as one batch (native backend)")
    p.add_argument("--protected-batch-wait-ms", type=float, default=C.protected_batch_wait_ms,
                   help="how long the oldest protected step waits for other sessions to join its batch")
    p.add_argument("--protected-kv-gb", type=float, default=C.max_protected_kv_bytes / gb,
                   help="encrypted KV cache budget of one protected session")
    p.add_argument("--protected-kv-total-gb", type=float, default=C.max_protected_kv_bytes_total / gb,
                   help="encrypted KV cache budget of all protected sessions together")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="run N engine replicas on Ray Serve behind one HTTP ingress, on a local Ray cluster "
                        "(needs the cluster extra: pip install -e '.[cluster]'); without it: one process")
    p.add_argument("--ray-address", help="with --replicas: join this Ray cluster instead of starting one")
    p.add_argument("--replica-cpus", type=float, default=ClusterConfig.replica_cpus,
                   help="with --replicas: CPUs Ray reserves per replica (and its torch threads unless --threads)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--tls-self-signed", type=Path, metavar="DIR",
                   help="development only: make a self-signed cert.pem/key.pem in DIR and serve TLS with it")
    p.set_defaults(func=cmd_serve)

    t = sub.add_parser("tenants", help="manage tenants")
    tsub = t.add_subparsers(dest="tenants_cmd", required=True)
    a = tsub.add_parser("add", help="add a tenant; prints its new API key, alone, on stdout")
    a.add_argument("name")
    a.add_argument("--scope", action="append", required=True, choices=["plaintext", "protected"])
    a.add_argument("--file", type=Path, required=True)
    a.set_defaults(func=cmd_tenants_add)


def cmd_tenants_add(args) -> int:
    from veil.server.tenants import TenantStore

    try:
        key = TenantStore(args.file).add(args.name, args.scope)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(key)
    return 0


def cmd_serve(args) -> int:
    import torch

    from veil.engine.loader import load_checkpoint
    from veil.engine.split import load_server_half, server_half_from
    from veil.server.app import create_app
    from veil.server.config import ServerConfig
    from veil.server.runner import serve_forever
    from veil.server.tenants import TenantStore

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    threads = args.threads or torch.get_num_threads()  # torch's default: the cores, or OMP_NUM_THREADS
    torch.set_num_threads(1)  # this thread loads the model; the engine loop owns the threads (EngineConfig.threads)
    if args.tls_self_signed:
        from veil.server.tls import make_self_signed

        cert, key = make_self_signed(args.tls_self_signed, (args.host, "localhost"))
        args.tls_cert, args.tls_key = str(cert), str(key)
        print(f"self-signed certificate for {args.host}: {cert} (clients: --cacert {cert})", file=sys.stderr)
    if bool(args.tls_cert) != bool(args.tls_key):
        print("error: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if 0 <= args.session_evict_idle < 1:
        print("error: --session-evict-idle takes at least 1 s (negative: never)", file=sys.stderr)
        return 2
    cfg = ServerConfig(tenants_file=args.tenants, k=args.k, bundle=args.bundle, model=args.model,
                       session_ttl_s=args.session_ttl,
                       session_evict_idle_s=None if args.session_evict_idle < 0 else args.session_evict_idle,
                       key_ttl_s=args.key_ttl, max_context=args.max_context,
                       kv_cache_bytes=int(args.kv_cache_gb * (1 << 30)),
                       max_tokens_per_step=args.max_tokens_per_step, max_seqs_per_step=args.max_seqs_per_step,
                       he_backend=args.he_backend,
                       max_protected_sessions=args.max_protected_sessions,
                       protected_max_batch=args.protected_max_batch,
                       protected_device_bytes=None if args.protected_device_gb is None
                       else int(args.protected_device_gb * (1 << 30)),
                       protected_batch_wait_ms=args.protected_batch_wait_ms,
                       protected_warmup=args.protected_warmup,
                       max_protected_kv_bytes=int(args.protected_kv_gb * (1 << 30)),
                       max_protected_kv_bytes_total=int(args.protected_kv_total_gb * (1 << 30)),
                       device=args.device, dtype=args.dtype,
                       threads=threads, engine_process=args.engine_process)
    if args.replicas is not None:
        from veil.cluster.launch import cmd_serve_cluster

        return cmd_serve_cluster(args, cfg)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model_dtype]
    if args.bundle:
        half = load_server_half(args.bundle, dtype=dtype)
    else:  # the whole model: split sessions and the OpenAI-compatible fast path
        half = server_half_from(load_checkpoint(args.model), args.k, full=True, dtype=dtype)
    print(f"serving {half.config.name} layers [{half.k}, {half.config.num_layers}) "
          f"fingerprint {half.fingerprint[:16]}…", file=sys.stderr)
    serve_forever(create_app(cfg, half, TenantStore(args.tenants)), args.host, args.port, args.tls_cert, args.tls_key)
    return 0
