"""The client's key file (``veil.client.key_file``): written owner-only and whole, refused where
others may read it or where any part is damaged; a client made again on it holds the same key
pair and uploads material that the server already knows by its id. And which keys a client
makes (``veil.client.keys.choose``)."""

import hashlib
import os
import stat

import pytest

from veil.client import VeilClient
from veil.client import key_file as kf
from veil.client.sdk import VeilError

NOWHERE = "http://127.0.0.1:9"  # nothing listens: these clients never reach a server


def _keys(material=b"public material " * 1000):
    return kf.ClientKeys("ckks-n16384-l7-v2", "native", "minimal", b"\x01\x00\xff" * 10, b"\x00\x01" * 7, material)


def test_a_key_file_is_written_owner_only_and_read_back_whole(tmp_path):
    path = tmp_path / "keys"
    umask = os.umask(0o022)  # a usual umask: the file must still be 0600
    try:
        kf.save(path, _keys())
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    back = kf.load(path)
    assert back == _keys() and back.keys_id == hashlib.sha256(_keys().material).hexdigest()
    kf.save(path, _keys(b"other"))  # replaced whole, still owner-only, no temporary file left
    assert kf.load(path).material == b"other" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["keys"]


def test_a_key_file_others_may_read_is_refused(tmp_path):
    path = tmp_path / "keys"
    kf.save(path, _keys())
    for mode in (0o640, 0o604, 0o660):
        path.chmod(mode)
        with pytest.raises(kf.KeyFileError, match="others may read it"):
            kf.load(path)
    path.chmod(0o400)
    assert kf.load(path) == _keys()


@pytest.mark.parametrize("damage", ["magic", "header_cut", "material_cut", "material_bit", "secret_bit",
                                    "version", "not_msgpack", "empty"])
def test_a_damaged_key_file_is_refused(tmp_path, damage):
    path = tmp_path / "keys"
    kf.save(path, _keys())
    data = bytearray(path.read_bytes())
    header_len = int.from_bytes(data[8:12], "little")
    secret_at = data.index(b"\x01\x00\xff" * 10)
    if damage == "magic":
        data[0] ^= 1
    elif damage == "header_cut":
        data = data[: 12 + header_len // 2]
    elif damage == "material_cut":
        data = data[:-1]
    elif damage == "material_bit":
        data[-5] ^= 4
    elif damage == "secret_bit":
        data[secret_at + 1] ^= 1  # still ternary bytes: only the digest tells
    elif damage == "version":
        data[data.index(b"\xa1v") + 2] = 2
    elif damage == "not_msgpack":
        data[12:12 + header_len] = b"\xc1" * header_len
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    path.chmod(0o600)
    with pytest.raises(kf.KeyFileError):
        kf.load(path)


def test_a_client_made_again_on_its_key_file_holds_the_same_keys(tmp_path, client_half):
    """The first client makes its keys (native, the minimal set: quick) and writes them; the
    second makes none: the same secret, the same material, and the material's id, which a
    server that holds them knows them by. A damaged file is a clear client error."""
    path = tmp_path / "keys"
    first = VeilClient(NOWHERE, "k", mode="protected", half=client_half, he_backend="native", key_set="minimal",
                       key_file=path)
    first.generate_keys(progress=False)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_file=path, he_backend="native")
    second.generate_keys(progress=False)
    assert second.he.export_secret() == first.he.export_secret()
    assert second._material == first._material and second.key_set == "minimal"
    assert second.ensure_keys() == hashlib.sha256(first._material).hexdigest()  # no upload: nowhere to go
    with pytest.raises(VeilError, match="holds native keys"):
        VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_file=path, he_backend="seal").generate_keys()
    with pytest.raises(VeilError, match="key set"):
        VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_file=path, he_backend="native",
                   key_set="full").generate_keys()
    path.chmod(0o644)
    with pytest.raises(VeilError, match="bad_key_file"):
        VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_file=path, he_backend="native").generate_keys()
    with pytest.raises(ValueError, match="protected"):
        VeilClient(NOWHERE, "k", half=client_half, key_file=path)
    for c in (first, second):
        c.http.close()


@pytest.fixture
def quick_scrypt(monkeypatch):
    """A cheaper scrypt for the tests that seal many files (the file records what it used, so
    reading follows); the SDK test below seals under the shipped cost."""
    monkeypatch.setattr(kf, "SCRYPT", {"n": 1 << 10, "r": 8, "p": 1})


def test_a_sealed_key_file_opens_only_with_its_passphrase(tmp_path, quick_scrypt):
    path, other = tmp_path / "keys", tmp_path / "again"
    kf.save(path, _keys(), "correct horse")
    kf.save(other, _keys(), "correct horse")
    data = path.read_bytes()
    assert _keys().secret not in data and _keys().fold_secret not in data
    assert data != other.read_bytes()  # a fresh salt and nonce per file
    assert kf.load(path, "correct horse") == _keys() == kf.load(other, b"correct horse")
    with pytest.raises(kf.PassphraseRequired):
        kf.load(path)
    with pytest.raises(kf.KeyFileError, match="wrong passphrase"):
        kf.load(path, "correct horsf")
    with pytest.raises(ValueError, match="empty passphrase"):
        kf.save(tmp_path / "empty", _keys(), "")
    kf.save(tmp_path / "open", _keys())  # a passphrase for a file that is not sealed is not needed
    assert kf.load(tmp_path / "open", "anything") == _keys()


@pytest.mark.parametrize("edit", ["key_set", "box", "nonce", "cost"])
def test_a_sealed_key_files_header_cannot_be_changed(tmp_path, quick_scrypt, edit):
    """The public fields are the seal's associated data: a header that says other keys (here the
    key set; the digests likewise) does not open; nor does a changed box or nonce; a cost beyond
    what this client runs is refused before any derivation."""
    path = tmp_path / "keys"
    kf.save(path, _keys(), "pw")
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[8:12], "little")
    import msgpack

    h = msgpack.unpackb(bytes(data[12:12 + n]))
    if edit == "key_set":
        h["key_set"] = "compact"
    elif edit == "box":
        h["sealed"]["box"] = bytes([h["sealed"]["box"][0] ^ 1]) + h["sealed"]["box"][1:]
    elif edit == "nonce":
        h["sealed"]["nonce"] = os.urandom(12)
    else:
        h["sealed"]["n"] = 1 << 24
    header = msgpack.packb(h)
    path.write_bytes(kf.MAGIC + len(header).to_bytes(4, "little") + header + bytes(data[12 + n:]))
    path.chmod(0o600)
    with pytest.raises(kf.KeyFileError, match="does not run" if edit == "cost" else "wrong passphrase"):
        kf.load(path, "pw")


def test_a_client_seals_its_key_file_with_a_passphrase(tmp_path, client_half):
    path = tmp_path / "keys"
    first = VeilClient(NOWHERE, "k", mode="protected", half=client_half, he_backend="native", key_set="minimal",
                       key_file=path, key_passphrase="s3cret words")
    first.generate_keys(progress=False)
    assert first.he.export_secret()[0] not in path.read_bytes()
    with pytest.raises(VeilError, match="key_passphrase_required"):
        VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_file=path, he_backend="native").generate_keys()
    with pytest.raises(VeilError, match="bad_key_file.*wrong passphrase"):
        VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_file=path, he_backend="native",
                   key_passphrase="other words").generate_keys()
    second = VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_file=path, he_backend="native",
                        key_passphrase="s3cret words")
    second.generate_keys(progress=False)
    assert second.he.export_secret() == first.he.export_secret() and second._material == first._material
    with pytest.raises(ValueError, match="key_file"):
        VeilClient(NOWHERE, "k", mode="protected", half=client_half, key_passphrase="x")
    for c in (first, second):
        c.http.close()


def test_the_cli_reads_the_passphrase_from_the_environment_or_asks_twice_for_a_new_file(monkeypatch, capsys):
    import getpass

    from veil.client import cli

    monkeypatch.setenv("VEIL_KEY_PASSPHRASE", "from env")
    assert cli._key_passphrase(new=True) == "from env"
    monkeypatch.delenv("VEIL_KEY_PASSPHRASE")
    typed = iter(["one", "two"])
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(typed))
    assert cli._key_passphrase(new=True) is None and "differ" in capsys.readouterr().err
    typed = iter(["one"])
    assert cli._key_passphrase(new=False) == "one"  # an existing file: asked once
    typed = iter([""])
    assert cli._key_passphrase(new=False) is None and "empty" in capsys.readouterr().err


def test_the_keys_a_client_makes_are_the_servers_unless_it_names_its_own():
    from veil.client import keys

    native = {"available": True, "he_backend": "native", "key_set": "full"}
    assert keys.choose(None, None, native) == ("native", "full")
    assert keys.choose("seal", "minimal", native) == ("seal", "minimal")
    assert keys.choose(None, None, {}) == ("seal", "full")  # a server that does not say
    assert keys.choose(None, None, {"he_backend": "seal", "key_set": "huge"}) == ("seal", "full")
    with pytest.raises(VeilError, match="unknown_backend"):
        keys.choose(None, None, {"he_backend": "openfhe"})
    with pytest.raises(VeilError, match="501 protected_unavailable: no layout"):
        keys.choose("native", "full", {"available": False, "reason": "no layout"})


def test_veil_keys_show_reads_the_header_only_and_warns_of_others_reading(tmp_path, quick_scrypt, capsys):
    import json

    from veil.cli.main import main

    path = tmp_path / "keys"
    kf.save(path, _keys(), "pw")
    assert main(["keys", "show", str(path)]) == 0  # sealed: shown without the passphrase
    out = capsys.readouterr()
    info = json.loads(out.out)
    assert info["keys_id"] == _keys().keys_id and info["sealed"] and info["key_set"] == "minimal"
    assert info["material_bytes"] == len(_keys().material) and info["mode"] == "600" and not out.err
    path.chmod(0o644)
    assert main(["keys", "show", str(path)]) == 0 and "others may read" in capsys.readouterr().err
    (tmp_path / "junk").write_bytes(b"junk")
    assert main(["keys", "show", str(tmp_path / "junk")]) == 1 and "not a Veil key file" in capsys.readouterr().err
    assert main(["keys", "forget", str(tmp_path / "junk"), "--server", NOWHERE, "--api-key", "k"]) == 1
    assert main(["keys", "forget", str(path), "--server", NOWHERE, "--api-key", "k", "--delete"]) == 1
    assert path.exists()  # the server could not be asked: the file stays


@pytest.mark.parametrize("status, body, dropped", [
    (204, None, True),
    (404, {"error": {"code": "keys_not_found", "message": "no such evaluation keys"}}, True),
    (404, {"detail": "Not Found"}, False),  # not Veil's answer (a wrong URL): nothing is known of the keys
    (409, {"error": {"code": "keys_in_use", "message": "1 open sessions use these keys"}}, False),
])
def test_veil_keys_forget_deletes_the_file_only_once_the_server_holds_no_keys(tmp_path, monkeypatch, status, body,
                                                                             dropped):
    """`veil keys forget --delete` decides by the server's answer alone; the server here is a
    stand-in for httpx.delete (a fake inside this CLI test only: the real DELETE is exercised in
    tests/test_protected_path.py)."""
    import httpx

    from veil.cli.main import main

    path = tmp_path / "keys"
    kf.save(path, _keys())
    asked = []

    def fake_delete(url, **kw):
        asked.append((url, kw["headers"]["Authorization"]))
        return httpx.Response(status, json=body) if body is not None else httpx.Response(status)

    monkeypatch.setattr(httpx, "delete", fake_delete)
    rc = main(["keys", "forget", str(path), "--server", "http://veil.example/", "--api-key", "k", "--delete"])
    assert asked == [(f"http://veil.example/v1/keys/{_keys().keys_id}", "Bearer k")]
    assert (rc == 0) is dropped and path.exists() is not dropped


def test_a_body_refused_while_the_server_is_busy_is_sent_again_whole(client_half):
    """429 server_busy (the server held too many other bodies and read none of this one): the
    SDK sends the request again after Retry-After, the key upload's pieces from their start. The
    server here is a stand-in transport (a fake inside this SDK test only; the server's side is
    tests/test_server_errors.py's)."""
    import httpx

    from veil.client.sdk import BUSY_RETRIES, _Pieces

    material = bytes(range(256)) * 9000  # 2.2 MiB: three pieces
    got = []

    def server(request: httpx.Request) -> httpx.Response:
        got.append(request.read())
        if len(got) < 3:
            return httpx.Response(429, headers={"Retry-After": "0"},
                                  json={"error": {"code": "server_busy", "message": "bodies held"}})
        return httpx.Response(201, json={"keys_id": "k"})

    c = VeilClient(NOWHERE, "k", half=client_half)
    c.http = httpx.Client(base_url=NOWHERE, transport=httpx.MockTransport(server))
    r = c._post("/v1/keys", content=_Pieces(material), headers={"Content-Length": str(len(material))}, retry=False)
    assert r.status_code == 201 and got == [material] * 3
    got.clear()
    c.http = httpx.Client(base_url=NOWHERE, transport=httpx.MockTransport(
        lambda request: httpx.Response(429, headers={"Retry-After": "0"},
                                       json={"error": {"code": "server_busy", "message": "bodies held"}})))
    with pytest.raises(VeilError, match="429 server_busy"):
        c._post("/v1/keys", content=b"x", retry=False)
    c.close()
    assert BUSY_RETRIES >= 3
