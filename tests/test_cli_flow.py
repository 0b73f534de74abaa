"""The README's "Using it" commands as a user types them: `veil split`, `veil tenants add`,
`veil serve --bundle` and `veil chat --bundle --prompt`, each its own process, on both paths.
The split is at k=29 (one server layer) so that the protected answer takes seconds; the
commands are the same at the README's k=2. he_heavy: the protected answer makes real CKKS keys
at N=16384 (the module is one unit, so the bundles are written once)."""

import re
import subprocess
import sys

import pytest

from veil.benchmarks.engine_throughput import launch_server
from veil.engine.generate import generate_local

pytestmark = pytest.mark.he_heavy
K = 29
PROMPT = "What is the capital of France?"
FIRST_TURN = [{"role": "user", "content": PROMPT}]


def veil(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "veil.cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    out = veil("split", "--k", str(K), "--out", str(tmp / "bundles"))
    assert out.returncode == 0, out.stderr[-2000:]
    proc, url, key = launch_server(tmp, ("plaintext", "protected"),
                                   ["--bundle", str(tmp / "bundles" / "server_bundle"), "--kv-cache-gb", "0.0625"])
    yield url, key, str(tmp / "bundles" / "client_bundle")
    proc.terminate()
    proc.wait(60)


def _chat(served, *extra: str, stdin: str | None = None, fed: list | None = None) -> str:
    """The answers `veil chat` prints; ``fed`` gets each turn's (prompt tokens fed, prompt tokens)."""
    url, key, bundle = served
    prompt = ["--prompt", PROMPT] if stdin is None else []
    out = veil("chat", "--server", url, "--api-key", key, "--bundle", bundle, *prompt, *extra, stdin=stdin)
    assert out.returncode == 0, out.stderr[-2000:]
    stats = re.findall(r"tokens, TTFT .*, (\d+) of (\d+) prompt tokens fed", out.stderr)  # each turn's stats line
    assert stats
    if fed is not None:
        fed.extend((int(a), int(b)) for a, b in stats)
    return out.stdout.removesuffix("\n")


def _greedy_text(ckpt, full_model, messages: list[dict], n: int) -> str:
    tok = ckpt.tokenizer
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                       return_dict=True)["input_ids"])
    return tok.decode(generate_local(full_model, ids, n), skip_special_tokens=True)


def test_chat_on_the_split_path_answers_as_the_whole_model(served, ckpt, full_model):
    expected = _greedy_text(ckpt, full_model, FIRST_TURN, 6)
    assert _chat(served, "--max-new-tokens", "6") == expected


def test_chat_reads_turns_from_stdin_and_keeps_the_history(served, ckpt, full_model):
    """Without --prompt, each line is the next user turn of one conversation; the second turn
    goes on in the first turn's session and feeds only its own tokens."""
    second = "And of Italy?"
    first_answer = _greedy_text(ckpt, full_model, FIRST_TURN, 6)
    history = [*FIRST_TURN, {"role": "assistant", "content": first_answer}, {"role": "user", "content": second}]
    expected = [first_answer, _greedy_text(ckpt, full_model, history, 6)]
    fed = []
    assert _chat(served, "--max-new-tokens", "6", stdin=f"{PROMPT}\n\n{second}\n", fed=fed).split("\n") == expected
    (fed1, prompt1), (fed2, prompt2) = fed
    assert fed1 == prompt1 and fed2 == prompt2 - (prompt1 + 6 - 1)  # the first turn's prompt and 5 of its 6 tokens


def test_chat_on_the_protected_path(served, ckpt, full_model):
    """Two turns on ciphertexts; the second feeds only its own tokens to the encrypted KV cache."""
    second = "And of Italy?"
    first_answer = _greedy_text(ckpt, full_model, FIRST_TURN, 2)
    history = [*FIRST_TURN, {"role": "assistant", "content": first_answer}, {"role": "user", "content": second}]
    expected = [first_answer, _greedy_text(ckpt, full_model, history, 2)]
    fed = []
    answers = _chat(served, "--mode", "protected", "--max-new-tokens", "2", stdin=f"{PROMPT}\n{second}\n", fed=fed)
    assert answers.split("\n") == expected
    (fed1, prompt1), (fed2, prompt2) = fed
    assert fed1 == prompt1 and fed2 == prompt2 - (prompt1 + 2 - 1)


def test_the_readme_python_snippet(served, ckpt, full_model):
    """README "From Python", with the bundle's path as a string."""
    from veil.client import VeilClient

    url, key, bundle = served
    with VeilClient(url, api_key=key, bundle=bundle) as client:
        pieces = list(client.chat(FIRST_TURN, max_new_tokens=6, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == _greedy_text(ckpt, full_model, FIRST_TURN, 6)
