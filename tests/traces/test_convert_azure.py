"""Azure LLM inference trace CSV (2023 and 2024 timestamp styles)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.traces.helpers import AZURE_2023, require
from traces import TraceError
from traces.convert import convert
from traces.formats import ConvertOptions

AZURE_2023_SAMPLE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:46.6805901,10,0
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:50.9951690,12,3
"""


def _write(tmp_path: Path, text: str, name: str = "azure.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_2023_sample_sorted_stably_with_100ns_resolution(tmp_path: Path) -> None:
    trace, dropped = convert("azure", _write(tmp_path, AZURE_2023_SAMPLE))
    requests = trace.requests
    # the zero-output request (row 2) is dropped; the two equal times keep file order (rows 0 then 4)
    assert requests["request_id"].to_list() == [1, 0, 4, 3]
    assert requests["arrival_s"].to_list() == pytest.approx([0.0, 4.314579, 4.314579, 4.541877], abs=1e-9)
    assert requests["prompt_tokens"].to_list() == [374, 396, 12, 879]
    assert requests["output_tokens"].to_list() == [44, 109, 3, 55]
    assert dropped == "dropped 1 request with 0 prompt or 0 output tokens"


def test_seventh_fractional_digit_is_kept(tmp_path: Path) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,1\n2023-11-16 18:15:46.6805901,1,1\n"
    trace, _ = convert("azure", _write(tmp_path, text))
    assert trace.requests["arrival_s"][1] == pytest.approx(1e-7, abs=1e-12)


def test_2024_sample_with_zone_offsets(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,100,10\n"
        "2024-05-10 00:00:01+00:00,200,20\n"
        "2024-05-10 02:00:02.5+02:00,300,30\n"
    )
    trace, dropped = convert("azure", _write(tmp_path, text))
    assert trace.requests["arrival_s"].to_list() == pytest.approx([0.0, 0.99007, 2.49007], abs=1e-9)
    assert dropped == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,1\n", r"azure\.csv: missing column\(s\) 'GeneratedTokens'"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\nyesterday,2,2\n",
            r"azure\.csv: line 3: field 'TIMESTAMP' is 'yesterday'; expected a time like",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n2023-11-16 18:15:47.68,abc,2\n",
            r"azure\.csv: line 3: field 'ContextTokens' is 'abc'; expected an integer",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2.5\n",
            r"azure\.csv: line 2: field 'GeneratedTokens' is '2\.5'; expected an integer",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n2023-11-16 18:15:47.68,-3,2\n",
            r"azure\.csv: line 3: field 'ContextTokens' is -3; expected an integer >= 0",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,\n",
            r"azure\.csv: line 2: field 'GeneratedTokens' is empty; expected an integer",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", r"azure\.csv: no data rows"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,1\n",
            r"no requests left after dropping empty ones",
        ),
    ],
)
def test_bad_azure_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        convert("azure", _write(tmp_path, text))


def test_missing_source_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.csv: cannot read: no such file"):
        convert("azure", tmp_path / "nope.csv")


def test_real_azure_2023_conversation_trace() -> None:
    start = time.perf_counter()
    trace, dropped = convert("azure", require(AZURE_2023))
    elapsed_s = time.perf_counter() - start
    requests = trace.requests
    assert len(trace) == 19_366 and dropped == ""
    assert requests["request_id"].to_list() == list(range(19_366))  # the file is already in time order
    assert requests["arrival_s"].head(4).to_list() == pytest.approx([0.0, 4.314579, 4.541877, 4.710427], abs=1e-9)
    assert requests["arrival_s"][-1] == pytest.approx(3501.721937, abs=1e-9)
    assert requests["prompt_tokens"].sum() == 22_361_870
    assert requests["output_tokens"].sum() == 4_088_665
    assert requests["prompt_tokens"].head(3).to_list() == [374, 396, 879]
    assert elapsed_s < 3.0


def test_limit_keeps_the_first_requests(tmp_path: Path) -> None:
    trace, _ = convert("azure", _write(tmp_path, AZURE_2023_SAMPLE), ConvertOptions(limit=2))
    assert trace.requests["request_id"].to_list() == [1, 0]
