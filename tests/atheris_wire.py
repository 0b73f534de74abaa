"""Coverage-guided fuzzing of the wire decoders and the ciphertext parser with atheris.

    .venv/bin/pip install atheris          # not a project dependency
    .venv/bin/python tests/atheris_wire.py -runs=1000000 [-max_len=4096] [corpus_dir]

Each input goes to every decoder (plaintext split step and reply, protected message, public
material) and to the SEAL ciphertext parser (test-only N=8192 set). Any exception other than
the decoders' own validation errors (WireError, CiphertextError) is a finding: atheris stops
and writes the input to crash-*. Not collected by pytest (the CI runs the hypothesis fuzzers in
tests/test_fuzz_wire.py).
"""

import sys

import atheris

with atheris.instrument_imports():
    from veil.crypto.backend import CiphertextError
    from veil.crypto.params import TEST_PARAMS_ID, get_params
    from veil.crypto.seal.backend import SealBackend
    from veil.crypto.wire import HiddenReply, HiddenStep, WireError
    from veil.protected.protocol import ProtectedMessage, public_material_from_bytes

SERVER = SealBackend(get_params(TEST_PARAMS_ID, allow_test_params=True))


def one_input(data: bytes) -> None:
    for decode in (
        lambda b: HiddenStep.from_bytes(b, max_bytes=1 << 16, hidden_size=8, max_tokens=16),
        lambda b: HiddenReply.from_bytes(b, max_bytes=1 << 16),
        lambda b: ProtectedMessage.from_bytes(b, max_bytes=1 << 16),
        lambda b: public_material_from_bytes(b, max_bytes=1 << 16),
    ):
        try:
            decode(data)
        except WireError:
            pass
    try:
        SERVER.deserialize(data)
    except CiphertextError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
