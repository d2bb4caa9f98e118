"""BurstGPT and Vidur CSV traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces import TraceError
from traces.convert import convert
from traces.formats import ConvertOptions

BURSTGPT_SAMPLE = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,217,634,Conversation log
32,ChatGPT,1019,215,1234,API log
118,ChatGPT,0,12,12,API log
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_burstgpt_sample_drops_failures_and_keeps_model(tmp_path: Path) -> None:
    trace, dropped = convert("burstgpt", _write(tmp_path, "burst.csv", BURSTGPT_SAMPLE))
    requests = trace.requests
    assert requests["request_id"].to_list() == [0, 3, 2]
    assert requests["arrival_s"].to_list() == [0.0, 27.0, 113.0]
    assert requests["prompt_tokens"].to_list() == [472, 1019, 417]
    assert requests["output_tokens"].to_list() == [18, 215, 217]
    assert requests["model"].to_list() == ["ChatGPT", "ChatGPT", "GPT-4"]
    assert requests["log_type"].to_list() == ["Conversation log", "API log", "Conversation log"]
    assert dropped == "dropped 2 requests (0 response tokens are failures) with 0 prompt or 0 output tokens"


@pytest.mark.parametrize(("limit", "kept", "dropped"), [
    (1, [0], ""),
    (2, [0, 3], ""),  # the failure at 45 s comes after the second kept request (32 s): --limit never reached it
    (3, [0, 3, 2], "dropped 1 request (0 response tokens are failures) with 0 prompt or 0 output tokens"),
    (4, [0, 3, 2], "dropped 2 requests (0 response tokens are failures) with 0 prompt or 0 output tokens"),
])
def test_burstgpt_limit_counts_the_drops_it_went_through(tmp_path: Path, limit: int, kept: list[int],
                                                         dropped: str) -> None:
    """--limit N counted the whole file's drops; it counts those before the N-th kept request (the request at
    118 s with 0 request tokens follows, in file order, the kept one at 118 s, so only a limit past it counts it)."""
    path = _write(tmp_path, "burst.csv", BURSTGPT_SAMPLE)
    trace, note = convert("burstgpt", path, ConvertOptions(limit=limit))
    assert trace.requests["request_id"].to_list() == kept
    assert note == dropped


def test_burstgpt_rescaled_to_qps(tmp_path: Path) -> None:
    trace, _ = convert("burstgpt", _write(tmp_path, "burst.csv", BURSTGPT_SAMPLE), ConvertOptions(qps=0.1))
    assert trace.requests["arrival_s"].to_list() == pytest.approx([0.0, 27.0 * 20 / 113, 20.0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Timestamp,Model,Request tokens\n5,ChatGPT,3\n", r"burst\.csv: missing column\(s\) 'Response tokens'"),
        (
            "Timestamp,Request tokens,Response tokens\n5,3,4\nsoon,3,4\n",
            r"burst\.csv: line 3: field 'Timestamp' is 'soon'; expected a finite number",
        ),
        (
            "Timestamp,Request tokens,Response tokens\n-5,3,4\n",
            r"burst\.csv: line 2: field 'Timestamp' is -5\.0; expected a number >= 0",
        ),
        (  # past the trace bound: the error named the converted row instead of the line
            "Timestamp,Request tokens,Response tokens\n5,3,4\n1e300,3,4\n",
            r"burst\.csv: line 3: field 'Timestamp' is 1e\+300; expected a number <= 1e\+12$",
        ),
        (
            "Timestamp,Request tokens,Response tokens\n5,3,4\n6,3,x\n",
            r"burst\.csv: line 3: field 'Response tokens' is 'x'; expected an integer",
        ),
    ],
)
def test_bad_burstgpt(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        convert("burstgpt", _write(tmp_path, "burst.csv", text))


VIDUR_WITH_TIMES = """arrived_at,num_prefill_tokens,num_decode_tokens
0.0,374,44
4.314579,396,109
4.541877,879,0
4.710427,91,16
"""

VIDUR_LENGTHS_ONLY = """num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio
3772,54,3826,69.85
2015,156,2171,12.91
3858,133,3991,29.00
"""


def test_vidur_with_arrivals(tmp_path: Path) -> None:
    trace, dropped = convert("vidur", _write(tmp_path, "v.csv", VIDUR_WITH_TIMES))
    assert trace.requests["arrival_s"].to_list() == [0.0, 4.314579, 4.710427]
    assert trace.requests["prompt_tokens"].to_list() == [374, 396, 91]
    assert trace.requests["request_id"].to_list() == [0, 1, 3]
    assert "dropped 1 request" in dropped


def test_vidur_arrivals_start_at_zero(tmp_path: Path) -> None:
    """Wall-clock arrived_at (epoch seconds) kept its offset; arrivals count from the earliest one, wherever it is."""
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n1700000004.75,5,5\n1700000000.5,6,6\n1700000001,7,7\n"
    trace, _ = convert("vidur", _write(tmp_path, "v.csv", text))
    assert trace.requests["request_id"].to_list() == [1, 2, 0]
    assert trace.requests["arrival_s"].to_list() == [0.0, 0.5, 4.25]


def test_vidur_without_arrivals_all_at_zero(tmp_path: Path) -> None:
    trace, _ = convert("vidur", _write(tmp_path, "v.csv", VIDUR_LENGTHS_ONLY))
    assert trace.requests["arrival_s"].to_list() == [0.0, 0.0, 0.0]
    assert trace.requests["output_tokens"].to_list() == [54, 156, 133]
    with pytest.raises(ValueError, match="all arrive at once"):
        trace.with_qps(1.0)
    path = _write(tmp_path, "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n2,5,5\n2,6,6\n")
    with pytest.raises(TraceError) as info:  # it advised --offline, a replay option convert lacks
        convert("vidur", path, ConvertOptions(qps=1.0))
    assert str(info.value) == (f"{path}: --qps 1: all 2 request(s) arrive at 0 s, so there is no rate to rescale; "
                               "convert without --qps")


def test_vidur_without_arrivals_poisson_at_qps(tmp_path: Path) -> None:
    rows = "".join(f"{100 + i},{10 + i}\n" for i in range(2000))
    path = _write(tmp_path, "v.csv", "num_prefill_tokens,num_decode_tokens\n" + rows)
    trace, _ = convert("vidur", path, ConvertOptions(qps=5.0, seed=3))
    arrivals = trace.requests["arrival_s"]
    assert arrivals[0] == 0.0
    assert (len(trace) - 1) / arrivals[-1] == pytest.approx(5.0, rel=0.08)
    gaps = arrivals.diff().drop_nulls()
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)  # exponential gaps
    again, _ = convert("vidur", path, ConvertOptions(qps=5.0, seed=3))
    assert again.requests.equals(trace.requests)
    other, _ = convert("vidur", path, ConvertOptions(qps=5.0, seed=4))
    assert not other.requests.equals(trace.requests)


def test_bad_vidur(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"v\.csv: missing column\(s\) 'num_decode_tokens'"):
        convert("vidur", _write(tmp_path, "v.csv", "num_prefill_tokens\n5\n"))
    with pytest.raises(TraceError, match=r"v\.csv: line 3: field 'arrived_at' is 'later'"):
        convert("vidur", _write(tmp_path, "v.csv",
                                "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\nlater,1,1\n"))
    past_bound = r"v\.csv: line 2: field 'arrived_at' is 10000000000000\.0; expected a number <= 1e\+12$"
    with pytest.raises(TraceError, match=past_bound):
        convert("vidur", _write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n1e13,1,1\n"))


def test_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown format 'csv'"):
        convert("csv", tmp_path / "x.csv")
