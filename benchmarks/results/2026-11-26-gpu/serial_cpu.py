"""Native wire packing on the 2-core CPU: e561dd8's torch bit ops per limb against numpy's bit
(un)packing, a ciphertext of 2 polynomials x 8 limbs at N=16384 (mean of 10 after one warm call).
Run from the repository root: git show e561dd8:crypto/native/serial.py > /tmp/old_serial.py &&
sed -i 's/^from veil.crypto.native.sampling import SEED_BYTES/SEED_BYTES = 32/' /tmp/old_serial.py &&
python benchmarks/results/2026-11-26-gpu/serial_cpu.py"""
import importlib.util
import time

import torch

from veil.crypto.native import serial
from veil.crypto.params import PROTECTED_PARAMS as P

spec = importlib.util.spec_from_file_location("old_serial", "/tmp/old_serial.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
primes, n = P.primes[:8], P.poly_modulus_degree
x = torch.stack([torch.stack([torch.randint(0, q, (n,), dtype=torch.int64) for q in primes]) for _ in range(2)])
assert old.pack(x, primes) == serial.pack(x, primes)
b = serial.pack(x, primes)
assert torch.equal(old.unpack(b, 2, primes, n, torch.device("cpu")), serial.unpack(b, 2, primes, n, torch.device("cpu")))
print("formats identical")
for mod, name in ((old, "old"), (serial, "new")):
    for f, op in ((lambda: mod.pack(x, primes), "pack"), (lambda: mod.unpack(b, 2, primes, n, torch.device("cpu")), "unpack")):
        f()
        t = time.perf_counter()
        for _ in range(10):
            f()
        print(name, op, f"{(time.perf_counter() - t) / 10 * 1e3:.2f} ms")
