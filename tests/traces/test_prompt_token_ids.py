"""Synthesized prompt token ids: shared hash ids give shared blocks, everything is deterministic."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from traces import Trace, TraceError

VOCAB = 151_936
BLOCK = 16


def _hash_trace() -> Trace:
    frame = pl.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "arrival_s": [0.0, 0.0, 1.0, 2.0],
            "prompt_tokens": [40, 48, 20, 5],
            "output_tokens": [1, 1, 1, 1],
            "hash_ids": [[10, 11, 12], [10, 11, 13], [12, 10], [11]],
        }
    )
    return Trace.from_frame(frame, "mem", BLOCK)


def test_equal_hash_ids_give_equal_blocks_at_any_position() -> None:
    trace = _hash_trace()
    a, b, c, d = (trace.prompt_token_ids(row, VOCAB) for row in range(4))
    assert a[:32] == b[:32]  # shared hash ids 10, 11
    assert c[:8] == a[32:40]  # block 12 heads c; in a it is the partial (8-token) third block
    assert c[16:20] == a[:4]  # block 10 in second position: same tokens as in first position
    assert d == a[16:21]  # block 11 truncated to 5 tokens


def test_different_hash_ids_give_different_blocks() -> None:
    trace = _hash_trace()
    a, b = trace.prompt_token_ids(0, VOCAB), trace.prompt_token_ids(1, VOCAB)
    assert a[32:40] != b[32:40]  # hash 12 vs 13
    blocks = {tuple(trace.prompt_token_ids(0, VOCAB)[i : i + BLOCK]) for i in (0, 16)}
    assert len(blocks) == 2


def test_truncated_to_prompt_tokens_and_in_range() -> None:
    trace = _hash_trace()
    for row, expected in enumerate([40, 48, 20, 5]):
        ids = trace.prompt_token_ids(row, VOCAB)
        assert len(ids) == expected
        assert all(isinstance(token, int) and 0 <= token < VOCAB for token in ids)
    small = trace.prompt_token_ids(1, vocab_size=7)
    assert set(small) <= set(range(7)) and len(set(small)) == 7


def test_hash_tokens_do_not_depend_on_seed_row_or_block_size() -> None:
    trace = _hash_trace()
    assert trace.prompt_token_ids(0, VOCAB, seed=0) == trace.prompt_token_ids(0, VOCAB, seed=99)
    reordered = Trace.from_frame(trace.requests.reverse().with_columns(arrival_s=pl.lit(0.0)), "mem", BLOCK)
    assert reordered.prompt_token_ids(3, VOCAB) == trace.prompt_token_ids(0, VOCAB)
    # a bigger block size continues the same per-position sequence
    wide = Trace.from_frame(
        pl.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [16], "output_tokens": [1],
                      "hash_ids": [[10]]}),
        "mem",
        32,
    )
    assert wide.prompt_token_ids(0, VOCAB) == trace.prompt_token_ids(0, VOCAB)[:16]


def test_array_and_list_agree() -> None:
    trace = _hash_trace()
    array = trace.prompt_token_array(1, VOCAB)
    assert array.dtype == np.int64
    assert array.tolist() == trace.prompt_token_ids(1, VOCAB)


def _plain_trace(num: int = 50, prompt: int = 64) -> Trace:
    frame = pl.DataFrame(
        {"request_id": range(num), "arrival_s": [0.0] * num, "prompt_tokens": [prompt] * num,
         "output_tokens": [1] * num}
    )
    return Trace.from_frame(frame, "mem")


def test_without_ids_tokens_depend_on_seed_and_row_only() -> None:
    trace = _plain_trace()
    first = [trace.prompt_token_ids(row, VOCAB) for row in range(len(trace))]
    assert first == [trace.prompt_token_ids(row, VOCAB) for row in range(len(trace))]
    assert len({ids[0] for ids in first}) == len(first)  # no two requests share even a first token here
    assert trace.prompt_token_ids(3, VOCAB, seed=1) != first[3]
    assert trace.head(5).prompt_token_ids(3, VOCAB) == first[3]
    assert all(0 <= t < VOCAB for ids in first for t in ids)


def test_stored_prompt_token_ids_are_returned_and_checked_against_the_vocabulary() -> None:
    frame = pl.DataFrame(
        {
            "request_id": ["x", "y"],
            "arrival_s": [0.0, 1.0],
            "prompt_tokens": [3, 2],
            "output_tokens": [1, 1],
            "prompt_token_ids": [[5, 6, 7], [1, 900]],
        }
    )
    trace = Trace.from_frame(frame, "stored.parquet")
    assert trace.prompt_token_ids(0, vocab_size=8) == [5, 6, 7]
    with pytest.raises(
        TraceError,
        match=r"stored\.parquet: row 1 \(request_id 'y'\): column 'prompt_token_ids' holds token id 900 at position 1, "
        r"outside the vocabulary \[0, 100\)",
    ):
        trace.prompt_token_ids(1, vocab_size=100)


def test_bad_row_and_vocab() -> None:
    trace = _plain_trace(3)
    with pytest.raises(IndexError, match="row 3 is out of range"):
        trace.prompt_token_ids(3, VOCAB)
    with pytest.raises(ValueError, match="vocab_size"):
        trace.prompt_token_ids(0, 0)


def test_a_few_hash_ids_mixed_as_python_ints_give_the_array_paths_tokens(monkeypatch) -> None:
    """A prompt's few hash ids are mixed one by one as Python ints, many as a numpy array: the same tokens,
    negative and extreme ids included; and the simulator's TraceRequests.prompt_array gives the trace's own."""
    from array import array

    from traces import token_synth
    from traces.requests import TraceRequests

    ids = np.array([0, 1, -1, 2**63 - 1, -(2**63), 123_456_789_012], dtype=np.int64)
    few = token_synth.tokens_from_hash_ids_array(ids, len(ids) * BLOCK - 3, BLOCK, VOCAB)
    monkeypatch.setattr(token_synth, "_MAX_SCALAR_KEYS", 0)
    many = token_synth.tokens_from_hash_ids_array(ids, len(ids) * BLOCK - 3, BLOCK, VOCAB)
    assert few.dtype == many.dtype == np.int64
    assert few.tolist() == many.tolist()
    monkeypatch.undo()
    trace = _hash_trace()
    requests = TraceRequests(trace, VOCAB)
    for row in range(len(trace)):
        assert requests.prompt_array(row) == array("i", trace.prompt_token_ids(row, VOCAB))


@pytest.mark.parametrize("seed", [0, 7])
def test_prompt_array_of_a_plain_trace_is_the_traces_own_prompt(seed) -> None:
    """Rows with neither stored ids nor hash ids: TraceRequests.prompt_array (its own path, no row lookups in the
    trace's frame) gives exactly the trace's prompt for the row and seed, and a row past the end fails as the
    trace's does."""
    from array import array

    from traces.requests import TraceRequests

    trace = _plain_trace(num=6, prompt=300)
    requests = TraceRequests(trace, VOCAB, seed)
    for row in range(len(trace)):
        assert requests.prompt_array(row) == array("i", trace.prompt_token_ids(row, VOCAB, seed))
    assert requests.prompt_array(0) != TraceRequests(trace, VOCAB, seed + 1).prompt_array(0)
    with pytest.raises(IndexError, match="out of range"):
        requests.prompt_array(len(trace))


def test_tokens_are_built_from_the_blocks_and_positions_the_prompt_reaches() -> None:
    # A trace may declare hash blocks far longer than its prompts (metadata hash_block_size up to 2**31): the
    # first block's keys were built whole, 16 GiB for a 10-token prompt, and the process was killed.
    from traces import token_synth

    ids = np.array([5, 9, 5, 11], dtype=np.int64)
    full = token_synth.tokens_from_hash_ids_array(ids, 4 * 64, 64, VOCAB)  # every block whole: the reference
    for num_tokens in (0, 1, 10, 63, 64, 65, 130, 255, 256):
        assert np.array_equal(token_synth.tokens_from_hash_ids_array(ids, num_tokens, 64, VOCAB),
                              full[:num_tokens])
    huge = token_synth.tokens_from_hash_ids_array(ids, 10, 2**31, VOCAB)
    assert len(huge) == 10 and np.array_equal(huge, token_synth.tokens_from_hash_ids_array(ids[:1], 10, 64, VOCAB))
    assert len(token_synth.tokens_from_hash_ids_array(ids, 1000, 64, VOCAB)) == 256  # the blocks run out first


def test_prompt_array_across_key_chunks_in_any_order(monkeypatch) -> None:
    """TraceRequests makes the prompts of a chunk of rows at once: rows of several chunks (of at least 3 rows here),
    asked for out of order and again, and the last chunk's partial tail all give the trace's own prompt."""
    from array import array

    from traces import requests as requests_module

    monkeypatch.setattr(requests_module, "_CHUNK_TOKENS", 3 * 24 * BLOCK)
    rng = np.random.default_rng(5)
    num = 11
    hash_ids = [rng.integers(-(2**40), 2**40, size=int(n)).tolist() for n in rng.integers(1, 25, size=num)]
    prompt_tokens = [len(ids) * BLOCK - int(rng.integers(0, BLOCK)) for ids in hash_ids]
    frame = pl.DataFrame({"request_id": list(range(num)), "arrival_s": [float(i) for i in range(num)],
                          "prompt_tokens": prompt_tokens, "output_tokens": [1] * num, "hash_ids": hash_ids},
                         schema_overrides={"hash_ids": pl.List(pl.Int64)})
    trace = Trace.from_frame(frame, "mem", BLOCK)
    requests = requests_module.TraceRequests(trace, VOCAB)
    for row in [10, 0, 5, 3, 4, 9, 1, 10, 2, 6, 7, 8, 0]:
        assert requests.prompt_array(row) == array("i", trace.prompt_token_ids(row, VOCAB)), row
