"""The client's key file: one protected client's key pair and the public material it uploads,
kept between processes. A client started again with the same file makes no new keys and, while
the server still holds the evaluation keys from an earlier upload (``key_ttl_s`` after their
last session), uploads nothing either: the key generation and the upload of the whole
evaluation key set are saved per start (measured in benchmarks/results/2026-12-05-key-file/).

The file holds the secret key. It is written owner-only (mode 0600, then renamed into place,
so no reader sees half a file) and refused where others may read it, as ssh refuses a private
key; anyone who can read it can decrypt every conversation held under it. The secret still
never goes on the wire. Layout: ``MAGIC``, a 4-byte header length, the msgpack header (what
the keys are for, the secret, the material's length and SHA-256: the keys' id on the server),
then the material's bytes as uploaded.

With a passphrase the two secrets are sealed instead of stored: AES-256-GCM under a key that
scrypt derives from the passphrase and a random salt, the header's public fields bound as
associated data, so a file copied off the machine does not give the keys away by itself and
a header edited to say other keys is refused. Salt and nonce come from the OS CSPRNG.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

MAGIC = b"VEILKEYS"
VERSION = 1
_HEADER_MAX = 1 << 22  # a header is a few MB at most (SEAL's secret key is ~0.9 MB)
# scrypt's cost for a new sealed file: 128 MiB and a few tenths of a second, RFC 7914's
# interactive-login order of cost scaled to today's memory; a file may name its own, up to
# _SCRYPT_MAX (what reading one may ask of this process)
SCRYPT = {"n": 1 << 17, "r": 8, "p": 1}
_SCRYPT_MAX = {"n": 1 << 20, "r": 16, "p": 4}


class KeyFileError(ValueError):
    """A key file that cannot be used: unreadable, malformed, damaged, readable by others, or
    sealed under another passphrase."""


class PassphraseRequired(KeyFileError):
    """The key file's secrets are sealed with a passphrase and none was given."""


@dataclass(frozen=True)
class ClientKeys:
    param_set: str
    he_backend: str
    key_set: str
    secret: bytes  # HEBackend.export_secret()'s two parts
    fold_secret: bytes
    material: bytes  # the public material as uploaded (public_material_to_bytes)

    @property
    def keys_id(self) -> str:
        """The id the server gives these keys (SHA-256 of the uploaded bytes)."""
        return hashlib.sha256(self.material).hexdigest()


def save(path: str | Path, keys: ClientKeys, passphrase: str | bytes | None = None) -> None:
    """Write ``keys`` to ``path`` owner-only, replacing what was there only once all is written;
    with a ``passphrase``, the secrets sealed under it."""
    path = Path(path)
    public = {"v": VERSION, "param_set": keys.param_set, "he_backend": keys.he_backend, "key_set": keys.key_set,
              "secret_sha256": _secret_digest(keys), "material_len": len(keys.material),
              "material_sha256": keys.keys_id}
    if passphrase is None:
        secrets_ = {"secret": keys.secret, "fold_secret": keys.fold_secret}
    else:
        kdf = {**SCRYPT, "salt": os.urandom(16)}
        nonce = os.urandom(12)
        box = AESGCM(_derive(_passphrase_bytes(passphrase), kdf)).encrypt(
            nonce, msgpack.packb([keys.secret, keys.fold_secret]), _bound(public))
        secrets_ = {"sealed": {**kdf, "nonce": nonce, "box": box}}
    header = msgpack.packb({**public, **secrets_})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            f.write(keys.material)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: str | Path, passphrase: str | bytes | None = None) -> ClientKeys:
    """The keys in ``path``; ``KeyFileError`` where it is readable by group or others, or is not
    a whole, undamaged key file; ``PassphraseRequired`` where it is sealed and no ``passphrase``
    is given (one given for a file that is not sealed is not needed)."""
    path = Path(path)
    mode, h, material = _read(path, with_material=True)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{path} holds a secret key and others may read it (mode "
                           f"{stat.S_IMODE(mode):o}); chmod 600 it, or make new keys")
    if "sealed" in h:
        secret, fold = _unseal(path, h, passphrase)
    elif isinstance(h.get("secret"), bytes) and isinstance(h.get("fold_secret"), bytes):
        secret, fold = h["secret"], h["fold_secret"]
    else:
        raise KeyFileError(f"{path}: malformed header")
    keys = ClientKeys(h["param_set"], h["he_backend"], h["key_set"], secret, fold, material)
    if _secret_digest(keys) != h["secret_sha256"]:
        raise KeyFileError(f"{path}: the secret key is damaged")
    if len(material) != h["material_len"] or keys.keys_id != h["material_sha256"]:
        raise KeyFileError(f"{path}: the public material is damaged or cut short")
    return keys


def describe(path: str | Path) -> dict:
    """What the header says of the keys in ``path``, no secret read or opened (``veil keys
    show``): the keys' id on a server, what they are for, whether sealed, and the file's mode."""
    path = Path(path)
    mode, h, _ = _read(path, with_material=False)
    return {"keys_id": h["material_sha256"], "param_set": h["param_set"], "he_backend": h["he_backend"],
            "key_set": h["key_set"], "material_bytes": h["material_len"], "sealed": "sealed" in h,
            "mode": f"{stat.S_IMODE(mode):o}", "others_may_read": bool(mode & (stat.S_IRWXG | stat.S_IRWXO))}


def _read(path: Path, with_material: bool) -> tuple[int, dict, bytes | None]:
    """The file's mode, its header (its public fields typed, its version this one) and, where
    asked, the material's bytes."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            head = f.read(len(MAGIC) + 4)
            if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
                raise KeyFileError(f"{path} is not a Veil key file")
            (n,) = struct.unpack_from("<I", head, len(MAGIC))
            header = f.read(n) if n <= _HEADER_MAX else b""
            if len(header) != n:
                raise KeyFileError(f"{path}: the header is cut short")
            # read apart from the header: the material is large, read once
            material = f.read() if with_material else None
    except OSError as e:
        raise KeyFileError(f"cannot read {path}: {e}") from None
    try:
        h = msgpack.unpackb(header)
    except (ValueError, msgpack.UnpackException) as e:
        raise KeyFileError(f"{path}: malformed header: {e}") from None
    fields = {"v": int, "param_set": str, "he_backend": str, "key_set": str, "secret_sha256": str,
              "material_len": int, "material_sha256": str}
    if not isinstance(h, dict) or any(not isinstance(h.get(k), t) for k, t in fields.items()):
        raise KeyFileError(f"{path}: malformed header")
    if h["v"] != VERSION:
        raise KeyFileError(f"{path}: key file version {h['v']}, this client reads {VERSION}")
    return mode, h, material


def _secret_digest(keys: ClientKeys) -> str:
    """A damaged secret can still parse (a native one is any ternary bytes): its digest tells."""
    return hashlib.sha256(len(keys.secret).to_bytes(8, "little") + keys.secret + keys.fold_secret).hexdigest()


def _unseal(path: Path, h: dict, passphrase: str | bytes | None) -> tuple[bytes, bytes]:
    """The two secrets of a sealed header, opened with ``passphrase``."""
    if passphrase is None:
        raise PassphraseRequired(f"{path} is sealed with a passphrase: give it to read the keys")
    sealed = h["sealed"]
    types = {"n": int, "r": int, "p": int, "salt": bytes, "nonce": bytes, "box": bytes}
    if not isinstance(sealed, dict) or any(not isinstance(sealed.get(k), t) for k, t in types.items()):
        raise KeyFileError(f"{path}: malformed header")
    n, r, p = sealed["n"], sealed["r"], sealed["p"]
    if not (2 <= n <= _SCRYPT_MAX["n"] and n & (n - 1) == 0 and 1 <= r <= _SCRYPT_MAX["r"]
            and 1 <= p <= _SCRYPT_MAX["p"]) or len(sealed["nonce"]) != 12 or len(sealed["salt"]) < 16:
        raise KeyFileError(f"{path}: the sealed secrets name a key derivation this client does not run "
                           f"(scrypt n={n}, r={r}, p={p})")
    public = {k: h[k] for k in ("v", "param_set", "he_backend", "key_set", "secret_sha256", "material_len",
                                "material_sha256")}
    try:
        opened = AESGCM(_derive(_passphrase_bytes(passphrase), sealed)).decrypt(sealed["nonce"], sealed["box"],
                                                                                  _bound(public))
    except InvalidTag:
        raise KeyFileError(f"{path}: wrong passphrase, or the sealed secrets or the header were changed") from None
    secret, fold = msgpack.unpackb(opened)
    return secret, fold


def _passphrase_bytes(passphrase: str | bytes) -> bytes:
    data = passphrase.encode() if isinstance(passphrase, str) else bytes(passphrase)
    if not data:
        raise ValueError("an empty passphrase seals nothing: give none, or a real one")
    return data


def _derive(passphrase: bytes, kdf: dict) -> bytes:
    return Scrypt(salt=kdf["salt"], length=32, n=kdf["n"], r=kdf["r"], p=kdf["p"]).derive(passphrase)


def _bound(public: dict) -> bytes:
    """The header's public fields as the seal's associated data (msgpack keeps the key order)."""
    return msgpack.packb([public[k] for k in sorted(public)])
