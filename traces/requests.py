"""A trace's rows as the engine takes them: one builder for the GPU replay and the simulator.

Both replays queue request ``i`` with the same prompt tokens, the same ``max_tokens`` (the trace's
output length, with ``ignore_eos`` so the output is exactly that long), the same request id and
arrival time; only when the prompt is synthesized differs (up front on the GPU, so the replay loop
only queues; at arrival in the simulator, so memory follows the requests in flight).
"""

from __future__ import annotations

from array import array

import numpy as np

from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from traces.errors import TraceError, describe_row
from traces.token_synth import (
    hash_id_keys,
    tokens_from_blocks_into,
    tokens_from_hash_ids_array,
    tokens_from_row_array,
    tokens_from_rows_into,
)

_INT32_LIMIT = 2**31  # token ids are hashed as int32 (engine.core.block_manager.token_bytes)
# The prompts of consecutive rows are synthesised together, up to this many tokens (hash-id rows: their whole blocks)
# at a time, in buffers kept for the run: rows are asked for in arrival order, which is row order, and numpy's
# per-call cost, paid per chunk instead of per request, was most of a request's synthesis. A longer row is made
# alone, as before.
_CHUNK_TOKENS = 1 << 17


class RequestMemoryError(TraceError):
    """A request too long for the host's memory to simulate (its prompt synthesised, its tokens and their times
    held); the message names its row."""


# What a simulated request holds per token: its id (int32, prompt and output alike), an output token's time (float64).
_BYTES_PER_TOKEN = 12
# What a whole run holds by the time its outputs are written, at the least: per request (its row in the run's tables)
# and per output token (its time in the requests table, its gap in the ITL statistics, ...). Measured peaks on this
# machine (sim.replay --no-report, 1-8 replicas): 1,000,000 requests of 1 output token 1.2 GiB, 100,000 of 10 tokens
# 0.34 GiB, of 500 tokens 1.9 GiB, 50,000 of 1,000 tokens 1.9 GiB, 200,000 of ShareGPT's lengths (336 output tokens
# on average) 2.6 GiB: ~36 bytes an output token and 1-2 KB a request beyond the interpreter's 0.13 GiB. Below all of
# them: a run refused by this estimate would not have fit.
_RUN_BYTES_PER_REQUEST = 700
_RUN_BYTES_PER_OUTPUT_TOKEN = 24


def check_host_memory(trace, config, available_bytes: int | None) -> None:
    """RequestMemoryError for the longest request of ``trace`` a run of ``config`` (a resolved EngineConfig) would
    hold, its prompt and output as the scheduler cuts them (a prompt it can never serve is rejected unbuilt), when
    its tokens need more than ``available_bytes``. With --max-model-len and --num-gpu-blocks lifted for what-ifs, a
    row asking for 10 billion output tokens ran on for as long as it was let, its token times growing towards
    120 GB: checked before the run instead (by the simulator, and by a capacity sweep before its first)."""
    requests = trace.requests
    if available_bytes is None or not requests.height:
        return
    _refuse_the_longest(trace, _held_tokens(requests, config), available_bytes)


def _refuse_the_longest(trace, held: np.ndarray, available_bytes: int) -> None:
    """check_host_memory's refusal, from the tokens each row holds (``_held_tokens``)."""
    requests = trace.requests
    row = int(np.argmax(held))
    need_bytes = held[row] * _BYTES_PER_TOKEN
    if need_bytes > available_bytes:
        raise RequestMemoryError(
            f"{trace.source}: {describe_row(row, requests['request_id'][row])}: its {int(held[row]):,} tokens "
            f"(prompt and output, as the limits cut them) need {need_bytes / 2**30:,.1f} GiB to simulate, more "
            f"than this host's {available_bytes / 2**30:,.1f} GiB available; expected requests the limits cut "
            "shorter (a smaller --max-model-len or --num-gpu-blocks) or a trace without them (--limit)")


def _held_tokens(requests, config) -> np.ndarray:
    """Per row, the tokens (prompt and output) a run of ``config`` holds for it, as the limits cut them; 0 for a
    prompt the scheduler rejects unbuilt."""
    prompt = requests["prompt_tokens"].to_numpy().astype(np.float64)
    output = requests["output_tokens"].to_numpy().astype(np.float64)
    held = np.minimum(prompt + output, np.maximum(float(config.max_seq_len_limit[0]), prompt + 1))
    # As Scheduler.rejection_reason_for: too long for the model or for the whole cache.
    held[(prompt > config.max_model_len) | (np.ceil(prompt / config.block_size) > config.num_gpu_blocks)] = 0.0
    return held


def check_run_memory(trace, config, available_bytes: int | None, *, num_replays: int = 0,
                     max_parallel_replays: int = 0) -> int:
    """RequestMemoryError when simulating the whole of ``trace`` under ``config`` (a resolved EngineConfig) and
    writing its outputs needs more than ``available_bytes``, at the least (its requests, and their output tokens as
    the limits cut them): a trace of millions of requests (a full public trace) ran for many minutes and was then
    killed by the kernel's out-of-memory killer, without a word. The message says how many of its first requests
    might fit. Its longest request is checked first (check_host_memory), naming its row. (A capacity sweep simulates
    streams resampled from a trace, not the trace: check_host_memory only.)

    With ``num_replays`` band replays (``--bands``), each another whole run beside the main one, which is held until
    its outputs are written: how many of them can run at once, at most ``max_parallel_replays``; RequestMemoryError
    when not even one fits beside the main run."""
    requests = trace.requests
    if available_bytes is None or not requests.height:
        return max_parallel_replays
    held = _held_tokens(requests, config)
    _refuse_the_longest(trace, held, available_bytes)  # as check_host_memory: the row named first
    output_held = np.maximum(held - requests["prompt_tokens"].to_numpy(), 0.0)
    need_bytes = np.cumsum(_RUN_BYTES_PER_REQUEST + _RUN_BYTES_PER_OUTPUT_TOKEN * output_held)
    run_bytes = float(need_bytes[-1])
    if run_bytes > available_bytes:
        fit = int(np.searchsorted(need_bytes, available_bytes, side="right"))
        raise RequestMemoryError(
            f"{trace.source}: its {len(need_bytes):,} requests and their {int(output_held.sum()):,} output tokens (as "
            f"the limits cut them) need at least {run_bytes / 2**30:,.1f} GiB to simulate and write, more than this "
            f"host's {available_bytes / 2**30:,.1f} GiB available; expected a part of the trace (--limit of at most "
            f"{max(fit, 1):,} requests) or a host with more memory")
    beside = int(available_bytes // run_bytes) - 1  # whole runs that fit beside the main one
    if num_replays and beside < 1:
        raise RequestMemoryError(
            f"--bands {num_replays}: {trace.source} needs at least {run_bytes / 2**30:,.1f} GiB a run, and this host's "
            f"{available_bytes / 2**30:,.1f} GiB available hold the main run alone, while each band replay is another "
            "whole run beside it; expected fewer requests (--limit) or no --bands")
    return min(max_parallel_replays, beside)


class TraceRequests:
    def __init__(self, trace, vocab_size: int, seed: int = 0, temperature: float = 0.0, top_k: int = -1,
                 top_p: float = 1.0) -> None:
        requests = trace.requests
        self.trace = trace
        self.vocab_size = vocab_size
        self.seed = seed
        self.temperature = temperature
        self.top_k = top_k  # every request's filters (engine.replay --top-k / --top-p; off by default)
        self.top_p = top_p
        self.arrivals_s: list[float] = requests["arrival_s"].to_list()
        self.request_ids: list[str] = requests["request_id"].to_list()
        self.output_tokens: list[int] = requests["output_tokens"].to_list()
        self.prompt_tokens: list[int] = requests["prompt_tokens"].to_list()
        # SamplingParams is immutable and differs between requests only by max_tokens: one per output length, shared
        # by the requests that ask for it (as engine.llm shares one among prompts). Built and checked per request,
        # twice (reject_unservable and add_to), it was ~3 % of simulate() on the Azure trace.
        self._params_by_max_tokens: dict[int, SamplingParams] = {}
        # Prompts made from hash ids are made here from the trace's flattened ids: the same function as
        # Trace.prompt_token_array, without its per-row column lookups (a few microseconds of a request's
        # synthesis, which the simulator does at every arrival).
        self._hash_ids = (trace._hash_id_offsets if "hash_ids" in requests.columns
                          and "prompt_token_ids" not in requests.columns and 1 <= vocab_size < 2**32 else None)
        self._by_row = ("hash_ids" not in requests.columns and "prompt_token_ids" not in requests.columns
                        and 1 <= vocab_size < 2**32)
        # The synthesised chunk (_CHUNK_TOKENS): rows [_chunk_first, _chunk_end)'s prompts, row k's the int32 ids
        # at bytes [start, stop) of _chunk_bytes, (start, stop) = _chunk_spans[k - _chunk_first]. Made only where
        # every id fits the prompt's array('i') unchanged (else prompt_array makes a list); its buffers on first use.
        self._chunk_first = self._chunk_end = 0
        self._chunk_spans: list[tuple[int, int]] = []
        self._chunk_work: np.ndarray | None = None  # uint64, the synthesis's
        self._chunk_ids = np.empty(0, dtype=np.int32)
        self._chunk_bytes = memoryview(b"")
        self._prompt_tokens_np = requests["prompt_tokens"].to_numpy().astype(np.int64, copy=False)
        self._chunked = ((self._hash_ids is not None or self._by_row) and vocab_size <= _INT32_LIMIT
                         and not (self._prompt_tokens_np < 0).any())
        if self._chunked and self._by_row:  # the rows' first tokens: row k's start at _first_token[k]
            self._first_token = np.zeros(len(self._prompt_tokens_np) + 1, dtype=np.int64)
            np.cumsum(self._prompt_tokens_np, out=self._first_token[1:])

    def __len__(self) -> int:
        return len(self.arrivals_s)

    def prompt(self, i: int) -> list[int]:
        return self.trace.prompt_token_ids(i, self.vocab_size, self.seed)

    def prompt_array(self, i: int) -> array:
        """``prompt(i)`` as an ``array('i')`` made from the synthesised numpy array in one copy (no Python ints:
        ``tolist`` cost several times the synthesis), for the simulator (engine.core.Sequence takes either).
        RequestMemoryError when the host cannot hold the prompt: a row the limits admit (--max-model-len and
        --num-gpu-blocks beyond the model's, for what-ifs) may ask for billions of tokens, and numpy's MemoryError
        ended the replay in a traceback."""
        try:
            return self._prompt_array(i)
        except MemoryError:
            raise RequestMemoryError(
                f"{self.trace.source}: {describe_row(i, self.request_ids[i])}: its prompt of {self.prompt_tokens[i]:,} "
                "tokens does not fit in this host's memory to be synthesised; expected a prompt the limits reject "
                "(a smaller --max-model-len or --num-gpu-blocks) or a trace without it (--limit)") from None

    def _prompt_array(self, i: int) -> array:
        if self._chunk_first <= i < self._chunk_end or (self._chunked and 0 <= i < len(self.prompt_tokens)
                                                         and self._synthesise_chunk(i)):
            start, stop = self._chunk_spans[i - self._chunk_first]
            prompt = array("i")
            prompt.frombytes(self._chunk_bytes[start:stop])  # a copy: the next chunk reuses the buffer
            return prompt
        if self._hash_ids is not None and 0 <= i < len(self.prompt_tokens):
            flat, offsets = self._hash_ids
            tokens = tokens_from_hash_ids_array(flat[offsets[i]:offsets[i + 1]], self.prompt_tokens[i],
                                                self.trace.hash_block_size, self.vocab_size)
        elif self._by_row and 0 <= i < len(self.prompt_tokens):
            # The trace's own function for a row with neither stored ids nor hash ids, minus its per-call row
            # lookups in the polars frame (a sixth of this call's cost at every simulated arrival).
            tokens = tokens_from_row_array(i, self.prompt_tokens[i], self.seed, self.vocab_size)
        else:
            tokens = self.trace.prompt_token_array(i, self.vocab_size, self.seed)
        if self.vocab_size > _INT32_LIMIT:  # ids past int32 would wrap: the block manager refuses them as a list too
            return self.prompt(i)
        prompt = array("i")
        prompt.frombytes(tokens.astype(np.int32).view(np.uint8))  # from the buffer: no bytes object between
        return prompt

    def _synthesise_chunk(self, i: int) -> bool:
        """Make the prompts of row ``i`` and the rows after it that fit in _CHUNK_TOKENS with it; False (nothing made)
        where row ``i`` alone does not."""
        lengths = self._prompt_tokens_np
        if self._hash_ids is not None:
            flat, offsets = self._hash_ids
            block_size = self.trace.hash_block_size
            end = int(offsets.searchsorted(offsets[i] + _CHUNK_TOKENS // block_size, "right")) - 1
        else:
            first_token = self._first_token
            end = int(first_token.searchsorted(first_token[i] + _CHUNK_TOKENS, "right")) - 1
        if end <= i:
            return False
        if self._chunk_work is None:
            self._chunk_work = np.empty(_CHUNK_TOKENS, dtype=np.uint64)
            self._chunk_ids = np.empty(_CHUNK_TOKENS, dtype=np.int32)
            self._chunk_bytes = memoryview(self._chunk_ids).cast("B")
        if self._hash_ids is not None:
            # Every block of the chunk whole; row k's prompt the first of its blocks' tokens (as tokens_from_block_keys
            # makes them from its keys alone).
            tokens = tokens_from_blocks_into(self._chunk_work, hash_id_keys(flat[offsets[i]:offsets[end]]),
                                             block_size, self.vocab_size)
            starts = (offsets[i:end] - offsets[i]) * block_size
            stops = starts + np.minimum(lengths[i:end], (offsets[i + 1:end + 1] - offsets[i:end]) * block_size)
        else:
            tokens = tokens_from_rows_into(self._chunk_work, i, self.prompt_tokens[i:end], self.seed, self.vocab_size)
            starts = first_token[i:end] - first_token[i]
            stops = first_token[i + 1:end + 1] - first_token[i]
        self._chunk_ids[:len(tokens)] = tokens  # (ids below 2**31: int32 holds them)
        self._chunk_spans = list(zip((starts * 4).tolist(), (stops * 4).tolist()))
        self._chunk_first, self._chunk_end = i, end
        return True

    def sampling_params(self, i: int) -> SamplingParams:
        max_tokens = self.output_tokens[i]
        if type(max_tokens) is not int:  # checked afresh: 5.0 == 5 would find the params of 5, and 5.0 is refused
            return self._params(max_tokens)
        params = self._params_by_max_tokens.get(max_tokens)
        if params is None:
            params = self._params(max_tokens)
            self._params_by_max_tokens[max_tokens] = params
        return params

    def _params(self, max_tokens) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p)

    def reject_unservable(self, engine, i: int) -> Sequence | None:
        """Request ``i`` rejected by ``engine`` from its length alone, without building its prompt (a row can
        ask for more tokens than memory holds); None when the engine can serve it."""
        num_prompt_tokens = self.prompt_tokens[i]
        if engine.scheduler.rejection_reason_for(num_prompt_tokens) is None:  # (most rows: their params made once)
            return None
        return engine.reject_unbuilt(num_prompt_tokens, self.sampling_params(i), request_id=self.request_ids[i],
                                     arrival_s=self.arrivals_s[i])

    def add_to(self, engine, i: int, prompt: list[int], block_hashes: list[int] | None = None) -> Sequence:
        """Queue request ``i`` on ``engine`` (an ``LLMEngine``); a request that can never fit comes back rejected.
        ``block_hashes``: the prompt's block hashes, where a router made them (LLMEngine.add_request)."""
        return engine.add_request(
            prompt,
            self.sampling_params(i),
            request_id=self.request_ids[i],
            arrival_s=self.arrivals_s[i],
            block_hashes=block_hashes,
        )
