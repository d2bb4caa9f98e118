"""Mooncake JSONL: hash ids kept with 512-token blocks, and the known prefix-cache figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.traces.helpers import MOONCAKE, require
from traces import Trace, TraceError
from traces.convert import convert

SAMPLE = """{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}

{"timestamp": 1500, "input_length": 512, "output_length": 0, "hash_ids": [3]}
{"timestamp": 2750, "input_length": 10, "output_length": 1, "hash_ids": [4]}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mooncake.jsonl"
    path.write_text(text)
    return path


def test_sample(tmp_path: Path) -> None:
    trace, dropped = convert("mooncake", _write(tmp_path, SAMPLE))
    requests = trace.requests
    assert trace.hash_block_size == 512
    assert requests["request_id"].to_list() == [0, 1, 3]  # record 2 has no output and is dropped
    assert requests["arrival_s"].to_list() == [0.0, 0.0, 2.75]
    assert requests["prompt_tokens"].to_list() == [600, 1100, 10]
    assert requests["hash_ids"].to_list() == [[0, 1], [0, 1, 2], [4]]
    assert dropped == "dropped 1 request with 0 prompt or 0 output tokens"
    a, b = (trace.prompt_token_ids(row, 1000) for row in (0, 1))
    assert a == b[:600]  # shared blocks 0 and 1 (block 1 partial in the first request)


def test_epoch_timestamps_start_at_zero(tmp_path: Path) -> None:
    """A file of epoch milliseconds kept its offset (the first arrival 54 years in); arrivals count from the
    earliest timestamp, as azure and burstgpt do and as Mooncake's replay does, even when it is not first."""
    text = "".join(f'{{"timestamp": {ms}, "input_length": 10, "output_length": {out}, "hash_ids": [{i}]}}\n'
                   for i, (ms, out) in enumerate([(1_700_000_001_500, 1), (1_700_000_000_250, 0),
                                                  (1_700_000_000_000, 2), (1_700_000_002_999, 3)]))
    trace, dropped = convert("mooncake", _write(tmp_path, text))
    assert trace.requests["request_id"].to_list() == [2, 0, 3]  # the earliest (0 output tokens) is dropped
    assert trace.requests["arrival_s"].to_list() == [0.0, 1.5, 2.999]
    assert dropped == "dropped 1 request with 0 prompt or 0 output tokens"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 0, "input_length": 10, "output_length": 1', r"line 2: not valid JSON"),
        ("[1, 2]", r"line 2: expected a JSON object, got list"),
        ('{"timestamp": 0, "input_length": 10, "hash_ids": [1]}', r"line 2: field 'output_length' is missing"),
        ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
         r"line 2: field 'timestamp' is -5"),
        # an arrival past the trace bound was named by its converted row, not its line
        ('{"timestamp": 1e300, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
         r"line 2: field 'timestamp' is 1e\+300; expected milliseconds from 0 to 1e\+15$"),
        ('{"timestamp": 1, "input_length": 10.5, "output_length": 1, "hash_ids": [1]}',
         r"line 2: field 'input_length' is 10\.5; expected an integer"),
        ('{"timestamp": 1, "input_length": 10, "output_length": true, "hash_ids": [1]}',
         r"line 2: field 'output_length' is True"),
        ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": ["x"]}',
         r"line 2: field 'hash_ids' is not a list of integers"),
        (
            '{"timestamp": 1, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
            r"line 2: field 'hash_ids' has 2 ids but input_length 1025 needs ceil\(1025/512\) = 3",
        ),
    ],
)
def test_bad_records_name_the_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}'
    with pytest.raises(TraceError, match=r"mooncake\.jsonl: " + message):
        convert("mooncake", _write(tmp_path, good + "\n" + line + "\n"))


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no records"):
        convert("mooncake", _write(tmp_path, "\n"))


def _prefix_cache_share(trace: Trace, max_total_tokens: int | None = None, kv_block: int = 256) -> float:
    """Serve requests one at a time with an unbounded prefix cache of chained `kv_block`-token blocks.

    Returns the share of (served) prompt tokens that lie in a full block whose chained key
    (the whole prefix up to and including it) was seen before. A plain Python set.
    """
    seen: set[int] = set()
    hit_tokens = total_tokens = 0
    requests = trace.requests
    totals = (requests["prompt_tokens"] + requests["output_tokens"]).to_numpy()
    for row in range(len(trace)):
        if max_total_tokens is not None and totals[row] > max_total_tokens:
            continue
        tokens = trace.prompt_token_array(row, vocab_size=151_936)
        total_tokens += len(tokens)
        key = 0
        for start in range(0, len(tokens) - kv_block + 1, kv_block):
            key = hash((key, tokens[start : start + kv_block].tobytes()))
            if key in seen:
                hit_tokens += kv_block
            else:
                seen.add(key)
    return hit_tokens / total_tokens


def _hash_half_share(trace: Trace, max_total_tokens: int | None = None) -> float:
    """The same figure from chained (hash_id, half) keys alone, without synthesizing tokens."""
    seen: set[tuple] = set()
    hit_tokens = total_tokens = 0
    for prompt_tokens, output_tokens, hash_ids in trace.requests.select(
        "prompt_tokens", "output_tokens", "hash_ids"
    ).iter_rows():
        if max_total_tokens is not None and prompt_tokens + output_tokens > max_total_tokens:
            continue
        total_tokens += prompt_tokens
        key: tuple = ()
        for block in range(prompt_tokens // 256):
            key = (key, hash_ids[block // 2], block % 2)
            if key in seen:
                hit_tokens += 256
            else:
                seen.add(key)
    return hit_tokens / total_tokens


@pytest.fixture(scope="module")
def mooncake_trace() -> Trace:
    return convert("mooncake", require(MOONCAKE))[0]


def test_real_mooncake_conversation_trace(mooncake_trace: Trace) -> None:
    requests = mooncake_trace.requests
    assert len(mooncake_trace) == 12_031
    assert mooncake_trace.hash_block_size == 512
    assert requests["arrival_s"].head(3).to_list() == [0.0, 0.0, 0.0]
    assert requests["arrival_s"][-1] == pytest.approx(3536.999)
    assert requests["prompt_tokens"].sum() == 144_793_823
    assert requests["output_tokens"].sum() == 4_122_048
    assert requests["hash_ids"].list.len().sum() == 288_500
    assert requests["hash_ids"][1].to_list()[:2] == [0, 14]
    assert (requests["prompt_tokens"] + requests["output_tokens"]).max() == 126_527


def test_real_mooncake_converts_in_one_call() -> None:
    # (How fast is a benchmark's to say, not a timed test's: a loaded CI machine would fail a wall-clock bound.)
    trace, _ = convert("mooncake", require(MOONCAKE))
    assert len(trace) == 12_031


def test_real_mooncake_token_synthesis_covers_every_prompt_token(mooncake_trace: Trace) -> None:
    # (Its speed is a benchmark's to measure, not a timed test's: a loaded CI machine failed a 2 s bound.)
    total = sum(len(mooncake_trace.prompt_token_array(row, 151_936)) for row in range(len(mooncake_trace)))
    assert total == 144_793_823


def test_real_mooncake_prefix_cache_share(mooncake_trace: Trace) -> None:
    """README figure: 0.3735 with every request served; 0.3779 when the 574 requests over 40,960 tokens are rejected."""
    share = _prefix_cache_share(mooncake_trace)
    assert share == pytest.approx(0.3735, abs=0.0005)
    assert _hash_half_share(mooncake_trace) == share  # synthesized tokens reuse exactly what the hash ids say
    requests = mooncake_trace.requests
    assert ((requests["prompt_tokens"] + requests["output_tokens"]) > 40_960).sum() == 574
    assert _hash_half_share(mooncake_trace, max_total_tokens=40_960) == pytest.approx(0.3779, abs=0.0005)


def test_real_mooncake_token_lists_match_arrays(mooncake_trace: Trace) -> None:
    for row in (0, 1, 5000, 12_030):
        ids = mooncake_trace.prompt_token_ids(row, 151_936)
        assert ids == mooncake_trace.prompt_token_array(row, 151_936).tolist()
        assert len(ids) == mooncake_trace.requests["prompt_tokens"][row]
        assert 0 <= min(ids) and max(ids) < 151_936
    assert np.array_equal(
        mooncake_trace.prompt_token_array(0, 151_936)[:512], mooncake_trace.prompt_token_array(1, 151_936)[:512]
    )  # both start with hash id 0
