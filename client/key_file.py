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
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import msgpack

MAGIC = b"VEILKEYS"
VERSION = 1
_HEADER_MAX = 1 << 22  # a header is a few MB at most (SEAL's secret key is ~0.9 MB)


class KeyFileError(ValueError):
    """A key file that cannot be used: unreadable, malformed, damaged or readable by others."""


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


def save(path: str | Path, keys: ClientKeys) -> None:
    """Write ``keys`` to ``path`` owner-only, replacing what was there only once all is written."""
    path = Path(path)
    header = msgpack.packb({"v": VERSION, "param_set": keys.param_set, "he_backend": keys.he_backend,
                            "key_set": keys.key_set, "secret": keys.secret, "fold_secret": keys.fold_secret,
                            "secret_sha256": _secret_digest(keys), "material_len": len(keys.material),
                            "material_sha256": keys.keys_id})
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


def load(path: str | Path) -> ClientKeys:
    """The keys in ``path``; ``KeyFileError`` where it is readable by group or others, or is not
    a whole, undamaged key file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise KeyFileError(f"{path} holds a secret key and others may read it (mode "
                                   f"{stat.S_IMODE(mode):o}); chmod 600 it, or make new keys")
            head = f.read(len(MAGIC) + 4)
            if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
                raise KeyFileError(f"{path} is not a Veil key file")
            (n,) = struct.unpack_from("<I", head, len(MAGIC))
            header = f.read(n) if n <= _HEADER_MAX else b""
            if len(header) != n:
                raise KeyFileError(f"{path}: the header is cut short")
            material = f.read()  # read apart from the header: the material is large, read once
    except OSError as e:
        raise KeyFileError(f"cannot read {path}: {e}") from None
    try:
        h = msgpack.unpackb(header)
    except (ValueError, msgpack.UnpackException) as e:
        raise KeyFileError(f"{path}: malformed header: {e}") from None
    fields = {"v": int, "param_set": str, "he_backend": str, "key_set": str, "secret": bytes,
              "fold_secret": bytes, "secret_sha256": str, "material_len": int, "material_sha256": str}
    if not isinstance(h, dict) or any(not isinstance(h.get(k), t) for k, t in fields.items()):
        raise KeyFileError(f"{path}: malformed header")
    if h["v"] != VERSION:
        raise KeyFileError(f"{path}: key file version {h['v']}, this client reads {VERSION}")
    keys = ClientKeys(h["param_set"], h["he_backend"], h["key_set"], h["secret"], h["fold_secret"], material)
    if _secret_digest(keys) != h["secret_sha256"]:
        raise KeyFileError(f"{path}: the secret key is damaged")
    if len(material) != h["material_len"] or keys.keys_id != h["material_sha256"]:
        raise KeyFileError(f"{path}: the public material is damaged or cut short")
    return keys


def _secret_digest(keys: ClientKeys) -> str:
    """A damaged secret can still parse (a native one is any ternary bytes): its digest tells."""
    return hashlib.sha256(len(keys.secret).to_bytes(8, "little") + keys.secret + keys.fold_secret).hexdigest()
