"""ShareGPT conversations tokenized with a tiny local tokenizer (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.traces.helpers import word_ids
from traces import TraceError
from traces.convert import convert
from traces.formats import ConvertOptions

CONVERSATIONS = [
    {
        "id": "c0",
        "conversations": [
            {"from": "human", "value": "hello world"},
            {"from": "gpt", "value": "how are you"},
            {"from": "human", "value": "fine thanks and you"},
            {"from": "gpt", "value": "fine"},
            {"from": "human", "value": "what is a trace"},
            {"from": "gpt", "value": "a trace is what you replay"},
        ],
    },
    {
        "id": "c1",
        "conversations": [
            {"from": "system", "value": "you are fine"},
            {"from": "human", "value": "hello"},
            {"from": "gpt", "value": ""},  # empty answer: request dropped, message kept in history
            {"from": "human", "value": "hello again"},
            {"from": "gpt", "value": "hello"},
            {"from": "human", "value": "unanswered"},
        ],
    },
    {"id": "c2", "conversations": [{"from": "gpt", "value": "no question"}]},
]


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def _options(tokenizer: Path, **kw: object) -> ConvertOptions:
    return ConvertOptions(**{"tokenizer": str(tokenizer), "qps": 2.0, "seed": 1, **kw})


def _by_session_turn(trace) -> dict:
    return {(s, t): row for row, (s, t) in enumerate(trace.requests.select("session_id", "turn").iter_rows())}


def test_turns_become_requests_whose_history_is_an_exact_prefix(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    trace, dropped = convert("sharegpt", _write(tmp_path, CONVERSATIONS), _options(tiny_tokenizer_dir))
    assert len(trace) == 4
    assert dropped == "dropped 1 turn whose prompt or answer has 0 tokens"
    rows = _by_session_turn(trace)
    assert set(rows) == {("c0", 0), ("c0", 1), ("c0", 2), ("c1", 0)}
    ids = trace.requests["prompt_token_ids"].to_list()
    out = trace.requests["output_tokens"].to_list()
    c0 = [word_ids(m["value"]) for m in CONVERSATIONS[0]["conversations"]]
    assert ids[rows["c0", 0]] == c0[0]
    assert ids[rows["c0", 1]] == c0[0] + c0[1] + c0[2]
    assert ids[rows["c0", 2]] == c0[0] + c0[1] + c0[2] + c0[3] + c0[4]
    assert [out[rows["c0", t]] for t in range(3)] == [3, 1, 6]
    # turn k's prompt plus its answer is a prefix of turn k+1's prompt
    for turn in (0, 1):
        earlier, later = ids[rows["c0", turn]], ids[rows["c0", turn + 1]]
        assert later[: len(earlier)] == earlier
    c1 = [word_ids(m["value"]) for m in CONVERSATIONS[1]["conversations"]]
    assert ids[rows["c1", 0]] == c1[0] + c1[1] + c1[3]  # system + dropped turn + new message
    assert out[rows["c1", 0]] == 1
    assert trace.requests["prompt_tokens"].to_list() == [len(x) for x in ids]
    assert trace.prompt_token_ids(rows["c0", 1], vocab_size=13) == ids[rows["c0", 1]]


def test_arrivals_poisson_conversations_and_think_times(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    options = _options(tiny_tokenizer_dir, think_time_s=7.0, think_time_cv=0.0)
    trace, _ = convert("sharegpt", _write(tmp_path, CONVERSATIONS), options)
    arrivals = trace.requests["arrival_s"].to_list()
    rows = _by_session_turn(trace)
    assert arrivals[rows["c0", 0]] == 0.0
    assert arrivals[rows["c0", 1]] - arrivals[rows["c0", 0]] == pytest.approx(7.0)
    assert arrivals[rows["c0", 2]] - arrivals[rows["c0", 1]] == pytest.approx(7.0)
    assert arrivals[rows["c1", 0]] > 0.0
    again, _ = convert("sharegpt", _write(tmp_path, CONVERSATIONS), options)
    assert again.requests.equals(trace.requests)


def test_long_run_rate_is_qps(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    many = [
        {"id": f"s{i}",
         "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "world"}] * (1 + i % 3)}
        for i in range(1500)
    ]
    trace, _ = convert("sharegpt", _write(tmp_path, many), _options(tiny_tokenizer_dir, qps=4.0, think_time_s=2.0))
    arrivals = trace.requests["arrival_s"]
    assert len(trace) == 3000
    assert (len(trace) - 1) / (arrivals[-1] - arrivals[0]) == pytest.approx(4.0, rel=0.08)
    starts = trace.requests.filter(trace.requests["turn"] == 0)["arrival_s"].to_numpy()
    gaps = np.diff(starts)
    assert gaps.mean() == pytest.approx(0.5, rel=0.1)  # 2 requests per conversation on average


def test_limit_counts_requests(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    trace, dropped = convert("sharegpt", _write(tmp_path, CONVERSATIONS), _options(tiny_tokenizer_dir, limit=2))
    assert len(trace) == 2
    assert set(trace.requests["session_id"]) == {"c0"}
    assert dropped == ""  # c1's empty answer (tokenized in the same chunk) was counted although c1 was left out


@pytest.mark.parametrize(("limit", "dropped"), [
    (3, ""),  # c0's three requests: c1's dropped turn comes after them
    (4, "dropped 1 turn whose prompt or answer has 0 tokens"),
])
def test_limit_counts_the_dropped_turns_before_the_last_kept_request(tmp_path: Path, tiny_tokenizer_dir: Path,
                                                                     limit: int, dropped: str) -> None:
    trace, note = convert("sharegpt", _write(tmp_path, CONVERSATIONS), _options(tiny_tokenizer_dir, limit=limit))
    assert len(trace) == limit
    assert note == dropped


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"id": "x"}, r"sharegpt\.json: top level is a JSON object; expected a list of conversations"),
        ([{"id": "x", "turns": []}], r"conversation 0 \(id 'x'\): field 'conversations' is missing or not a list"),
        (
            [CONVERSATIONS[0], {"id": "y", "conversations": [{"from": "robot", "value": "hi"}]}],
            r"sharegpt\.json: conversation 1 \(id 'y'\), message 0: field 'from' is 'robot'; expected 'human' or 'gpt'",
        ),
        (
            [{"id": "z", "conversations": [{"from": "human", "value": 5}]}],
            r"conversation 0 \(id 'z'\), message 0: field 'value' is int; expected a string",
        ),
        ([CONVERSATIONS[2]], r"no human message with a model answer"),
        # JSON allows a lone surrogate, UTF-8 cannot hold one: the tokenizer's TypeError was a traceback
        (
            [CONVERSATIONS[0], {"id": "s", "conversations": [{"from": "human", "value": "hello"},
                                                             {"from": "gpt", "value": "fine \ud800 x"}]}],
            r"sharegpt\.json: conversation 1 \(id 's'\), message 1: field 'value' holds '\\ud800' at character 5, "
            r"which is no Unicode text \(an unpaired surrogate\); expected text$",
        ),
        (  # the same in an id failed writing the parquet, naming no file
            [{"id": "\udc00", "conversations": CONVERSATIONS[0]["conversations"]}],
            r"sharegpt\.json: conversation 0 \(id '\\udc00'\): field 'id' holds an unpaired surrogate, which is no "
            r"Unicode text; expected text$",
        ),
        # answered turns that all tokenize to nothing: it said 'no human message with a model answer'
        (
            [{"id": "e", "conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "fine"},
                                           {"from": "human", "value": "hello"}, {"from": "gpt", "value": " "}]}],
            r"sharegpt\.json: all 2 answered human messages have a prompt or an answer of 0 tokens; nothing to convert",
        ),
    ],
)
def test_bad_sharegpt(tmp_path: Path, tiny_tokenizer_dir: Path, data: object, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        convert("sharegpt", _write(tmp_path, data), _options(tiny_tokenizer_dir))


def test_invalid_json_names_the_line(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text('[\n{"id": "a",\n "conversations": [}\n]')
    with pytest.raises(TraceError, match=r"sharegpt\.json: line 3: not valid JSON"):
        convert("sharegpt", path, _options(tiny_tokenizer_dir))


def test_needs_tokenizer_and_qps(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    path = _write(tmp_path, CONVERSATIONS)
    with pytest.raises(TraceError, match="sharegpt needs --tokenizer"):
        convert("sharegpt", path, ConvertOptions(qps=1.0))
    with pytest.raises(TraceError, match="sharegpt needs --qps"):
        convert("sharegpt", path, ConvertOptions(tokenizer=str(tiny_tokenizer_dir)))
    missing = tmp_path / "missing_tok"
    with pytest.raises(TraceError) as info:
        convert("sharegpt", path, ConvertOptions(tokenizer=str(missing), qps=1.0))
    assert str(info.value) == (f"--tokenizer {missing}: no such directory (nor a tokenizer of that name in the local "
                               "Hugging Face cache); expected a tokenizer directory")


def test_a_tokenizer_that_is_a_file_or_broken_is_one_line(tmp_path: Path) -> None:
    """transformers' messages spoke of config mappings or spanned five lines."""
    path = _write(tmp_path, CONVERSATIONS)
    with pytest.raises(TraceError) as info:
        convert("sharegpt", path, ConvertOptions(tokenizer=str(path), qps=1.0))
    assert str(info.value) == f"--tokenizer {path}: is a file; expected a Hugging Face tokenizer directory"
    empty = tmp_path / "empty_tok"
    empty.mkdir()
    with pytest.raises(TraceError, match=rf"^--tokenizer {empty}: cannot load a local tokenizer \(") as info:
        convert("sharegpt", path, ConvertOptions(tokenizer=str(empty), qps=1.0))
    assert "\n" not in str(info.value)


def test_a_byte_order_mark_is_no_json_error(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    """A file saved with a BOM (Windows editors) failed with 'Unexpected UTF-8 BOM'; Mooncake and the CSVs take it."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(CONVERSATIONS).encode())
    trace, _ = convert("sharegpt", path, _options(tiny_tokenizer_dir))
    plain, _ = convert("sharegpt", _write(tmp_path, CONVERSATIONS), _options(tiny_tokenizer_dir))
    assert trace.requests.equals(plain.requests)


def test_every_conversation_is_a_session_of_its_own(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    """Two conversations with one id (or none, or a missing one beside an id that is its index) became one session:
    the capacity planner's sessions and any session-aware router then saw two first turns in one conversation."""
    def talk(**id_field: object) -> dict:
        return {**id_field, "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "fine"}]}

    data = [talk(id="a"), talk(id="a"), talk(), talk(id="2"), talk(id=None), talk(id=None), talk(id=7)]
    trace, _ = convert("sharegpt", _write(tmp_path, data), _options(tiny_tokenizer_dir))
    sessions = trace.requests.sort("request_id")["session_id"].to_list()
    assert sessions == ["a", "a#1", "2", "2#3", "4", "5", "7"]


@pytest.mark.parametrize("layout", ["one document", "json lines"])
def test_a_repeated_key_is_refused_not_read_as_its_last_value(tmp_path: Path, tiny_tokenizer_dir: Path,
                                                              layout: str) -> None:
    """A turn whose "value" is given twice became its second text without a word (json keeps the last value)."""
    turn = '{"from": "human", "value": "hello there", "value": "bye"}'
    conversation = '{"id": "a", "conversations": [' + turn + ', {"from": "gpt", "value": "hi"}]}'
    path = tmp_path / "sharegpt.json"
    path.write_text(f"[{conversation}]" if layout == "one document" else f'{{"id": "b", "conversations": []}}\n'
                    f"{conversation}\n")
    where = "sharegpt.json" if layout == "one document" else "sharegpt.json: line 2"
    with pytest.raises(TraceError, match=rf"{where}: key 'value' appears twice in one object; expected each key once"):
        convert("sharegpt", path, _options(tiny_tokenizer_dir))


def test_an_lmsys_conversation_id_names_the_session(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    """lmsys-chat-1m exports name a conversation by "conversation_id" (no "id"): the session was its list index."""
    conversation = {"conversation_id": "33f01939a744455c869cb234afca47f1", "model": "vicuna-13b", "turn": 1,
                    "conversation": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "fine"}]}
    trace, _ = convert("sharegpt", _write(tmp_path, [conversation, {**conversation, "id": "x"}]),
                       _options(tiny_tokenizer_dir))
    assert trace.requests.sort("request_id")["session_id"].to_list() == ["33f01939a744455c869cb234afca47f1", "x"]
