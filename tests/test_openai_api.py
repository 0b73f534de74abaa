"""The OpenAI-compatible fast path, driven by the official `openai` client over loopback."""

import concurrent.futures as cf

import httpx
import openai
import pytest

from veil.client import VeilClient


@pytest.fixture(scope="module")
def oai(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=live_server.keys["alice"], max_retries=0)


def test_models(oai, live_server):
    ids = [m.id for m in oai.models.list().data]
    assert ids == [live_server.half.config.name]


def test_chat_completion_streams(oai):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = oai.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=20,
                                        temperature=0)
    text = whole.choices[0].message.content
    assert "Paris" in text and whole.usage.completion_tokens <= 20 and whole.usage.prompt_tokens > 10
    stream = oai.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=20,
                                         temperature=0, stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            finish = c.finish_reason or finish
    assert len(pieces) > 2 and "".join(pieces) == text
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completions_with_token_ids_and_exact_length(oai, chat_prompts, local_greedy, ckpt):
    r = oai.completions.create(model="SmolLM2-135M-Instruct", prompt=chat_prompts[1], max_tokens=32,
                               temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 32 and r.choices[0].finish_reason == "length"
    assert r.choices[0].text == ckpt.tokenizer.decode(local_greedy[1], skip_special_tokens=True)


def test_stop_strings(oai):
    r = oai.completions.create(model="SmolLM2-135M-Instruct", prompt="One, two, three, four, five,", max_tokens=30,
                               temperature=0, stop=[" seven"])
    assert r.choices[0].finish_reason == "stop"
    assert " seven" not in r.choices[0].text and "six" in r.choices[0].text


def test_text_assembler_equals_decoding_the_whole_output(ckpt, local_greedy):
    """The windowed detokenizer's pieces add up to the whole output decoded at once: for the
    model's greedy answers, for text full of multi-byte characters (emoji, CJK, accents: their
    byte-level tokens split characters), and for random token ids (special tokens and byte
    pieces that never complete a character); no piece carries half a character mid-stream. The
    SDK's streamed chat (``stream_text``) likewise, an output that ends inside a character included."""
    import random

    from veil.engine.text import TextAssembler, stream_text

    tok = ckpt.tokenizer
    cases = list(local_greedy)
    cases.append(tok.encode("Grüße aus Zürich 🙂🎉 日本語のテキスト — naïve café ✓ done.", add_special_tokens=False))
    # that text cut inside a character (a byte piece of it left out)
    cases.append(next(cases[-1][:j] for j in range(1, len(cases[-1])) if tok.decode(cases[-1][:j]).endswith("\ufffd")))
    rng = random.Random(7)  # test data, not key material
    cases += [[rng.randrange(tok.vocab_size) for _ in range(200)] for _ in range(3)]
    for ids in cases:
        ta = TextAssembler(tok, [])
        pieces, streamed = [], ""
        for i, t in enumerate(ids):
            pieces.append(ta.push(t))
            streamed += pieces[-1]
            # at every token, at most an unfinished last character is held back
            assert len(tok.decode(ids[:i + 1], skip_special_tokens=True)) - len(streamed) <= 1
        want = tok.decode(ids, skip_special_tokens=True)
        assert streamed + ta.flush() == want
        assert "".join(stream_text(tok, ids)) == want
        if "\ufffd" not in want:
            assert not any(p.endswith("\ufffd") for p in pieces)
    # a stop string split across tokens: the text stops before it, whatever the pieces
    ids = tok.encode("one two three four five six seven eight", add_special_tokens=False)
    ta = TextAssembler(tok, [" seven"])
    out = ""
    for t in ids:
        out += ta.push(t)
        if ta.stopped:
            break
    assert ta.stopped and out == "one two three four five six"


def test_mailbox_delivers_every_item_in_order_with_fewer_wakeups():
    """The engine thread's tokens reach the event loop's queues all and in order, in far fewer
    wake-ups of the loop than items (a burst of them per engine step)."""
    import asyncio
    import threading

    from veil.server.openai_api import Mailbox

    async def go():
        loop = asyncio.get_running_loop()
        box, queues = Mailbox(loop), [asyncio.Queue() for _ in range(8)]
        wakeups, deliver = [0], box._deliver

        def counted():
            wakeups[0] += 1
            deliver()

        box._deliver = counted

        def engine():  # 200 steps of one token for each of 8 requests
            for step in range(200):
                for i, q in enumerate(queues):
                    box.put(q, (i, step))

        t = threading.Thread(target=engine)
        t.start()
        got = [[await q.get() for _ in range(200)] for q in queues]
        t.join()
        return got, wakeups[0]

    got, wakeups = asyncio.run(go())
    assert got == [[(i, step) for step in range(200)] for i in range(8)]
    assert wakeups < 8 * 200 / 2


def test_errors(live_server, oai):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "hi"}], n=2)
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="SmolLM2-135M-Instruct", prompt=[1, 2, 10**9], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", max_tokens=10**6)
    protected_only = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=live_server.keys["carol"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        protected_only.chat.completions.create(model="SmolLM2-135M-Instruct",
                                               messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="nope", max_retries=0).models.list()


def test_sampling_values_past_the_engines_bounds_are_400_and_the_engine_goes_on(live_server, oai):
    """Found by schemathesis (benchmarks/fuzz_api.py): a top_k past int64 passed the body's
    checks and crashed the engine loop while it built the step's sampling tensors, so every
    later request got 503 engine_unavailable."""
    h = {"Authorization": f"Bearer {live_server.keys['alice']}"}
    for body in ({"top_k": 1054797339491368173568, "temperature": 0.5}, {"top_k": 1 << 63, "temperature": 0.5}):
        r = httpx.post(f"{live_server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, **body},
                       headers=h, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.text
    r = oai.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", max_tokens=2, temperature=0.5,
                               extra_body={"top_k": (1 << 63) - 1})  # the largest that fits: no cut
    assert r.usage.completion_tokens == 2
    assert httpx.get(f"{live_server.url}/health").status_code == 200


def test_every_number_of_a_body_at_its_edges_is_answered_without_a_5xx(live_server, oai):
    """Each numeric field of a completion body at int64's and float's edges (NaN and Infinity
    too, which Python's JSON reader accepts): 200 or 4xx, and the engine still serves."""
    h = {"Authorization": f"Bearer {live_server.keys['alice']}", "Content-Type": "application/json"}
    ints = (0, -1, (1 << 63) - 1, 1 << 63, -(1 << 63) - 1, 10**30)
    floats = ("0.0", "-0.0", "1e-320", "1e308", "NaN", "Infinity", "-Infinity")
    cases = [(f, str(v)) for f in ("max_tokens", "max_completion_tokens", "top_k", "seed", "n") for v in ints]
    cases += [(f, v) for f in ("temperature", "top_p") for v in floats]
    cases += [("prompt", f"[1, {v}]") for v in ints]
    for field, raw in cases:
        body = {"prompt": '"hi"', "max_tokens": "2", "temperature": "0.7", field: raw}
        text = "{" + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}"
        r = httpx.post(f"{live_server.url}/v1/completions", content=text, headers=h, timeout=60)
        assert r.status_code < 500, (field, raw, r.status_code, r.text)
    assert httpx.get(f"{live_server.url}/health").status_code == 200
    assert oai.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", max_tokens=2).usage.completion_tokens == 2


def test_text_that_is_not_unicode_or_not_text_is_400(live_server):
    """JSON's escapes can spell a lone surrogate, which the tokenizer refuses with a TypeError
    (a 500 on /v1/completions before); a content part's text must be a string."""
    h = {"Authorization": f"Bearer {live_server.keys['alice']}", "Content-Type": "application/json"}
    bodies = [("/v1/completions", '{"prompt": "\\udfff x", "max_tokens": 2}'),
              ("/v1/completions", '{"prompt": "hi", "max_tokens": 2, "stop": ["\\ud800"]}'),
              ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}'),
              ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}')]
    for route, text in bodies:
        r = httpx.post(f"{live_server.url}{route}", content=text, headers=h, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (text, r.status_code, r.text)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "image_url"}]}],
             "max_tokens": 2}
    assert httpx.post(f"{live_server.url}/v1/chat/completions", json=parts, headers=h, timeout=60).status_code == 200


def _requests_counted(url: str, route: str, status: int) -> float:
    line = f'veil_requests_total{{route="{route}",status="{status}"}} '
    return next((float(x[len(line):]) for x in httpx.get(f"{url}/metrics").text.splitlines()
                 if x.startswith(line)), 0.0)


def test_metrics(live_server, oai):
    ok, missing = (_requests_counted(live_server.url, "/v1/completions", s) for s in (200, 404))
    oai.completions.create(model="SmolLM2-135M-Instruct", prompt="Hello", max_tokens=3)
    list(oai.completions.create(model="SmolLM2-135M-Instruct", prompt="Hello", max_tokens=3, stream=True))
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="gpt-9", prompt="Hello", max_tokens=3)
    # each request counted once by route and status, streamed ones too
    assert _requests_counted(live_server.url, "/v1/completions", 200) == ok + 2
    assert _requests_counted(live_server.url, "/v1/completions", 404) == missing + 1
    text = httpx.get(f"{live_server.url}/metrics").text
    for name in ("veil_requests_total", "veil_ttft_seconds_bucket", "veil_itl_seconds_count",
                 "veil_e2e_seconds_count", "veil_batch_size_bucket", "veil_kv_pool_utilization",
                 "veil_running_sequences", "veil_waiting_sequences", "veil_engine_host_seconds_total"):
        assert name in text, name


def test_concurrent_mixed_requests_match_solo_runs(live_server, client_half, chat_prompts, local_greedy):
    """8 requests at once, split-plaintext sessions and full-model completions interleaved in the
    same engine batches: each gives exactly the tokens it gives alone."""
    key = live_server.keys["alice"]

    def split(i):
        with VeilClient(live_server.url, key, half=client_half) as c:
            return c.generate(chat_prompts[i % 3], 24, stop_at_eos=False).tokens

    def full(i):
        r = httpx.post(f"{live_server.url}/v1/completions", timeout=300, headers={"Authorization": f"Bearer {key}"},
                       json={"prompt": chat_prompts[i % 3], "max_tokens": 24, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    tok = client_half.tokenizer
    steps_before = live_server.app.state.engine.steps
    with cf.ThreadPoolExecutor(8) as pool:
        futs = [(i, pool.submit(split if i % 2 else full, i)) for i in range(8)]
        for i, f in futs:
            expected = local_greedy[i % 3][:24]
            if i % 2:
                assert f.result() == expected, i
            else:
                assert f.result() == tok.decode(expected, skip_special_tokens=True), i
    # batching really happened: far fewer engine steps than the 8 × 24 tokens
    assert live_server.app.state.engine.steps - steps_before < 8 * 24


def test_prompt_filling_the_context_is_400_not_500(make_server):
    """Found by schemathesis: a prompt at or over max_context without max_tokens reached the
    engine as a request for <= 0 tokens and answered 500."""
    srv = make_server(max_context=16)
    h = {"Authorization": f"Bearer {srv.keys['alice']}"}
    for prompt in (list(range(100, 116)), list(range(100, 140))):  # exactly full, and over
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": prompt}, headers=h, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
