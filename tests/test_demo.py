"""`veil demo`, the README's first command (`make demo`): a server in this process, one prompt
answered on the plaintext split and on the protected path, and the cost table. he_heavy: it
makes real CKKS keys at N=16384 and encodes two protected layers (~8 GB at its peak)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.he_heavy
PROTECTED_LAYERS = 2  # the demo's default


def test_demo_answers_the_same_on_both_paths():
    out = subprocess.run([sys.executable, "-m", "veil.cli.main", "demo", "--max-new-tokens", "2"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # each path prints "[path] > prompt", then "[path] answer"
    answers = {m: [ln.removeprefix(f"[{m}] ") for ln in lines if ln.startswith(f"[{m}] ") and not ln.startswith(f"[{m}] > ")]
               for m in ("plaintext", "protected")}
    assert len(answers["plaintext"]) == 1 and answers["plaintext"][0].strip(), out.stdout
    assert answers["plaintext"] == answers["protected"] and "answers: the same" in out.stdout, out.stdout
    rows = {r[0]: r for r in (line.split() for line in lines) if r[:1] in (["plaintext"], ["protected"])}
    tokens, round_trips, setup_mb = int(rows["protected"][1]), int(rows["protected"][5]), float(rows["protected"][6])
    assert int(rows["plaintext"][1]) == tokens == 2
    assert round_trips == 3 * PROTECTED_LAYERS * tokens  # three per protected layer and token
    assert setup_mb > 50 and float(rows["plaintext"][6]) == 0  # evaluation keys on the protected path only
