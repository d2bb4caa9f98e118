"""TraceRequests synthesises the prompts of consecutive rows together (traces.requests._CHUNK_TOKENS), in buffers it
reuses: every row's prompt is still exactly the trace's own, whatever the order rows are asked for in."""

from __future__ import annotations

from array import array

import numpy as np
import polars as pl
import pytest

from traces import Trace, token_synth
from traces import requests as requests_module

VOCAB = 151_936
BLOCK = 16


def _plain_trace(prompt_tokens: list[int]) -> Trace:
    num = len(prompt_tokens)
    frame = pl.DataFrame({"request_id": list(range(num)), "arrival_s": [float(i) for i in range(num)],
                          "prompt_tokens": prompt_tokens, "output_tokens": [1] * num})
    return Trace.from_frame(frame, "mem")


def _hash_trace(prompt_tokens: list[int], block_size: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    num = len(prompt_tokens)
    # Few distinct ids, so rows share blocks (and the same block is made in several chunks).
    hash_ids = [rng.integers(-3, 5, size=-(-n // block_size)).tolist() for n in prompt_tokens]
    frame = pl.DataFrame({"request_id": list(range(num)), "arrival_s": [float(i) for i in range(num)],
                          "prompt_tokens": prompt_tokens, "output_tokens": [1] * num, "hash_ids": hash_ids},
                         schema_overrides={"hash_ids": pl.List(pl.Int64)})
    return Trace.from_frame(frame, "mem", block_size)


def _expected(trace: Trace, row: int, seed: int) -> array:
    return array("i", trace.prompt_token_ids(row, VOCAB, seed))


@pytest.mark.parametrize("seed", [0, 5])
def test_plain_rows_across_chunks_and_longer_than_one(monkeypatch, seed) -> None:
    """A chunk of 100 tokens: rows of 1 to 250 tokens, some longer than a chunk (made alone), in row order, backwards,
    shuffled and again; an array handed out earlier is not changed by the chunks made after it."""
    monkeypatch.setattr(requests_module, "_CHUNK_TOKENS", 100)
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(1, 60, size=40)] + [100, 101, 250, 1, 99]
    trace = _plain_trace(lengths)
    requests = requests_module.TraceRequests(trace, VOCAB, seed)
    first = requests.prompt_array(0)
    orders = [range(len(lengths)), reversed(range(len(lengths))), rng.permutation(len(lengths)).tolist()]
    for order in orders:
        for row in order:
            assert requests.prompt_array(row) == _expected(trace, row, seed), row
    assert first == _expected(trace, 0, seed)


@pytest.mark.parametrize("block_size", [1, 7, 16, 64])
def test_hash_rows_across_chunks_with_partial_last_blocks(monkeypatch, block_size) -> None:
    """Hash-id rows: each chunk makes its blocks whole and hands each row the first of its blocks' tokens (a prompt
    ending inside its last block); blocks longer than a chunk make every row alone."""
    monkeypatch.setattr(requests_module, "_CHUNK_TOKENS", 128)
    rng = np.random.default_rng(block_size)
    lengths = [int(n) for n in rng.integers(1, 3 * block_size + 40, size=30)]
    trace = _hash_trace(lengths, block_size)
    requests = requests_module.TraceRequests(trace, VOCAB)
    for row in [*range(len(lengths)), *rng.permutation(len(lengths)).tolist()]:
        assert requests.prompt_array(row) == _expected(trace, row, 0), row
    assert requests._chunk_end > 0 or block_size > 128


def test_the_chunk_functions_match_the_per_row_ones() -> None:
    lengths = [1, 5, 300, 17, 1024, 2]
    out = np.empty(sum(lengths) + 10, dtype=np.uint64)
    made = token_synth.tokens_from_rows_into(out, 7, lengths, 3, VOCAB).copy()
    expected = np.concatenate([token_synth.tokens_from_row_array(7 + k, n, 3, VOCAB) for k, n in enumerate(lengths)])
    assert made.dtype == expected.dtype == np.int64 and np.array_equal(made, expected)
    keys = token_synth.hash_id_keys(np.array([4, -1, 4, 2**62], dtype=np.int64))
    whole = token_synth.tokens_from_blocks_into(out, keys, 13, VOCAB)
    assert np.array_equal(whole, token_synth.tokens_from_block_keys(keys, 4 * 13, 13, VOCAB))


def test_a_vocabulary_past_int32_still_gets_lists(monkeypatch) -> None:
    """Ids past int32 would wrap in an array('i'): such a vocabulary makes no chunk and gets the trace's list."""
    monkeypatch.setattr(requests_module, "_CHUNK_TOKENS", 100)
    trace = _plain_trace([10, 20, 30])
    requests = requests_module.TraceRequests(trace, 2**31 + 5)
    for row in range(3):
        assert requests.prompt_array(row) == trace.prompt_token_ids(row, 2**31 + 5)
    assert requests._chunk_end == 0
