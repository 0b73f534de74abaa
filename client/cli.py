"""`veil chat`: stream a chat completion from a Veil server through the client SDK."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from veil.crypto.backend import backend_names

    p = sub.add_parser("chat", help="chat with a Veil server through the client SDK")
    p.add_argument("--server", required=True, help="server URL, e.g. https://provider:8443")
    p.add_argument("--api-key", required=True)
    p.add_argument("--mode", default="plaintext", choices=["plaintext", "protected"],
                   help="protected: CKKS split inference (docs/PROTOCOL.md); the server runs its layers on ciphertexts")
    p.add_argument("--he-backend", default=None, choices=backend_names(),
                   help="protected: the HE backend that holds this client's keys (default: the server's, from /health)")
    p.add_argument("--speculate", type=int, default=0, metavar="N",
                   help="protected: draft N tokens per decode step by prompt lookup and verify them in one step")
    p.add_argument("--keys", choices=["auto", "full", "compact", "minimal"], default="auto",
                   help="protected: the evaluation-key set (docs/PROTOCOL.md, \"Keys\"): compact has fewer bytes "
                        "than full and the server chains its baby steps, minimal the fewest bytes for a few more "
                        "key switches per layer (auto: what the server's /health prefers)")
    p.add_argument("--bundle", type=Path, help="client bundle directory (veil split); default: embedded model")
    p.add_argument("--k", type=int, default=2, help="split point when no bundle is given")
    p.add_argument("--prompt", help="one prompt; without it, an interactive loop reads stdin")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.add_argument("--key-file", type=Path, metavar="PATH",
                   help="protected: keep this client's key pair in PATH (made and written there on the first "
                        "run, mode 0600; it holds the secret key): a later run makes no keys and uploads none "
                        "while the server still holds them")
    p.add_argument("--key-passphrase", action="store_true",
                   help="seal the key file's secrets with a passphrase (a new file) or open them (a sealed "
                        "one): read from $VEIL_KEY_PASSPHRASE where set, else asked for without echo")
    p.add_argument("--wait-for-room", type=float, default=0.0, metavar="S",
                   help="when the server is full (429 too_many_sessions or kv_capacity), retry after its "
                        "Retry-After for up to S seconds per request (default 0: report the refusal at once)")
    p.add_argument("--cacert", help="CA certificate to trust (e.g. a self-signed dev cert)")
    p.set_defaults(func=cmd_chat)

    keys = sub.add_parser("keys", help="a protected client's key file (veil chat --key-file): show, forget")
    ksub = keys.add_subparsers(dest="keys_cmd", required=True)
    p = ksub.add_parser("show", help="what the key file holds (its header: no secret is read)")
    p.add_argument("path", type=Path)
    p.set_defaults(func=cmd_keys_show)
    p = ksub.add_parser("forget", help="drop the key file's evaluation keys from a server (DELETE /v1/keys), "
                                       "and with --delete the file too")
    p.add_argument("path", type=Path)
    p.add_argument("--server", required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--cacert")
    p.add_argument("--delete", action="store_true", help="then delete the key file: the keys are retired")
    p.set_defaults(func=cmd_keys_forget)


def cmd_chat(args) -> int:
    from veil.client.sdk import VeilClient, VeilError

    if args.key_file is not None and args.mode != "protected":
        print("error: --key-file holds a protected client's keys (--mode protected)", file=sys.stderr)
        return 2
    passphrase = None
    if args.key_passphrase:
        if args.key_file is None:
            print("error: --key-passphrase seals a key file (--key-file PATH)", file=sys.stderr)
            return 2
        passphrase = _key_passphrase(new=not args.key_file.exists())
        if passphrase is None:
            return 2
    client = VeilClient(args.server, args.api_key, mode=args.mode, bundle=args.bundle, k=args.k,
                        verify=args.cacert or True, he_backend=args.he_backend, speculate=args.speculate,
                        key_set=None if args.keys == "auto" else args.keys, wait_for_room_s=args.wait_for_room,
                        key_file=args.key_file, key_passphrase=passphrase)
    history: list[dict] = []
    prompts = [args.prompt] if args.prompt else (line.strip() for line in sys.stdin)
    try:
        for prompt in prompts:
            if not prompt:
                continue
            history.append({"role": "user", "content": prompt})
            answer = []
            for piece in client.chat(history, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                     top_p=args.top_p, top_k=args.top_k, seed=args.seed, stream=True):
                answer.append(piece)
                print(piece, end="", flush=True)
            print()
            history.append({"role": "assistant", "content": "".join(answer)})
            s = client.last_stats
            print(f"[{s.output_tokens} tokens, TTFT {s.ttft_s:.3f} s, TPOT {s.tpot_s * 1000:.1f} ms, "
                  f"{s.prompt_tokens - s.reused_tokens} of {s.prompt_tokens} prompt tokens fed, "
                  f"{(s.bytes_up + s.bytes_down) / max(1, s.output_tokens) / 1e6:.2f} MB/token on the wire]",
                  file=sys.stderr)
    except VeilError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def _key_passphrase(new: bool) -> str | None:
    """The key file's passphrase: $VEIL_KEY_PASSPHRASE, else asked on the terminal (twice for a
    new file). None, said why, for an empty or mistyped one."""
    import getpass
    import os

    passphrase = os.environ.get("VEIL_KEY_PASSPHRASE")
    if passphrase is None:
        try:
            passphrase = getpass.getpass("key file passphrase: ")
            if new and getpass.getpass("again: ") != passphrase:
                print("error: the two passphrases differ", file=sys.stderr)
                return None
        except (EOFError, KeyboardInterrupt):
            print("\nerror: no passphrase read", file=sys.stderr)
            return None
    if not passphrase:
        print("error: an empty passphrase seals nothing", file=sys.stderr)
        return None
    return passphrase


def cmd_keys_show(args) -> int:
    import json

    from veil.client import key_file

    try:
        info = key_file.describe(args.path)
    except key_file.KeyFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2))
    if info["others_may_read"]:
        print(f"warning: others may read {args.path}, which holds a secret key: chmod 600 it, or make new keys",
              file=sys.stderr)
    return 0


def cmd_keys_forget(args) -> int:
    """The server's answer decides: 204 (dropped) or 404 ``keys_not_found`` (it holds none of
    these keys) leave the keys off the server, and only then is the file deleted; anything else
    (409: a session uses them; a 404 that is not Veil's, e.g. a wrong URL) keeps both."""
    import ssl

    import httpx

    from veil.client import key_file

    try:
        keys_id = key_file.describe(args.path)["keys_id"]
    except key_file.KeyFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    verify = ssl.create_default_context(cafile=args.cacert) if args.cacert else True
    try:
        r = httpx.delete(f"{args.server.rstrip('/')}/v1/keys/{keys_id}", verify=verify, timeout=60,
                         headers={"Authorization": f"Bearer {args.api_key}"})
    except httpx.HTTPError as e:
        print(f"error: {args.server}: {e}", file=sys.stderr)
        return 1
    if r.status_code != 204 and _error_code(r) != "keys_not_found":
        print(f"error: {r.status_code} {r.text}", file=sys.stderr)
        return 1
    print(f"keys {keys_id[:12]}: {'dropped' if r.status_code == 204 else 'not held'} by {args.server}")
    if args.delete:
        try:
            args.path.unlink()
        except OSError as e:
            print(f"error: the keys are off the server, but {args.path} stays: {e}", file=sys.stderr)
            return 1
        print(f"deleted {args.path}")
    return 0


def _error_code(r) -> str | None:
    """The ``error.code`` of a Veil error body, else None."""
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
