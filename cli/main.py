"""The `veil` command. This package is the composition root: the only place that may import
both `veil.client` and `veil.server` (for `veil demo`, which runs both in one process)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def cmd_split(args) -> int:
    from veil.engine.loader import load_checkpoint
    from veil.engine.split import write_bundles

    ckpt = load_checkpoint(args.model)
    c, s = write_bundles(ckpt, args.k, args.out)
    print(f"client bundle: {c}\nserver bundle: {s}  (keep this one on the server)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from veil.cli import bench, demo
    from veil.client import cli as client_cli
    from veil.server import cli as server_cli

    parser = argparse.ArgumentParser(prog="veil", description="Veil: privacy-preserving split inference")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("split", help="write client and server bundles")
    p.add_argument("--k", type=int, default=2, help="layers [0,k) go to the client")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", help="a .gguf file or HF checkpoint dir (default: the shipped SmolLM2)")
    p.set_defaults(func=cmd_split)
    server_cli.add_parsers(sub)
    client_cli.add_parsers(sub)
    demo.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark modules parse their own options
        from veil.cli.bench import cmd_bench

        return cmd_bench(argparse.Namespace(rest=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
