"""Text as tokens arrive, and stop strings.

Decoding each new token alone breaks words and multi-byte characters that span tokens, and decoding
the whole completion every step costs O(n^2). Like vLLM and TGI, decode a short window that ends at
the new tokens and emit only what it adds beyond the window's already-emitted prefix, holding text
back while it ends in an incomplete character (U+FFFD).
"""

from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0  # window start
        self._read_offset = 0  # tokens whose text is already emitted
        self.stop = stop or []
        # Text that could still be the start of a stop string is held back until it cannot.
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._num_released = 0  # characters of self.text already released to the client
        self.stopped = False
        self.stop_string: str | None = None  # the stop string that ended the text (vLLM's stop_reason)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; returns the new text safe to send (empty while a character or a possible stop
        string is incomplete). After a stop string is found, ``stopped`` is set and the text ends before it."""
        if self.stopped or not new_ids or self.tokenizer is None:  # token ids only: no text to make (and no
            return ""                                                # stop strings: they need a tokenizer)
        self.token_ids.extend(new_ids)
        prefix_text = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self.token_ids[self._prefix_offset:])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self.text += full_text[len(prefix_text):]
            # The tokens just emitted become the next window's context, so a merge across the boundary
            # (a leading space, a character split over byte tokens) decodes as the whole text would.
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.token_ids)
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

    def _release(self, final: bool) -> str:
        if self.stop:
            start = max(self._num_released - self._hold, 0)
            # (position, order in the request): the earliest match ends the text; of two there, the first listed
            found = [(i, k) for k, i in enumerate(self.text.find(s, start) for s in self.stop) if i >= 0]
            if found:
                position, k = min(found)
                self.text = self.text[:position]
                self.stop_string = self.stop[k]
                self.stopped = True
                final = True
        end = len(self.text) if final else max(len(self.text) - self._hold, self._num_released)
        out = self.text[self._num_released:end]
        self._num_released = end
        return out
