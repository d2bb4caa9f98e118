"""A trace's requests as HTTP requests: the same prompts, lengths and ids as the in-process replays.

Token prompts are ``TraceRequests.prompt`` (what ``sim.replay`` and ``engine.replay`` queue), so a
multi-turn trace's shared prefixes reach the server's prefix cache exactly as they reach the
simulator's, given the same vocabulary size and seed. Text prompts (for servers that refuse token ids)
decode those ids with the served model's tokenizer and trim or pad the text until it encodes to exactly
the trace's length; shared id prefixes give shared text prefixes, but re-tokenization may move a block
boundary by a token, so the reuse is close to, not exactly, the trace's.
"""

from __future__ import annotations

from traces.errors import row_error
from traces.http_bench import BenchRequest
from traces.requests import TraceRequests

MAX_TEXT_ROUNDS = 12
FILLER = " the"  # one token in common BPE vocabularies, and stable when repeated
# The longest prompt sent: no model's context holds more (the longest are some millions of tokens). A request is
# built whole before it is sent, and the ids of one 1e10-token prompt asked numpy for 128 GiB (a MemoryError
# traceback, or the OOM killer) where engine.replay rejects the request.
MAX_PROMPT_TOKENS = 2**24


def check_prompt_lengths(trace) -> None:
    """TraceError naming the first row whose prompt is longer than MAX_PROMPT_TOKENS."""
    longer = (trace.requests["prompt_tokens"] > MAX_PROMPT_TOKENS).arg_true()
    if len(longer):
        row = int(longer[0])
        raise row_error(trace.source, row, trace.requests["request_id"][row], "prompt_tokens",
                        f"is {trace.requests['prompt_tokens'][row]:,}; traces.bench sends prompts of at most "
                        f"{MAX_PROMPT_TOKENS:,} tokens (no model's context holds more)")


def bench_requests(trace, vocab_size: int, seed: int, tokenizer=None) -> list[BenchRequest]:
    """One request per trace row, sent at its arrival time measured from the first arrival.

    With ``tokenizer`` (an HF tokenizer: ``decode``, ``__call__``), prompts are text of the trace's token
    length; ValueError names the row whose length cannot be matched.
    """
    requests = TraceRequests(trace, vocab_size, seed)
    first_s = requests.arrivals_s[0] if len(requests) else 0.0
    out = []
    for i in range(len(requests)):
        prompt: list[int] | str = requests.prompt(i)
        if tokenizer is not None:
            prompt = text_prompt(prompt, requests.prompt_tokens[i], tokenizer, requests.request_ids[i])
        out.append(BenchRequest(request_id=requests.request_ids[i], send_at_s=requests.arrivals_s[i] - first_s,
                                prompt=prompt, prompt_tokens=requests.prompt_tokens[i],
                                max_tokens=requests.output_tokens[i]))
    return out


def _count(tokenizer, text: str) -> list[int]:
    # As the server counts them: with its special tokens (a BOS where the model has one).
    return list(tokenizer(text)["input_ids"])


def text_prompt(token_ids: list[int], num_tokens: int, tokenizer, request_id: str = "") -> str:
    """Text that ``tokenizer`` encodes to exactly ``num_tokens`` tokens, starting from ``token_ids``' text."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    for _ in range(MAX_TEXT_ROUNDS):
        ids = _count(tokenizer, text)
        if len(ids) == num_tokens:
            return text
        if len(ids) > num_tokens:
            # Drop the surplus from the end: decode what remains without the special tokens the count added.
            special = len(ids) - len(tokenizer(text, add_special_tokens=False)["input_ids"])
            keep = max(0, num_tokens - special)
            plain = tokenizer(text, add_special_tokens=False)["input_ids"][:keep]
            text = tokenizer.decode(plain, skip_special_tokens=True)
        else:
            text += FILLER * (num_tokens - len(ids))
    raise ValueError(f"request {request_id!r}: no text of exactly {num_tokens} tokens found with this tokenizer "
                     f"(closest: {len(_count(tokenizer, text))}); use token-id prompts (--prompt-format tokens)")
