"""Text from token ids as they arrive: incremental detokenization, with stop strings for the
OpenAI-compatible endpoint (``server/openai_api.py``) and without for the SDK's streamed chat
(``client/sdk.py``). Both stream what one decode of every token would give, in pieces."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class TextAssembler:
    """Incremental detokenization with stop strings: emits only text that can no longer turn
    into a stop string or an incomplete UTF-8 character.

    Each token decodes a short window, not the whole output: the tokens from the last point where
    the text ended on a whole character (``prefix``) to the end, minus the same window without the
    tokens not yet committed (``read``). Decoding the whole list per token cost ~250 us per token
    on outputs of 100-1,024 tokens (the served fast path's largest per-token cost). While the window ends
    in an incomplete character, all but that last character is already visible (``_tail``):
    bytes that can never complete one are not held back."""

    def __init__(self, tokenizer, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            # the tokenizers library directly: what transformers' decode does here, less its wrapping
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=True)
        else:
            self._decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        self.tokens: list[int] = []
        self.prefix = self.read = 0  # token offsets: text committed up to `read`, window from `prefix`
        self.text, self._tail, self.emitted, self.stopped = "", "", 0, False

    def _catch_up(self, final: bool = False) -> None:
        """Commit the text of the tokens past ``read`` once it ends on a whole character (or,
        ``final``, whatever it decodes to); until then show it less its last character."""
        before = self._decode(self.tokens[self.prefix:self.read])
        tail = self._decode(self.tokens[self.prefix:])[len(before):]
        if final or not tail.endswith("\ufffd"):
            self.text += tail
            self.prefix, self.read, self._tail = self.read, len(self.tokens), ""
        else:  # an incomplete character decodes to one U+FFFD at the end; what precedes it is final
            self._tail = tail[:-1]

    def push(self, token: int) -> str:
        self.tokens.append(token)
        self._catch_up()
        visible = self.text + self._tail
        for s in self.stops:
            idx = visible.find(s, max(0, self.emitted - len(s)))
            if idx != -1:
                self.stopped = True
                self.text, self._tail = visible[:idx], ""
                return self.flush()
        safe = len(visible) - self.hold
        if safe <= self.emitted:
            return ""
        piece, self.emitted = visible[self.emitted:safe], safe
        return piece

    def flush(self) -> str:
        if not self.stopped:
            self._catch_up(final=True)
        piece, self.emitted = self.text[self.emitted:], len(self.text)
        return piece


def stream_text(tokenizer, tokens: Iterable[int]) -> Iterator[str]:
    """The text of ``tokens`` in pieces as they arrive; joined, the pieces are the text of all of
    them decoded at once (an incomplete character at the end included, as that decode shows it)."""
    text = TextAssembler(tokenizer, [])
    for token in tokens:
        if piece := text.push(token):
            yield piece
    if piece := text.flush():
        yield piece
