"""A protected client's CKKS keys: which set to make (what the server's ``/health`` asks for),
made in this process, or read from the tenant's key file (``veil.client.key_file``) and checked
against what the server computes on. The secret key stays in the returned backend, in this
process; ``material`` is the public part, as uploaded."""

from __future__ import annotations

from pathlib import Path

import httpx

from veil.client import key_file
from veil.client.sessions import VeilError
from veil.crypto.backend import HEBackend, KeyMaterialError, backend_names, make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.key_levels import KEY_SETS, relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.protocol import public_material_to_bytes


def server_protected_info(http: httpx.Client) -> dict:
    """What the server's ``/health`` says of its protected path: ``he_backend`` (the keys'
    format) and ``key_set`` (the set that suits that backend). A server that does not say, or
    cannot be asked, gets SEAL keys of the full set, which every server version accepts."""
    try:
        r = http.get("/health")
        info = r.json().get("protected") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        info = None
    return info if isinstance(info, dict) else {}


def choose(he_backend: str | None, key_set: str | None, server: dict) -> tuple[str, str]:
    """The backend and key set to make keys for: the caller's where given, else the server's."""
    if server.get("available") is False:  # no keys to make: say why before spending on them
        raise VeilError(501, "protected_unavailable", server.get("reason", "the server has no protected path"))
    if he_backend is None:
        he_backend = server.get("he_backend", "seal")
        if he_backend not in backend_names():
            raise VeilError(400, "unknown_backend", f"the server computes on {he_backend!r}, "
                                                    f"this client has {backend_names()}")
    if key_set is None:
        key_set = server.get("key_set") if server.get("key_set") in KEY_SETS else "full"
    return he_backend, key_set


def make(cfg, he_backend: str, key_set: str, progress: bool = True) -> tuple[HEBackend, bytes]:
    """A fresh key pair (randomness from the OS CSPRNG) and the public material the server's
    layouts need, each key for its levels, as uploaded."""
    from tqdm.auto import tqdm

    steps = rotation_key_levels(dims_of(cfg, PROTECTED_PARAMS.slot_count), key_set=key_set)
    with tqdm(total=3, desc="CKKS keys", unit="phase", disable=not progress) as bar:
        bar.set_postfix_str(f"secret + public key, {len(steps)} Galois keys ({PROTECTED_PARAMS.id})")
        he = make_backend(PROTECTED_PARAMS, he_backend)
        he.generate_keys(steps, relin_key_level())
        bar.update()
        material = he.export_public_material()  # relin + Galois keys are made here
        bar.update()
        data = public_material_to_bytes(material)
        bar.update()
    return he, data


def save(path: Path, he: HEBackend, key_set: str, material: bytes, passphrase: str | bytes | None) -> None:
    secret, fold = he.export_secret()
    key_file.save(path, key_file.ClientKeys(PROTECTED_PARAMS.id, he.name, key_set, secret, fold, material),
                  passphrase)


def load(path: Path, passphrase: str | bytes | None, he_backend: str | None,
         key_set: str | None) -> tuple[HEBackend, key_file.ClientKeys]:
    """The key pair of ``path`` in a backend, and the file's keys; ``he_backend`` / ``key_set``:
    what this client must compute with (given, or the server's; None: not known), which the
    file must hold. Every refusal is a client error (400) that names the file."""
    try:
        keys = key_file.load(path, passphrase)
    except key_file.PassphraseRequired as e:
        raise VeilError(400, "key_passphrase_required", f"{e} (key_passphrase=, veil chat --key-passphrase)") from None
    except key_file.KeyFileError as e:
        raise VeilError(400, "bad_key_file", str(e)) from None
    if keys.param_set != PROTECTED_PARAMS.id:
        raise VeilError(400, "bad_key_file", f"{path} holds keys of {keys.param_set!r}, "
                                             f"this client uses {PROTECTED_PARAMS.id!r}")
    if he_backend is not None and he_backend != keys.he_backend:
        raise VeilError(400, "bad_key_file", f"{path} holds {keys.he_backend} keys and the server "
                                             f"computes on {he_backend!r}: use another key file")
    if key_set is not None and key_set != keys.key_set:
        raise VeilError(400, "bad_key_file", f"{path} holds the {keys.key_set!r} key set, not {key_set!r}")
    he = make_backend(PROTECTED_PARAMS, keys.he_backend)
    try:
        he.import_secret(keys.secret, keys.fold_secret)
    except KeyMaterialError as e:
        raise VeilError(400, "bad_key_file", f"{path}: {e}") from None
    return he, keys
