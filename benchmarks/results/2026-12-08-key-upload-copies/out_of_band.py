"""A 500 MB body passed to a Ray actor inside a `Forwarded`: the sender's peak RSS with the body
out of band (Forwarded.__reduce_ex__) and in band (the method deleted: Python's default).

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/results/2026-12-08-key-upload-copies/out_of_band.py bytes [inband]

Prints VmHWM and VmRSS after the body is made, after the `Forwarded` is made, and after the call."""
import os
import sys

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
import ray  # noqa: E402

from veil.cluster.asgi import Forwarded  # noqa: E402

ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")


@ray.remote
class A:
    def f(self, req):
        return type(req.body).__name__, len(req.body)


def hwm():
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM", "VmRSS")):
            print(line.strip(), end="  ")
    print()


a = A.remote()
ray.get(a.f.remote(Forwarded("GET", "/", b"", (), b"x", None)))
body = bytearray(500 << 20)
body[::4096] = b"\x01" * len(body[::4096])  # every page touched
hwm()
mode = sys.argv[1]
if len(sys.argv) > 2:
    del Forwarded.__reduce_ex__
req = Forwarded("POST", "/v1/keys", b"", (), body if mode == "ba" else bytes(body), None)
if mode != "ba":
    del body
hwm()
print(ray.get(a.f.remote(req)))
hwm()
