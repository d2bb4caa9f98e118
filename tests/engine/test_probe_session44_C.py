"""min_tokens, as vLLM's SamplingParams.min_tokens: the first that many tokens of a request never stop it. The sampler
sets the eos ids' and the request's stop_token_ids' logits to -inf for them (engine.gpu.layers.sampler), the scheduler
does not stop on a stop token among them, and a stop string ends the text only where it ends after their text
(engine.core.detokenizer). The mask must count each row's tokens right under run-ahead (a step launched before the
host has the tokens of the step before) and prepared steps (ModelRunner.NextDecode). The GPU tests (CUDA-graph
decode, run-ahead, the Triton sampling paths) skip without CUDA."""

from __future__ import annotations

import gc
import json
import shutil
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.detokenizer import IncrementalDetokenizer  # noqa: E402
from engine.gpu.layers.sampler import SORT_MAX_ROWS, SamplingRows, sample  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
VOCAB = 512  # conftest's tiny models
EOS = VOCAB - 1
# Half the vocabulary as stop tokens: a row that may stop samples one within a token or two, so a mask one token
# short or one token long changes the tokens.
HALF = frozenset(range(0, VOCAB, 2))


def _llm(model_dir: str, **options) -> LLM:
    """On the CPU unless told (as test_llm_api: 'auto' takes the device machine's GPU, where each LLM left open holds
    most of its memory)."""
    return LLM(model_dir, **{"device": "cpu", "block_size": 16, "max_model_len": 256, "num_gpu_blocks": 64, "seed": 3,
                             **options})


def _prompts(lengths) -> list[list[int]]:
    return [[(3 * i + k) % 500 for k in range(n)] for i, n in enumerate(lengths)]


# ---- SamplingParams ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-1, 17, 1.5, True, "3", None])
def test_min_tokens_is_an_int_from_0_to_max_tokens(value) -> None:
    with pytest.raises(ValueError) as caught:
        SamplingParams(min_tokens=value)
    assert str(caught.value) == f"SamplingParams.min_tokens must be an int from 0 to max_tokens (16), got {value!r}"


def test_min_tokens_up_to_max_tokens_is_taken_as_a_python_int() -> None:
    import numpy as np

    assert SamplingParams().min_tokens == 0
    params = SamplingParams(max_tokens=5, min_tokens=np.int64(5))
    assert params.min_tokens == 5 and type(params.min_tokens) is int
    assert SamplingParams(max_tokens=5, min_tokens=2, n=2, seed=1).sample(1).min_tokens == 2


# ---- the detokenizer's stop strings ------------------------------------------------------------------------------
class _Letters:
    """Token i is the letter chr(ord('a') + i)."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def _text(stop: list[str], min_tokens: int, ids: list[int], chunk: int) -> tuple[str, str | None]:
    detokenizer = IncrementalDetokenizer.of(_Letters(), SamplingParams(stop=stop, min_tokens=min_tokens, max_tokens=20))
    for start in range(0, len(ids), chunk):
        detokenizer.add(ids[start:start + chunk])
    detokenizer.finish()
    return detokenizer.text, detokenizer.stop_string


@pytest.mark.parametrize("chunk", [1, 2, 9])  # a token at a time, or several at once across the min_tokens boundary
def test_a_stop_string_ends_the_text_only_where_it_ends_after_the_first_min_tokens(chunk) -> None:
    abc = [0, 1, 2, 3, 4, 1, 2, 3, 5]  # "abcdebcdf"
    assert _text(["bc"], 0, abc, chunk) == ("a", "bc")
    assert _text(["bc"], 2, abc, chunk) == ("a", "bc")  # "bc" ends with the third token, past the first two
    assert _text(["bc"], 3, abc, chunk) == ("abcde", "bc")  # ends inside the first three: the next one stops it
    assert _text(["cd"], 3, abc, chunk) == ("ab", "cd")  # starts inside them, ends after: as vLLM, it stops
    assert _text(["bc"], 7, abc, chunk) == ("abcdebcdf", None)
    assert _text(["f", "bc"], 7, abc, chunk) == ("abcdebcd", "f")


# ---- the sampler -------------------------------------------------------------------------------------------------
def _seq(num_generated: int, **params) -> SimpleNamespace:
    return SimpleNamespace(sampling_params=SamplingParams(max_tokens=30, **params), num_prompt_tokens=4,
                           num_tokens=4 + num_generated)


def test_rows_short_of_min_tokens_mask_the_eos_and_their_stop_tokens() -> None:
    seqs = [_seq(0), _seq(1, min_tokens=3, stop_token_ids=[7, 600]), _seq(2, min_tokens=3, ignore_eos=True),
            _seq(3, min_tokens=3, temperature=0.0), _seq(0, min_tokens=1, stop_token_ids=[2])]
    rows = SamplingRows(seqs, vocab_size=VOCAB, eos_token_ids=frozenset({EOS, 9}))
    # (row, the number of the token it samples, min_tokens, masked ids): 600 is outside the vocabulary; the eos ids
    # even under ignore_eos, as vLLM masks them; the fourth row's token (its fourth) may stop it
    assert rows.unstoppable == [(1, 2, 3, (7, 9, EOS)), (2, 3, 3, (9, EOS)), (4, 1, 1, (2, 9, EOS))]
    tensors = rows.tensors(5, torch.device("cpu"))
    assert [t.tolist() for t in tensors.masked] == [[1, 1, 1, 2, 2, 4, 4, 4], [7, 9, EOS, 9, EOS, 2, 9, EOS]]
    logits = torch.zeros(5, VOCAB)
    logits[:, [2, 7, 9, EOS]] = 30.0  # the stop tokens lead every row by far
    tokens = sample(logits, tensors).tolist()
    assert tokens[0] in (2, 7, 9, EOS) and tokens[3] in (2, 7, 9, EOS)  # no min_tokens left: not masked
    assert tokens[1] == 2 and tokens[2] in (2, 7) and tokens[4] == 7


def test_without_min_tokens_nothing_is_masked() -> None:
    seqs = [_seq(0, stop_token_ids=[1]), _seq(2, temperature=0.0), _seq(5, min_tokens=5)]
    rows = SamplingRows(seqs, VOCAB, frozenset({EOS}))
    assert rows.unstoppable == [] and rows.tensors(1, torch.device("cpu")).masked is None
    assert rows.advanced().unstoppable == []
    greedy = SamplingRows([_seq(0, temperature=0.0)], VOCAB, frozenset({EOS}))
    assert greedy.all_greedy and greedy.tensors(1, torch.device("cpu")).masked is None


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_advanced_rows_mask_what_rows_read_off_the_sequences_a_token_later_mask(temperature) -> None:
    """Run-ahead and prepared steps sample with ``advanced`` rows, built before the host has the step's tokens: they
    must mask exactly what rows built afresh from the sequences one token on mask, step after step."""
    seqs = [_seq(g, min_tokens=m, temperature=temperature, seed=g or None, stop_token_ids=[3 + g])
            for g, m in ((0, 1), (0, 4), (2, 3), (1, 0), (5, 9))]
    rows = SamplingRows(seqs, VOCAB, frozenset({EOS}))
    for _ in range(10):
        rows = rows.advanced()
        for seq in seqs:
            seq.num_tokens += 1
        fresh = SamplingRows(seqs, VOCAB, frozenset({EOS}))
        assert rows.unstoppable == fresh.unstoppable
        masked, fresh_masked = rows.tensors(1, torch.device("cpu")).masked, fresh.tensors(1, torch.device("cpu")).masked
        assert (masked is None) == (fresh_masked is None)
        if masked is not None:
            assert [t.tolist() for t in masked] == [t.tolist() for t in fresh_masked]
    assert rows.unstoppable == []  # the last row reached its ninth token


# ---- the engine (CPU) --------------------------------------------------------------------------------------------
PROMPT = [(3 * 7 + k) % 500 for k in range(11)]


@pytest.fixture(scope="module")
def eos_third(tiny_qwen3, tmp_path_factory):
    """tiny_qwen3 whose config names as eos the third token the greedy continuation of PROMPT samples; and the
    three tokens."""
    first = _llm(tiny_qwen3[0]).generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    tokens = first[0]["token_ids"]
    assert len(set(tokens) | {EOS}) == 4  # three tokens, none the eos, none twice
    path = tmp_path_factory.mktemp("qwen3-eos-third")
    shutil.copytree(tiny_qwen3[0], path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": tokens[2]}))
    return str(path), tokens


def _greedy(llm: LLM, **params) -> dict:
    return llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12, **params), use_tqdm=False)[0]


def test_an_eos_before_min_tokens_is_not_sampled(eos_third, tiny_qwen3) -> None:
    model_dir, (t1, t2, t3) = eos_third
    llm = _llm(model_dir)
    plain = _greedy(llm)
    assert (plain["token_ids"], plain["finish_reason"]) == ([t1, t2, t3], "stop")
    assert _greedy(llm, min_tokens=0)["token_ids"] == [t1, t2, t3]  # min_tokens=0 changes nothing
    assert _greedy(llm, min_tokens=2)["token_ids"] == [t1, t2, t3]  # the third token may stop it
    held = _greedy(llm, min_tokens=6)["token_ids"]
    assert len(held) >= 6 and t3 not in held[:6] and EOS not in held[:6] and held[:2] == [t1, t2]
    # Its third token is the model's best but the eos ids (the reference's float32 logits, the eos ids -inf)
    logits = tiny_qwen3[1](torch.tensor([PROMPT + [t1, t2]])).logits[0, -1].detach()
    logits[[t3, EOS]] = float("-inf")
    assert held[2] == int(logits.argmax())


def test_a_stop_token_before_min_tokens_does_not_stop(eos_third, tiny_qwen3) -> None:
    _, (t1, t2, t3) = eos_third
    llm = _llm(tiny_qwen3[0])
    stopped = _greedy(llm, stop_token_ids=[t3])
    assert (stopped["token_ids"], stopped["finish_reason"], stopped["stop_reason"]) == ([t1, t2, t3], "stop", t3)
    held = _greedy(llm, stop_token_ids=[t3], min_tokens=6)
    assert len(held["token_ids"]) >= 6 and t3 not in held["token_ids"][:6]


def _serve_all(llm: LLM, params: list[SamplingParams]) -> list:
    prompts = _prompts((5, 14, 15, 30, 9, 21))
    return [(o["token_ids"], o["finish_reason"]) for o in llm.generate(prompts, params, use_tqdm=False)]


def _half_stopped_params() -> list[SamplingParams]:
    """Rows of every kind (greedy, seeded, unseeded, top-k) whose min_tokens end mid-decode."""
    kinds = [dict(temperature=0.0), dict(temperature=0.8, seed=11), dict(temperature=0.9),
             dict(temperature=0.7, top_k=40, seed=5), dict(temperature=0.0), dict(temperature=1.0, top_p=0.9, seed=2)]
    return [SamplingParams(max_tokens=40, min_tokens=m, stop_token_ids=HALF, **kind)
            for m, kind in zip((7, 12, 18, 25, 0, 31), kinds)]


def _check_half_stopped(outcome: list, params: list[SamplingParams]) -> None:
    """No stop token among a row's first min_tokens; a row that stopped did so on one, past them."""
    for (tokens, reason), p in zip(outcome, params):
        assert not HALF.intersection(tokens[:p.min_tokens])
        if reason == "stop":
            assert (tokens[-1] in HALF or tokens[-1] == EOS) and len(tokens) > p.min_tokens
        else:
            assert (reason, len(tokens)) == ("length", p.max_tokens)


def test_run_ahead_and_prepared_steps_mask_as_steps_planned_afresh(tiny_qwen3) -> None:
    params = _half_stopped_params()
    fresh = _llm(tiny_qwen3[0], run_ahead=False)
    fresh.runner.prepare_ahead = False  # every step's rows read off the sequences
    expected = _serve_all(fresh, params)
    _check_half_stopped(expected, params)
    assert [reason for _, reason in expected] == ["stop"] * len(params)  # each row's boundary was met
    assert fresh.runner.timings.num_prepared_steps == fresh.runner.timings.num_ran_ahead_steps == 0
    prepared = _llm(tiny_qwen3[0], run_ahead=False)
    assert _serve_all(prepared, params) == expected
    assert prepared.runner.timings.num_prepared_steps > 20
    ahead = _llm(tiny_qwen3[0], run_ahead=True)
    assert _serve_all(ahead, params) == expected
    assert ahead.runner.timings.num_ran_ahead_steps > 20


# ---- the GPU: CUDA-graph decode, run-ahead, the Triton sampling paths ---------------------------------------------
def _serve_on_gpu(model_dir: str, params: list[SamplingParams], *, run_ahead: bool, prepare_ahead: bool):
    """The outcome and the runner's timings of an LLM on the GPU, closed after (it holds most of the memory)."""
    llm = _llm(model_dir, device="cuda", run_ahead=run_ahead)
    try:
        llm.runner.prepare_ahead = prepare_ahead
        return _serve_all(llm, params), llm.runner.timings
    finally:
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


@CUDA
def test_gpu_graph_decode_and_run_ahead_mask_as_steps_planned_afresh(tiny_qwen3) -> None:
    params = _half_stopped_params()
    expected, _ = _serve_on_gpu(tiny_qwen3[0], params, run_ahead=False, prepare_ahead=False)
    _check_half_stopped(expected, params)
    outcome, timings = _serve_on_gpu(tiny_qwen3[0], params, run_ahead=True, prepare_ahead=True)
    assert outcome == expected
    assert timings.num_ran_ahead_steps > 20 and timings.num_graph_steps > 20


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize(("rows", "temperature", "top_k"), [
    (8, 0.0, -1),  # argmax
    (8, 0.8, -1),  # one Gumbel-max pass (CUDA: the Triton kernel)
    (SORT_MAX_ROWS, 0.8, 20),  # filters by a sort
    (SORT_MAX_ROWS + 16, 0.8, 20),  # filters (CUDA: by floors, the Triton search)
])
def test_sampling_paths_draw_as_if_the_masked_logits_were_minus_inf(device, rows, temperature, top_k) -> None:
    """The masked tokens lead every row by far: each path draws what it draws from logits where they are -inf."""
    generator = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, VOCAB, generator=generator).to(device)
    stop = [3, 50, EOS]
    logits[:, stop] = 30.0
    # The odd rows sample their second token under min_tokens 2: masked; the even ones have none.
    seqs = [_seq(r % 2, min_tokens=2 * (r % 2), stop_token_ids=stop[:2], temperature=temperature, top_k=top_k,
                 seed=r) for r in range(rows)]
    params = SamplingRows(seqs, VOCAB, frozenset({EOS})).tensors(9, torch.device(device))
    assert params.masked is not None
    expected_logits = logits.clone()
    expected_logits[1::2, stop] = float("-inf")
    unmasked = SamplingRows([_seq(r % 2, temperature=temperature, top_k=top_k, seed=r) for r in range(rows)], VOCAB)
    expected = sample(expected_logits, unmasked.tensors(9, torch.device(device))).tolist()
    tokens = sample(logits, params).tolist()
    assert tokens == expected
    assert all(t not in stop for t in tokens[1::2]) and all(t in stop for t in tokens[0::2])
