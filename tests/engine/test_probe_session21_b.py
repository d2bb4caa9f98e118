"""Hostile input to the engine (session 21, probe B): each test failed before its fix."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.model_config import ModelShape  # noqa: E402
from tests.engine.test_model_folders import GREEDY, _refusal, _variant  # noqa: E402


# ---- an end-of-sequence id the model can never sample ---------------------------------------------------------------
def test_an_eos_id_outside_the_vocabulary_in_config_json_is_refused(tiny_qwen3, tmp_path):
    """config.json's eos_token_id 512 of a 512-token vocabulary was taken: no generation ever stopped at eos."""
    variant = _variant(tiny_qwen3[0], tmp_path / "m", {"eos_token_id": [511, 512]})
    assert _refusal(variant) == (f"{variant}/config.json: 'eos_token_id' has 512, outside the vocabulary [0, 512) "
                                 "(vocab_size); it could never end a generation")
    # the simulator reads the same shape (torch-free)
    with pytest.raises(ValueError, match=r"^m/config.json: 'eos_token_id' has 600, outside the vocabulary"):
        ModelShape.from_config_dict({**json.loads((tmp_path / "m" / "config.json").read_text()), "eos_token_id": 600},
                                    name="m", source="m/config.json")


def test_an_eos_id_outside_the_vocabulary_in_generation_config_json_is_refused(tiny_qwen3, tmp_path):
    variant = _variant(tiny_qwen3[0], tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": 10**6}))
    assert _refusal(variant) == (f"{variant}/generation_config.json: 'eos_token_id' has 1000000, outside the "
                                 "vocabulary [0, 512) (vocab_size); it could never end a generation")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [511]}))
    LLM(variant, device="cpu", max_model_len=128)  # the last id of the vocabulary is one


def test_a_tokenizer_whose_eos_is_outside_the_models_vocabulary_is_refused(tmp_path):
    """A tokenizer of another model (its eos id 520 past a 512-token vocabulary) was added to the eos ids silently."""
    from tests.engine.test_server_openai import make_tiny_model_with_tokenizer

    model_dir = make_tiny_model_with_tokenizer(tmp_path / "full")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": [f"<x{i}>" for i in range(10)] + ["<end>"]})
    tokenizer.eos_token = "<end>"
    tokenizer.save_pretrained(model_dir)
    assert tokenizer.eos_token_id == 520
    assert _refusal(model_dir) == (f"{model_dir}: the tokenizer's eos_token ('<end>') has id 520, outside the model's "
                                   "vocabulary [0, 512) (config.json's vocab_size); the tokenizer does not belong to "
                                   "this model")


# ---- a head dimension rotary embeddings cannot turn -----------------------------------------------------------------
@pytest.mark.parametrize("extra, expected", [
    # every request finished with "error" (a shape error in the rotary embedding, a traceback logged per step)
    ({"head_dim": 15}, "'head_dim' is 15; rotary embeddings need an even head dimension"),
    # Qwen2's (and Llama's) head dimension without a head_dim: Qwen3's is transformers' 128 (test_probe_session30_a)
    ({"head_dim": None, "hidden_size": 60, "architectures": ["Qwen2ForCausalLM"]}, "'hidden_size' (60) // "
        "'num_attention_heads' (4) is 15; without a 'head_dim' that is the head dimension, and rotary embeddings need "
        "an even one"),
    # was "'head_dim' is 0; expected an integer >= 1", of a key the file does not have
    ({"head_dim": None, "hidden_size": 2, "num_key_value_heads": 4, "architectures": ["LlamaForCausalLM"]},
        "'hidden_size' (2) // 'num_attention_heads' (4) is 0; without a 'head_dim' that is the head dimension, and "
        "rotary embeddings need an even one"),
])
def test_an_odd_head_dimension_is_refused_naming_where_it_comes_from(tiny_qwen3, extra, expected):
    config = json.loads(open(f"{tiny_qwen3[0]}/config.json").read())
    config = {k: v for k, v in {**config, **extra}.items() if v is not None}
    with pytest.raises(ValueError) as info:
        ModelShape.from_config_dict(config, name="m", source="m/config.json")
    assert str(info.value) == f"m/config.json: {expected}"


def test_an_odd_head_dimension_is_refused_before_the_engine_runs(tiny_qwen3, tmp_path):
    variant = _variant(tiny_qwen3[0], tmp_path / "m", {"head_dim": 15})
    with pytest.raises(ValueError) as info:
        LLM(variant, device="cpu", max_model_len=128, load_format="dummy")
    assert str(info.value) == f"{variant}/config.json: 'head_dim' is 15; rotary embeddings need an even head dimension"


# ---- vLLM's prompt dicts, and unordered collections -----------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3_llm(tiny_qwen3):
    return LLM(tiny_qwen3[0], device="cpu", max_model_len=128)


def _ids(llm, prompts, max_tokens=3):
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                           use_tqdm=False)
    return [o["token_ids"] for o in outputs]


def test_vllms_token_prompt_dict_is_its_token_ids(qwen3_llm):
    """{"prompt_token_ids": [1, 2, 3]} was iterated as its keys: one prompt, the text "prompt_token_ids" (a model
    without a tokenizer refused it as text; with one it answered another prompt without a word); in a list,
    "prompt 0 has token id 'prompt_token_ids'"."""
    expected = _ids(qwen3_llm, [[1, 2, 3], [4, 5]])
    assert _ids(qwen3_llm, {"prompt_token_ids": [1, 2, 3]}) == expected[:1]
    assert _ids(qwen3_llm, [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": (4, 5)}]) == expected


@pytest.mark.parametrize("prompts, message", [
    # {1: 2} was the prompt [1]
    ({1: 2}, "prompt 0 is a dict with keys ['1']; expected one key, 'prompt' (text) or 'prompt_token_ids' (as "
             "vLLM's prompt dicts; their other keys are not supported)"),
    ([{"prompt_token_ids": [1], "multi_modal_data": {}}], "prompt 0 is a dict with keys ['multi_modal_data', "
        "'prompt_token_ids']; expected one key, 'prompt' (text) or 'prompt_token_ids' (as vLLM's prompt dicts; their "
        "other keys are not supported)"),
    ([[1], {"prompt": [1, 2]}], "prompt 1's 'prompt' is [1, 2]; expected a string"),
    ({"prompt_token_ids": "abc"}, "prompt 0's 'prompt_token_ids' is 'abc'; expected a list of token ids"),
    ({"prompt_token_ids": {"prompt": "x"}}, "prompt 0 is {'prompt': 'x'}; expected a string or a list of token ids"),
    # a set's order is not the caller's: {5, 3} was the prompt [3, 5], in the set's order
    ({5, 3}, "prompts is {3, 5}; expected a string or a list of token ids, or a list of those"),
    ([{5, 3}], "prompt 0 is {3, 5}; expected a string or a list of token ids"),
])
def test_other_dicts_and_sets_are_refused(qwen3_llm, prompts, message):
    with pytest.raises(ValueError) as info:
        qwen3_llm.generate(prompts, use_tqdm=False)
    assert str(info.value) == message
    assert not qwen3_llm.engine.has_unfinished_requests()


def test_vllms_text_prompt_dict_is_its_text(tmp_path):
    from tests.engine.test_server_openai import make_tiny_model_with_tokenizer

    llm = LLM(make_tiny_model_with_tokenizer(tmp_path / "m"), device="cpu", max_model_len=128)
    assert _ids(llm, {"prompt": "w1x7 w2x1"}) == _ids(llm, ["w1x7 w2x1"])
    assert _ids(llm, {"prompt": "w1x7 w2x1"}) != _ids(llm, ["prompt"])  # was the text of its key


# ---- which *.safetensors files hold the checkpoint ------------------------------------------------------------------
def _shard(model_dir, *, stale: bool = False, drop_second: bool = False, index: object = None) -> None:
    """The folder's model.safetensors split in two shards with their model.safetensors.index.json (``index`` replaces
    the index's content); ``stale``: a model.safetensors of an earlier save left beside them, its final norm zeros."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model_dir / "model.safetensors"))
    (model_dir / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(model_dir / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map} if index is None else index))
    if stale:
        save_file({"model.norm.weight": torch.zeros_like(weights["model.norm.weight"])},
                  str(model_dir / "model.safetensors"))
    if drop_second:
        (model_dir / "model-00002-of-00002.safetensors").unlink()


def test_a_stale_file_beside_indexed_shards_is_not_loaded(tiny_qwen3, tmp_path):
    """Every *.safetensors was loaded: a stale model.safetensors (sorted after the shards) overwrote the final norm
    with zeros, and the model answered token 0 to everything, without a word. vLLM loads what the index names."""
    reference = LLM(tiny_qwen3[0], device="cpu", max_model_len=128).generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    variant = _variant(tiny_qwen3[0], tmp_path / "m")
    _shard(tmp_path / "m", stale=True)
    outputs = LLM(variant, device="cpu", max_model_len=128).generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert outputs[0]["token_ids"] == reference[0]["token_ids"]


def test_a_tensor_in_two_files_without_an_index_is_refused(tiny_qwen3, tmp_path):
    from safetensors.torch import save_file

    variant = _variant(tiny_qwen3[0], tmp_path / "m")
    save_file({"model.norm.weight": torch.zeros(64)}, str(tmp_path / "m" / "model-old.safetensors"))
    assert _refusal(variant) == (f"{variant}/model.safetensors: checkpoint tensor 'model.norm.weight' is in "
                                 "model-old.safetensors too; expected each tensor in one file (a stale file beside "
                                 "the shards? model.safetensors.index.json names the files to load)")


@pytest.mark.parametrize("shard, expected", [
    # was "checkpoint lacks 7 parameters, e.g. [...]", which named no file
    ({"drop_second": True}, "model.safetensors.index.json: maps tensors to model-00002-of-00002.safetensors, which is "
                            "not in {variant} (a shard missing from the download?)"),
    ({"index": []}, "model.safetensors.index.json: top level is a JSON array; expected an object"),
    ({"index": {"weight_map": {"a": 1}}}, "model.safetensors.index.json: 'weight_map' is {'a': 1}; expected an object "
                                          "mapping tensor names to the *.safetensors files that hold them"),
])
def test_a_bad_or_incomplete_index_is_named(tiny_qwen3, tmp_path, shard, expected):
    variant = _variant(tiny_qwen3[0], tmp_path / "m")
    _shard(tmp_path / "m", **shard)
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        LLM(variant, device="cpu", max_model_len=128)
    assert str(info.value) == f"{variant}/" + expected.replace("{variant}", variant)


# ---- a stream whose requests another caller's steps ran -------------------------------------------------------------
def _collect(events) -> dict[int, tuple[list[int], str | None]]:
    out: dict[int, tuple[list[int], str | None]] = {}
    for event in events:
        tokens, reason = out.get(event.index, ([], None))
        assert reason is None, f"an event after prompt {event.index} finished"
        out[event.index] = (tokens + event.new_token_ids, event.finish_reason if event.finished else None)
    return out


def test_a_stream_reports_what_a_generate_between_its_events_produced(qwen3_llm):
    """generate() while a stream waited between events ran the stream's request to its end too: the stream then
    ended with nothing more, its last tokens and its finished event lost (it looked only at its own steps' batches)."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    expected = _ids(qwen3_llm, [[7, 8], [1, 2, 3]], max_tokens=4)
    stream = qwen3_llm.stream([[7, 8]], params)
    first = next(stream)
    assert first.new_token_ids == expected[0][:1] and not first.finished
    assert _ids(qwen3_llm, [[1, 2, 3]], max_tokens=4) == expected[1:]
    rest = _collect(stream)
    assert first.new_token_ids + rest[0][0] == expected[0] and rest[0][1] == "length"
    assert not qwen3_llm.engine.has_unfinished_requests()


def test_two_streams_read_in_turn_each_get_every_token_and_their_end(qwen3_llm):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2, 5)]
    expected = _ids(qwen3_llm, [[7, 8]], max_tokens=2) + _ids(qwen3_llm, [[1, 2, 3]], max_tokens=5)
    a = qwen3_llm.stream([[7, 8]], params[0])
    b = qwen3_llm.stream([[1, 2, 3]], params[1])
    events_a, events_b = [next(a)], [next(b)]  # both queued; each one's steps now run the other's request too
    for stream, events in ((b, events_b), (b, events_b), (a, events_a), (b, events_b)):
        events.append(next(stream, None))
    got_a, got_b = _collect(e for e in events_a + list(a) if e), _collect(e for e in events_b + list(b) if e)
    assert got_a == {0: (expected[0], "length")}
    assert got_b == {0: (expected[1], "length")}
