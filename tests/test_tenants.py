"""Tenants file, key hashing and the `veil tenants add` command."""

import json

import pytest

from veil.cli.main import main
from veil.server.tenants import TenantStore, hash_key


def test_keys_are_stored_hashed_and_authenticate(tmp_path):
    path = tmp_path / "tenants.json"
    store = TenantStore(path)
    key = store.add("acme", ["plaintext"])
    text = path.read_text()
    assert key not in text and hash_key(key) in text
    reloaded = TenantStore(path)
    t = reloaded.authenticate(key)
    assert t is not None and t.name == "acme" and t.scopes == {"plaintext"}
    assert reloaded.authenticate(key + "x") is None
    assert reloaded.authenticate("") is None
    assert (path.stat().st_mode & 0o077) == 0  # not readable by others


def test_bad_tenant_input_is_refused(tmp_path):
    store = TenantStore(tmp_path / "t.json")
    store.add("a", ["protected"])
    with pytest.raises(ValueError):
        store.add("a", ["plaintext"])
    with pytest.raises(ValueError):
        store.add("b", ["root"])
    with pytest.raises(ValueError):
        store.add("bad name", ["plaintext"])


def test_cli_prints_the_key_alone(tmp_path, capsys):
    f = tmp_path / "tenants.json"
    assert main(["tenants", "add", "acme", "--scope", "plaintext", "--scope", "protected", "--file", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    key = out.strip()
    assert key.startswith("veil_") and len(key) > 40
    rec = json.loads(f.read_text())["tenants"]["acme"]
    assert rec["key_sha256"] == hash_key(key) and rec["scopes"] == ["plaintext", "protected"]
    assert main(["tenants", "add", "acme", "--scope", "plaintext", "--file", str(f)]) == 2
