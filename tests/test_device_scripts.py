"""The lent-GPU call scripts (benchmarks/device/issue*.sh) still fit the code they drive.

A device call is scarce (15 minutes a task, when a task gets one at all), and a script whose
benchmark flag was renamed since it was written spends its step on an argparse error. Here each
script runs under bash with its set-up replaced by stand-ins (this test's only fakes): `python3`
records its argument vector instead of running, `timeout` runs what follows it, `within` grants
every step its time. Then every recorded benchmark command is parsed by that benchmark's own
parser (`main` stops right after `parse_args`), and every pytest command's files and test ids
collect at least one test each, with the script's own `-k`."""

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks" / "device").glob("issue*.sh"))
SETUP_LINE = "source benchmarks/device/setup.sh"
STANDINS = r"""
stamp() { :; }
within() { echo "$1"; }
timeout() { shift; "$@"; }
python3() { printf '%s\0' "$@" > "$(mktemp -p "$CALLS")"; }
"""


def _calls(script: Path, tmp: Path) -> list[list[str]]:
    text = script.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(SETUP_LINE)]
    assert len(lines) == 1, f"{script.name}: expected one set-up line starting {SETUP_LINE!r}"
    calls, out = tmp / "calls", tmp / "out"
    calls.mkdir()
    out.mkdir()
    body = text.replace(lines[0], STANDINS)
    env = dict(os.environ, CALLS=str(calls), OUT=str(out), BUDGET="600")
    r = subprocess.run(["bash", "-c", body], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [f.read_bytes().decode().split("\0")[:-1] for f in sorted(calls.iterdir())]


class _Parsed(Exception):
    pass


def _parse_only(monkeypatch, module: str, args: list[str]) -> argparse.Namespace:
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, argv=None, namespace=None):
        raise _Parsed(real(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    main = importlib.import_module(module).main
    with pytest.raises(_Parsed) as parsed:  # an unknown or malformed flag exits 2 inside real()
        main(args)
    return parsed.value.args[0]


def _collects(args: list[str]) -> None:
    opts, targets, keep = [], [], iter(args)
    for a in keep:  # the selections kept; the options that only shape a real run's output dropped
        if a in ("-k", "-m"):
            opts += [a, next(keep)]
        elif a == "-p":
            next(keep)
        elif not a.startswith("-"):
            targets.append(a)
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *opts,
                        *targets], cwd=ROOT, env=dict(os.environ, PYTHONSAFEPATH="1"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    for t in targets:
        # a file collects tests inside it; a test id itself, or its parametrized cases
        assert any(i == t or i.startswith((t + "::", t + "[")) for i in ids), f"{t} collects nothing"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_device_script_runs_benchmarks_and_tests_that_accept_its_arguments(script, tmp_path, monkeypatch):
    calls = _calls(script, tmp_path)
    modules = [c[1] for c in calls if c[:1] == ["-m"]]
    assert "pytest" in modules and any(m.startswith("veil.benchmarks.") for m in modules), calls
    for call in calls:
        assert call[0] == "-m", f"{script.name}: a python3 command that is not a module run: {call}"
        if call[1] == "pytest":
            _collects(call[2:])
        else:
            assert call[1].startswith("veil.benchmarks."), call
            ns = _parse_only(monkeypatch, call[1], call[2:])
            assert getattr(ns, "device", "cuda") == "cuda", call  # every step measures the GPU
