"""Loading, saving and validating traces: the round trip and every rejected input."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.traces.helpers import small_frame
from traces import Trace, TraceError, load_trace, save_trace, validate


def test_round_trip_keeps_columns_dtypes_and_metadata(tmp_path: Path) -> None:
    frame = small_frame(
        hash_ids=[[7], [7, 8], [7, 9]],
        session_id=["s1", None, "s1"],
        note=["x", "y", "z"],
        output_tokens=[1.0, 2.0, 3.0],  # whole floats are accepted and cast
    )
    path = tmp_path / "t.parquet"
    save_trace(frame, path, hash_block_size=512)
    trace = load_trace(path)
    assert trace.hash_block_size == 512
    assert trace.source == str(path)
    assert len(trace) == 3
    assert trace.requests.columns == [
        "request_id", "arrival_s", "prompt_tokens", "output_tokens", "hash_ids", "session_id", "note"
    ]
    assert trace.requests.schema["output_tokens"] == pl.Int64
    assert trace.requests.schema["arrival_s"] == pl.Float64
    assert trace.requests["output_tokens"].to_list() == [1, 2, 3]
    assert trace.requests["hash_ids"].to_list() == [[7], [7, 8], [7, 9]]
    assert trace.requests["session_id"].to_list() == ["s1", None, "s1"]
    assert pq.read_schema(path).metadata[b"hash_block_size"] == b"512"
    # a Trace saves with its own block size, and the bytes are reproducible
    save_trace(trace, tmp_path / "again.parquet")
    assert (tmp_path / "again.parquet").read_bytes() == path.read_bytes()


def test_integer_request_ids_and_int_arrivals_are_normalised() -> None:
    frame = small_frame(request_id=[10, 11, 12], arrival_s=[0, 1, 1], prompt_tokens=[1, 2, 3])
    frame = frame.with_columns(pl.col("prompt_tokens").cast(pl.Int32))
    out = validate(frame, "mem", None)
    assert out.schema["request_id"] == pl.Int64
    assert out.schema["arrival_s"] == pl.Float64
    assert out.schema["prompt_tokens"] == pl.Int64


def test_no_hash_ids_means_no_block_size(tmp_path: Path) -> None:
    save_trace(small_frame(), tmp_path / "t.parquet", hash_block_size=16)
    trace = load_trace(tmp_path / "t.parquet")
    assert trace.hash_block_size is None
    assert b"hash_block_size" not in (pq.read_schema(tmp_path / "t.parquet").metadata or {})


# --- unreadable files ------------------------------------------------------------


def test_nonexistent_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"missing\.parquet: cannot read the trace: no such file"):
        load_trace(tmp_path / "missing.parquet")


def test_directory_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path)


def test_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_text("request_id,arrival_s\n1,0.0\n")
    with pytest.raises(TraceError, match=r"x\.parquet: not a readable parquet file"):
        load_trace(path)


@pytest.mark.parametrize(("name", "head", "formats"), [
    ("conv.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "azure"),
    ("other.csv", "time,prompt,output\n", "{azure|burstgpt|vidur}"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 9, "output_length": 2, "hash_ids": [0]}\n', "mooncake"),
    ("sg.json", '[{"id": "a", "conversations": []}]', "sharegpt"),
])
def test_a_public_trace_given_as_downloaded_names_the_conversion(tmp_path: Path, name: str, head: str,
                                                                 formats: str) -> None:
    path = tmp_path / name
    path.write_text(head)
    expected = f"expected a trace parquet: convert this file first (python -m traces.convert {formats} {path} -o "
    with pytest.raises(TraceError, match=re.escape(expected)):
        load_trace(path)


def test_zero_byte_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    path.write_bytes(b"")
    with pytest.raises(TraceError, match=r"empty\.parquet: the file is empty \(0 bytes\)"):
        load_trace(path)


def test_parquet_with_zero_rows(tmp_path: Path) -> None:
    path = tmp_path / "rows0.parquet"
    small_frame().head(0).write_parquet(path)
    with pytest.raises(TraceError, match=r"rows0\.parquet: the trace is empty \(zero rows\)"):
        load_trace(path)


def test_bad_block_size_metadata(tmp_path: Path) -> None:
    path = tmp_path / "meta.parquet"
    table = small_frame(prompt_tokens=[1, 1, 1], hash_ids=[[1], [2], [3]]).to_arrow()
    pq.write_table(table.replace_schema_metadata({b"hash_block_size": b"sixteen"}), path)
    with pytest.raises(TraceError, match=r"metadata 'hash_block_size' is b'sixteen'; expected a decimal integer"):
        load_trace(path)


def test_hash_ids_without_metadata(tmp_path: Path) -> None:
    path = tmp_path / "nometa.parquet"
    small_frame(prompt_tokens=[1, 1, 1], hash_ids=[[1], [2], [3]]).write_parquet(path)
    with pytest.raises(TraceError,
                       match=r"nometa\.parquet: column 'hash_ids' is present but the block size is unknown"):
        load_trace(path)


# --- rejected tables: one case per rule, each naming file, row, request id and column ----


BAD_TABLES = {
    "missing column": (
        small_frame().drop("output_tokens"),
        r"t\.parquet: missing required column\(s\) 'output_tokens'",
    ),
    "null request_id": (
        small_frame(request_id=["a", None, "c"]),
        r"t\.parquet: row 1: column 'request_id' is null",
    ),
    "null arrival": (
        small_frame(arrival_s=[0.0, None, 4.0]),
        r"row 1 \(request_id 'b'\): column 'arrival_s' is null",
    ),
    "null prompt_tokens": (
        small_frame(prompt_tokens=[5, 6, None]),
        r"row 2 \(request_id 'c'\): column 'prompt_tokens' is null",
    ),
    "negative length": (
        small_frame(output_tokens=[1, -4, 3]),
        r"row 1 \(request_id 'b'\): column 'output_tokens' is -4; token counts must be >= 1",
    ),
    "zero length": (
        small_frame(prompt_tokens=[5, 0, 7]),
        r"row 1 \(request_id 'b'\): column 'prompt_tokens' is 0; token counts must be >= 1",
    ),
    "fractional length": (
        small_frame(prompt_tokens=[5.0, 3.5, 7.0]),
        r"row 1 \(request_id 'b'\): column 'prompt_tokens' is 3\.5, not an integer",
    ),
    "text length": (
        small_frame(prompt_tokens=["5", "6", "7"]),
        r"column 'prompt_tokens' has type String; expected integers >= 1",
    ),
    "negative arrival": (
        small_frame(arrival_s=[-0.5, 1.0, 2.0]),
        r"row 0 \(request_id 'a'\): column 'arrival_s' is negative \(-0\.5\)",
    ),
    "decreasing arrival": (
        small_frame(arrival_s=[0.0, 13.0, 12.5]),
        r"t\.parquet: row 2 \(request_id 'c'\): column 'arrival_s' decreases \(12\.5 after 13\.0\); "
        r"arrival times must be non-decreasing",
    ),
    "arrival past 1e12 s (a timestamp)": (
        small_frame(arrival_s=[0.0, 1.0, 1e300]),
        r"row 2 \(request_id 'c'\): column 'arrival_s' is 1e\+300; arrival times must be at most 1e\+12 seconds",
    ),
    "arrival just past 1e12 s, told from the limit": (  # :g printed it as 1e+12, the limit itself
        small_frame(arrival_s=[0.0, 1.0, 1e12 + 1]),
        r"row 2 \(request_id 'c'\): column 'arrival_s' is 1000000000001\.0; arrival times must be at most 1e\+12",
    ),
    "nan arrival": (
        small_frame(arrival_s=[0.0, float("nan"), 2.0]),
        r"row 1 \(request_id 'b'\): column 'arrival_s' is nan; expected a finite number",
    ),
    "duplicate request_id": (
        small_frame(request_id=[4, 5, 4]),
        r"row 2: column 'request_id' repeats 4 \(first seen at row 0\); request ids must be unique",
    ),
    "float request_id": (
        small_frame(request_id=[1.0, 2.0, 3.0]),
        r"column 'request_id' has type Float64; expected int64 or utf8",
    ),
    "hash_ids length": (
        small_frame(hash_ids=[[1], [1], [1, 2]]),
        r"row 1 \(request_id 'b'\): column 'hash_ids' has 1 ids but prompt_tokens 600 with hash_block_size "
        r"512 needs ceil\(600/512\) = 2",
    ),
    "prompt_token_ids length": (
        small_frame(prompt_tokens=[2, 2, 3], prompt_token_ids=[[1, 2], [3, 4], [5, 6]]),
        r"row 2 \(request_id 'c'\): column 'prompt_token_ids' has 2 ids but prompt_tokens is 3",
    ),
    "negative token id": (
        small_frame(prompt_tokens=[2, 2, 2], prompt_token_ids=[[1, 2], [3, -4], [5, 6]]),
        r"row 1 \(request_id 'b'\): column 'prompt_token_ids' contains a negative token id \(-4\)",
    ),
    "null hash list": (
        small_frame(prompt_tokens=[1, 1, 1], hash_ids=[[1], None, [3]]),
        r"row 1 \(request_id 'b'\): column 'hash_ids' is null",
    ),
    "null hash element": (
        small_frame(prompt_tokens=[1, 600, 1], hash_ids=[[1], [2, None], [3]]),
        r"row 1 \(request_id 'b'\): column 'hash_ids' contains a null element",
    ),
    "float session_id": (
        small_frame(session_id=[1.5, 2.5, 3.5]),
        r"column 'session_id' has type Float64; expected int64 or utf8",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_table_is_rejected_on_save_and_load(case: str, tmp_path: Path) -> None:
    frame, message = BAD_TABLES[case]
    path = tmp_path / "t.parquet"
    with pytest.raises(TraceError, match=message):
        save_trace(frame, path, hash_block_size=512)
    assert not path.exists()
    # the same table written by another tool is rejected when loaded
    table = frame.to_arrow()
    if "hash_ids" in frame.columns:
        table = table.replace_schema_metadata({b"hash_block_size": b"512"})
    pq.write_table(table, path)
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_hash_ids_length_message_is_exact(tmp_path: Path) -> None:
    frame = small_frame(hash_ids=[[1], [1, 2], [1, 2, 3]])
    with pytest.raises(TraceError) as caught:
        save_trace(frame, tmp_path / "t.parquet", hash_block_size=512)
    assert str(caught.value) == (
        f"{tmp_path / 't.parquet'}: row 2 (request_id 'c'): column 'hash_ids' has 3 ids but prompt_tokens 1024 "
        "with hash_block_size 512 needs ceil(1024/512) = 2"
    )


def test_trace_error_is_a_value_error() -> None:
    assert issubclass(TraceError, ValueError)


# --- Trace methods -----------------------------------------------------------------


def _trace(arrivals: list[float]) -> Trace:
    n = len(arrivals)
    frame = pl.DataFrame(
        {"request_id": list(range(n)), "arrival_s": arrivals, "prompt_tokens": [1] * n, "output_tokens": [1] * n}
    )
    return Trace.from_frame(frame, "mem")


def test_head_keeps_first_rows_and_metadata() -> None:
    trace = _trace([0.0, 1.0, 2.0, 3.0])
    head = trace.head(2)
    assert head.requests["request_id"].to_list() == [0, 1]
    assert head.source == trace.source and head.hash_block_size == trace.hash_block_size
    assert len(trace.head(10)) == 4
    with pytest.raises(ValueError, match="n >= 1"):
        trace.head(0)


def test_with_time_scale_scales_gaps_from_the_first_arrival() -> None:
    trace = _trace([2.0, 3.0, 5.0])
    assert trace.with_time_scale(2.0).requests["arrival_s"].to_list() == [2.0, 4.0, 8.0]
    assert trace.with_time_scale(0.5).requests["arrival_s"].to_list() == [2.0, 2.5, 3.5]
    assert trace.requests["arrival_s"].to_list() == [2.0, 3.0, 5.0]  # unchanged: traces are values
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="time scale"):
            trace.with_time_scale(bad)


def test_with_qps_sets_the_mean_rate() -> None:
    trace = _trace([1.0, 2.0, 4.0, 9.0])  # 3 gaps over 8 s
    fast = trace.with_qps(3.0)
    arrivals = fast.requests["arrival_s"]
    assert arrivals[0] == 1.0
    assert (len(fast) - 1) / (arrivals[-1] - arrivals[0]) == pytest.approx(3.0)
    assert arrivals.to_list() == pytest.approx([1.0, 1.125, 1.375, 2.0])


def test_with_qps_refuses_a_trace_that_arrives_at_once() -> None:
    with pytest.raises(ValueError, match="qps cannot be set on a trace whose requests all arrive at once"):
        _trace([5.0, 5.0, 5.0]).with_qps(2.0)
    with pytest.raises(ValueError, match="all arrive at once"):
        _trace([0.0]).with_qps(2.0)
    with pytest.raises(ValueError, match="qps must be"):
        _trace([0.0, 1.0]).with_qps(0.0)


def test_a_big_trace_with_hash_ids_loads_whole(tmp_path: Path) -> None:
    # (Its load time is a benchmark's to measure: a wall-clock bound failed on loaded machines.)
    n = 50_000
    frame = pl.DataFrame(
        {
            "request_id": range(n),
            "arrival_s": [i * 0.01 for i in range(n)],
            "prompt_tokens": [100] * n,
            "output_tokens": [10] * n,
            "hash_ids": [[i, i + 1] for i in range(n)],
        }
    )
    save_trace(frame, tmp_path / "big.parquet", hash_block_size=64)
    trace = load_trace(tmp_path / "big.parquet")
    assert len(trace) == n and trace.requests["hash_ids"][n - 1].to_list() == [n - 1, n]


def test_arrow_large_and_small_list_types_both_load(tmp_path: Path) -> None:
    table = pa.table(
        {
            "request_id": pa.array([1, 2], pa.int32()),
            "arrival_s": pa.array([0.0, 1.0]),
            "prompt_tokens": pa.array([3, 4], pa.int16()),
            "output_tokens": pa.array([1, 1], pa.uint8()),
            "prompt_token_ids": pa.array([[1, 2, 3], [4, 5, 6, 7]], pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, tmp_path / "small_types.parquet")
    trace = load_trace(tmp_path / "small_types.parquet")
    assert trace.requests.schema["prompt_token_ids"] == pl.List(pl.Int64)
    assert trace.prompt_token_ids(1, vocab_size=8) == [4, 5, 6, 7]


def test_a_trace_named_near_the_file_systems_limit_is_saved(tmp_path: Path) -> None:
    # The hidden staging name (.NAME.partial-PID) of a valid 250-character name was longer than a name may be:
    # save_trace (traces.synth -o, traces.convert -o) failed with "File name too long".
    path = tmp_path / ("t" * 242 + ".parquet")
    frame = pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [3, 4],
                          "output_tokens": [1, 2]})
    save_trace(frame, path)
    assert len(load_trace(path)) == 2 and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def _five_rows(**columns) -> dict:
    return {"request_id": pa.array(range(5), pa.int64()), "arrival_s": pa.array([0.0, 0.1, 0.2, 0.3, 0.4]),
            "prompt_tokens": pa.array([10] * 5, pa.int64()), "output_tokens": pa.array([5] * 5, pa.int64()),
            **columns}


@pytest.mark.parametrize("column", ["request_id", "session_id"])
def test_uint64_ids_past_int64_are_refused_at_their_row(tmp_path: Path, column: str) -> None:
    # The strict int64 cast raised a polars InvalidOperationError traceback; ids below 2**63 still load.
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(_five_rows(**{column: pa.array([7, 8, 9, 2**64 - 1, 10], pa.uint64())})), path)
    with pytest.raises(TraceError) as error:
        load_trace(path)
    message = str(error.value)
    assert "row 3" in message and f"column '{column}' is 18446744073709551615, beyond int64" in message
    pq.write_table(pa.table(_five_rows(**{column: pa.array([7, 8, 9, 2**63 - 1, 10], pa.uint64())})), path)
    assert load_trace(path).requests[column].to_list()[3] == 2**63 - 1


def test_an_extra_column_polars_cannot_hold_is_left_out_without_a_panic(tmp_path: Path, capfd) -> None:
    # A decimal256 column beside the trace's own made polars panic (a Rust backtrace, then a traceback).
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(_five_rows(price=pa.array([1, 2, 3, 4, 5], pa.decimal256(76, 0)),
                                       model=pa.array(["a"] * 5).dictionary_encode())), path)
    trace = load_trace(path)
    assert "price" not in trace.requests.columns and trace.requests["model"].to_list() == ["a"] * 5
    assert "panicked" not in capfd.readouterr().err


@pytest.mark.parametrize("column", ["request_id", "session_id"])
def test_dictionary_encoded_text_ids_load_as_text(tmp_path: Path, column: str) -> None:
    # Parquet's usual encoding of repeated strings; polars reads it as Categorical, which was refused as a type.
    path = tmp_path / "t.parquet"
    ids = ["a", "b", "c", "d", "e"] if column == "request_id" else ["s1", "s1", "s2", "s2", "s3"]
    pq.write_table(pa.table(_five_rows(**{column: pa.array(ids).dictionary_encode()})), path)
    trace = load_trace(path)
    assert trace.requests[column].dtype == pl.String and trace.requests[column].to_list() == ids
