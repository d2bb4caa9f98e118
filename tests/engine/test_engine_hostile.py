"""Hostile and unusual-but-valid input to the engine's entry points (``engine.LLM`` and ``python -m engine.replay``):
each bad value is refused by name before any work, each valid one gives checkable results."""

from __future__ import annotations

import json

import polars as pl
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cli.engine_replay import main as replay_main  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402
from tests.traces.helpers import cli_error  # noqa: E402

MAX_MODEL_LEN = 128
BLOCK_SIZE = 16
NUM_BLOCKS = 4  # 64 tokens of KV: small enough that one long prompt can never fit
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13]]


@pytest.fixture(scope="module")
def llm(tiny_qwen3):
    path, _ = tiny_qwen3
    return LLM(path, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN, num_gpu_blocks=NUM_BLOCKS, device="cpu")


def _generate(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


# ---- the Python API ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("top_k", [-2, -100])
def test_top_k_below_minus_one_is_refused_by_name(top_k):
    """-5 was taken as 'no top-k' without a word; vLLM and our own server refuse it."""
    with pytest.raises(ValueError, match=r"SamplingParams\.top_k must be -1 or 0 \(off\) or >= 1"):
        SamplingParams(top_k=top_k)


@pytest.mark.parametrize("top_k", [-1, 0, 1, 10**30])
def test_top_k_off_or_positive_is_accepted(top_k):
    assert SamplingParams(top_k=top_k).top_k == top_k


@pytest.mark.parametrize("bad_id", [-1, 512, 10**30])
def test_stop_token_ids_outside_the_vocabulary_are_refused(llm, bad_id):
    """An id no sampler can produce stopped nothing: the request ran to max_tokens as if no stop id were given."""
    with pytest.raises(ValueError, match=rf"^sampling_params\.stop_token_ids has {bad_id}, outside the vocabulary"):
        _generate(llm, PROMPTS, SamplingParams(max_tokens=2, stop_token_ids=[3, bad_id]))
    params = [SamplingParams(max_tokens=2)] * 3 + [SamplingParams(max_tokens=2, stop_token_ids=[bad_id])]
    with pytest.raises(ValueError, match=r"^sampling_params\[3\]\.stop_token_ids"):
        _generate(llm, PROMPTS, params)
    assert not llm.engine.has_unfinished_requests()  # nothing of the refused calls was queued


def test_a_valid_stop_token_stops_at_its_first_occurrence(llm):
    greedy = _generate(llm, [PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    stop = greedy["token_ids"][3]
    out = _generate(llm, [PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]))[0]
    assert out["token_ids"] == greedy["token_ids"][: greedy["token_ids"].index(stop) + 1]
    assert out["finish_reason"] == "stop"


def test_model_of_the_wrong_type_is_a_value_error():
    """LLM(None) was a TypeError from pathlib that named no parameter."""
    with pytest.raises(ValueError, match="^model must be"):
        LLM(None, device="cpu")


def test_model_that_is_a_file_says_so(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match="is a file; expected a model folder holding config.json"):
        LLM(str(path), device="cpu")


def test_greedy_rows_of_a_mixed_batch_equal_a_greedy_only_run(llm):
    greedy = [o["token_ids"] for o in _generate(llm, PROMPTS, GREEDY)]
    sampled = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=1)
    filtered = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=11, ignore_eos=True, seed=2)
    params = [GREEDY, sampled, GREEDY, filtered]
    first = _generate(llm, PROMPTS, params)
    assert [first[i]["token_ids"] for i in (0, 2)] == [greedy[0], greedy[2]]
    assert [len(o["token_ids"]) for o in first] == [8, 8, 8, 11]
    assert all(o["finish_reason"] == "length" for o in first)
    again = _generate(llm, PROMPTS, params)  # seeded rows repeat, whatever ran beside them
    assert [o["token_ids"] for o in again] == [o["token_ids"] for o in first]
    alone = _generate(llm, [PROMPTS[1]], sampled)[0]
    assert alone["token_ids"] == first[1]["token_ids"]


def test_a_prompt_that_can_never_fit_the_kv_cache_is_rejected_with_a_reason(llm):
    too_long = [1] * (NUM_BLOCKS * BLOCK_SIZE + 1)
    with pytest.raises(ValueError, match="prompt 1 cannot be served: prompt needs 5 KV blocks of 16 tokens, the cache "
                                         "has 4"):
        _generate(llm, [[1, 2], too_long], GREEDY)
    assert not llm.engine.has_unfinished_requests()
    assert _generate(llm, [[1, 2]], GREEDY)[0]["finish_reason"] == "length"  # the engine serves on


def test_output_beyond_the_kv_cache_is_cut_and_says_so(llm):
    prompt = [3] * (NUM_BLOCKS * BLOCK_SIZE - 4)
    out = _generate(llm, [prompt], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert out["finish_reason"] == "kv_capacity" and len(out["token_ids"]) == 4


def test_huge_max_tokens_is_cut_at_max_model_len_and_says_so(tiny_qwen3):
    path, _ = tiny_qwen3
    roomy = LLM(path, block_size=BLOCK_SIZE, max_model_len=32, device="cpu")
    out = roomy.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2**70, ignore_eos=True),
                         use_tqdm=False)[0]
    assert out["finish_reason"] == "max_model_len" and len(out["token_ids"]) == 32 - 3


def test_cuda_ordinal_beyond_the_devices_is_refused(monkeypatch):
    """cuda:3 on a one-GPU host failed in torch ('invalid device ordinal'); with no GPU the message said 'cuda'."""
    from engine.gpu.model_runner import resolve_device
    from engine.options import EngineOptions

    with pytest.raises(ValueError, match="^device='cuda:3' was asked for but torch sees no CUDA device"):
        resolve_device(EngineOptions(device="cuda:3"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"torch sees 1 CUDA device\(s\), cuda:0 to cuda:0"):
        resolve_device(EngineOptions(device="cuda:3"))
    assert resolve_device(EngineOptions(device="cuda:0")).index == 0


# ---- python -m engine.replay ---------------------------------------------------------------------------------------
@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.parquet"
    pl.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.0, 0.01], "prompt_tokens": [5, 600, 6],
                  "output_tokens": [3, 4, 10**9]}).write_parquet(path)
    return path


@pytest.mark.parametrize(("args", "pattern"), [
    (["--max-num-seqs", "nan"], "error: argument --max-num-seqs: invalid int value: 'nan'"),
    (["--num-gpu-blocks", "1e400"], "error: argument --num-gpu-blocks: invalid int value: '1e400'"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
])
def test_engine_replay_usage_errors_are_one_line(trace, tmp_path, capsys, args, pattern):
    """argparse printed its whole usage (some 25 lines) above the line that said what was wrong."""
    out = tmp_path / "out"
    argv = [str(trace), "--model", "qwen3-0.6b", "--device", "cpu", "--out", str(out), *args]
    with pytest.raises(SystemExit) as exc:
        replay_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith(pattern), err
    assert not out.exists()


def test_engine_replay_model_that_is_a_file(trace, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [str(trace), "--model", str(trace), "--device", "cpu", "--out", str(out)]
    assert f"error: model {trace} is a file" in cli_error(replay_main, argv, capsys)
    assert not out.exists()


def test_engine_replay_rejects_and_cuts_with_reasons(tiny_qwen3, trace, tmp_path, capsys):
    """A prompt beyond max_model_len is rejected with its reason and counted; an output of 10**9 tokens is cut at
    max_model_len, and the run says so."""
    path, _ = tiny_qwen3
    out = tmp_path / "out"
    argv = [str(trace), "--model", path, "--device", "cpu", "--warmup-requests", "0", "--max-model-len", "64",
            "--block-size", "16", "--no-report", "--quiet", "--out", str(out)]
    assert replay_main(argv) == 0
    rows = {r["request_id"]: r for r in pl.read_parquet(out / "requests.parquet").to_dicts()}
    assert rows["0"]["finish_reason"] == "length" and rows["0"]["output_tokens"] == 3
    assert rows["1"]["finish_reason"] == "rejected" and "more than max_model_len=64" in rows["1"]["reject_reason"]
    assert rows["2"]["finish_reason"] == "max_model_len" and rows["2"]["output_tokens"] == 64 - 6
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_rejected"] == 1 and summary["num_cut"] == 1
    assert summary["finish_reasons"] == {"length": 1, "rejected": 1, "max_model_len": 1}
