"""Text as tokens arrive, and stop strings.

Decoding each new token alone breaks words and multi-byte characters that span tokens, and decoding
the whole completion every step costs O(n^2). Like vLLM and TGI, decode a short window that ends at
the new tokens and emit only what it adds beyond the window's already-emitted prefix, holding text
back while it ends in an incomplete character (U+FFFD).

Shared by the front ends that make text, engine.LLM and the server (torch-free: the tokenizer is any object with
HF's ``decode``); the engine itself finds no stop strings, it makes no text.
"""

from __future__ import annotations

from engine.core.sampling_params import SamplingParams, may_stop


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str] | tuple[str, ...] | None = None, *,
                 include_stop_str: bool = False, min_tokens: int = 0) -> None:
        """vLLM's ``include_stop_str_in_output`` (``include_stop_str``): the text keeps the stop string (or the stop
        token) that ended it. ``min_tokens``: a stop string ends the text only if it ends after the text of the first
        that many tokens (engine.core.sampling_params.may_stop), as vLLM searches only the text that follows it."""
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0  # window start
        self._read_offset = 0  # tokens whose text is already emitted
        self.stop = stop or []
        self.include_stop_str = include_stop_str
        # Text that could still be the start of a stop string is held back until it cannot.
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._num_released = 0  # characters of self.text already released to the client
        self._num_searched = 0  # characters of self.text already searched for the stop strings
        self.stopped = False
        self.stop_string: str | None = None  # the stop string that ended the text (vLLM's stop_reason)
        self.min_tokens = min_tokens
        self._num_unstoppable_chars = 0  # the text of the tokens that may not stop it: no stop string ends there

    @classmethod
    def of(cls, tokenizer, params: SamplingParams) -> IncrementalDetokenizer:
        """The detokenizer of a request with these options: their stop strings and include_stop_str_in_output."""
        return cls(tokenizer, params.stop, include_stop_str=params.include_stop_str_in_output,
                   min_tokens=params.min_tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, new_ids: list[int], ends_with_stop_token: bool = False) -> str:
        """Append tokens; returns the new text safe to send (empty while a character or a possible stop
        string is incomplete). After a stop string is found, ``stopped`` is set and the text ends before it (after
        it, with ``include_stop_str``).
        ``ends_with_stop_token``: the last of them is the eos or stop_token_ids token the engine stopped on, whose
        text is left out, as vLLM leaves it out (a stop token of plain text, "\\n", was in the text)."""
        if ends_with_stop_token and not self.include_stop_str:
            new_ids = new_ids[:-1]
        if self.stopped or not new_ids or self.tokenizer is None:  # token ids only: no text to make (and no
            return ""                                                # stop strings: they need a tokenizer)
        num_unstoppable = self.min_tokens - len(self.token_ids)
        if 0 < num_unstoppable < len(new_ids):  # where the tokens that may stop it begin, their text begins
            return self._add(new_ids[:num_unstoppable]) + self._add(new_ids[num_unstoppable:])
        return self._add(new_ids)

    def _add(self, new_ids: list[int]) -> str:
        self.token_ids.extend(new_ids)
        prefix_text = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self.token_ids[self._prefix_offset:])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self.text += full_text[len(prefix_text):]
            # The tokens just emitted become the next window's context, so a merge across the boundary
            # (a leading space, a character split over byte tokens) decodes as the whole text would.
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.token_ids)
        if not may_stop(len(self.token_ids), self.min_tokens):
            self._num_unstoppable_chars = len(self.text)
        return self._release(final=False)

    def finish(self) -> str:
        """The text still held back, once no more tokens come."""
        if self.stopped:
            return ""
        if self._read_offset < len(self.token_ids):  # a trailing incomplete character: emit it as decoded
            prefix_text = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
            self.text += self._decode(self.token_ids[self._prefix_offset:])[len(prefix_text):]
            self._read_offset = len(self.token_ids)
        return self._release(final=True)

    def stop_reason(self, finish_reason: str | None, last_token_id: int | None,
                    stop_token_ids: frozenset[int]) -> str | int | None:
        """vLLM's stop_reason: the stop string that ended the text, else the stop_token_ids token the engine stopped
        on (its finish reason "stop"); None for an eos or a limit. The text leaves either out, so without it a caller
        given several could not tell which one matched."""
        if self.stopped:
            return self.stop_string
        return last_token_id if finish_reason == "stop" and last_token_id in stop_token_ids else None

    def _release(self, final: bool) -> str:
        if self.stop:
            # A match not found before ends in the text added since, and one must end past the text of the tokens that
            # may not stop it: each string is looked for from there less its own length. Every string was looked for
            # from the released text less the longest one, which one stop string of 100,000 characters put at the
            # start: 64 strings rescanned the whole answer at each token, 53 s of the server's event loop for one
            # request of 40,000 tokens (2 s without the long string).
            searched = max(self._num_searched, self._num_unstoppable_chars)
            self._num_searched = len(self.text)
            # (position, order in the request): the earliest match ends the text; of two there, the first listed.
            found = [(i, k) for k, i in enumerate(self.text.find(s, max(searched - len(s) + 1, 0))
                                                  for s in self.stop) if i >= 0]
            if found:
                position, k = min(found)
                self.stop_string = self.stop[k]
                self.text = self.text[:position + len(self.stop_string) if self.include_stop_str else position]
                self.stopped = True
                final = True
        end = len(self.text) if final else max(len(self.text) - self._hold, self._num_released)
        out = self.text[self._num_released:end]
        self._num_released = end
        return out
