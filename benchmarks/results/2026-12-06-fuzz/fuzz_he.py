"""Exploratory mutation fuzzing of what a server parses from a client: ciphertexts and key
material, native and SEAL, on the test parameter set. Expected refusals: CiphertextError /
KeyMaterialError / WireError (ValueErrors the API turns into 400). Anything else is a finding."""
import random, sys, time, traceback, collections
import numpy as np
from veil.crypto.backend import make_backend, CiphertextError, KeyMaterialError
from veil.crypto.params import TEST_PARAMS
from veil.crypto.wire import WireError
from veil.protected.protocol import public_material_from_bytes, public_material_to_bytes

which = sys.argv[1]; budget = float(sys.argv[2]); seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
rng = random.Random(seed)  # fuzzing positions, not key material

def mutate(b: bytes) -> bytes:
    b = bytearray(b)
    for _ in range(rng.choice([1, 1, 2, 4, 16])):
        op = rng.randrange(7)
        head = min(len(b), 96)
        pos = rng.randrange(head) if (rng.random() < 0.7 and head) else (rng.randrange(len(b)) if b else 0)
        if op == 0 and b: b[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and b: b[pos] = rng.choice([0, 0xff, 0x7f, 0x80, rng.randrange(256)])
        elif op == 2: del b[rng.randrange(len(b) + 1):]
        elif op == 3: b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 4, 8])))
        elif op == 4 and b: del b[pos:pos + rng.choice([1, 2, 4, 8])]
        elif op == 5 and len(b) >= 8: b[pos:pos + 8] = rng.choice([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff", b"\x00\x00\x00\x00\x00\x00\xf0\x7f"])
        elif op == 6 and b: b[pos:pos + 4] = rng.randrange(1 << 32).to_bytes(4, "little")
    return bytes(b)

findings = collections.Counter(); examples = {}
def run(fn, blob):
    try:
        fn(blob)
    except (CiphertextError, KeyMaterialError, WireError):
        return
    except Exception as e:
        k = f"{type(e).__name__}: {str(e)[:120]}"
        if k not in examples:
            examples[k] = (blob[:200], traceback.format_exc()[-1500:])
        findings[k] += 1

for name in which.split(","):
    client = make_backend(TEST_PARAMS, name, allow_test_backends=True)
    client.generate_keys([1, 2, 3, 4, -1], relin=True) if "relin" in client.generate_keys.__code__.co_varnames else client.generate_keys([1, 2, 3, 4, -1])
    mat = client.export_public_material()
    upload = public_material_to_bytes(mat)
    x = np.linspace(-1, 1, 100)
    cts = [client.encrypt_to_bytes(x), client.encrypt_to_bytes(x, level=1)]
    server = make_backend(TEST_PARAMS, name, allow_test_backends=True)
    server.import_public_material(mat)
    ct = server.deserialize(cts[0])
    rounded = [server.serialize(ct, noise_log2=20), server.serialize(server.rescale(server.multiply_plain(ct, server.encode(x), rescale=False)), noise_log2=10)]
    def parse_ct(b):
        for lv in (None, 0, 1, 2):
            server.deserialize(b, level=lv)
    def parse_rounded_client(b):
        client.decrypt(client.deserialize(b))
    def import_keys(b):
        m = public_material_from_bytes(b, max_bytes=len(b) + 16)
        be = make_backend(TEST_PARAMS, name, allow_test_backends=True)
        try:
            m.key_levels(TEST_PARAMS.top_level)
        except (TypeError, ValueError):
            return
        be.import_public_material(m)
    def import_blobs(b):  # a mutated blob inside a well-formed map
        import dataclasses
        field = rng.choice(["public_key", "relin_keys", "galois_keys", "fold_key"])
        m = dataclasses.replace(mat, **{field: mutate(getattr(mat, field))})
        make_backend(TEST_PARAMS, name, allow_test_backends=True).import_public_material(m)
    t0 = time.time(); n = collections.Counter()
    targets = [("ct", parse_ct, cts), ("rounded", parse_ct, rounded), ("client_rounded", parse_rounded_client, rounded),
               ("keys_map", import_keys, [upload]), ("keys_blob", import_blobs, [upload])]
    while time.time() - t0 < budget:
        label, fn, seeds = rng.choice(targets)
        run(fn, mutate(rng.choice(seeds)) if label != "keys_blob" else b"")
        n[label] += 1
    print(name, dict(n), flush=True)
for k, c in findings.most_common():
    print(f"FINDING x{c}: {k}")
    print(examples[k][1])
print("findings", len(findings))
