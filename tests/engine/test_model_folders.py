"""Hostile model folders: a config.json whose sizes disagree with its checkpoint, a checkpoint of another kind, a
missing LM head, a tokenizer that cannot load. Each is refused in one line that names the file and the tensor or key;
they were cut to fit without a word (other tokens than the model's), ran on an uninitialised LM head, or failed deep
in torch or transformers in messages of several lines that named neither."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.model_config import ModelShape  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _variant(source: str, dest, config: dict | None = None, tensors: dict | None = None, drop=()) -> str:
    """A copy of the model folder ``source`` with config.json keys replaced (None removes one) and tensors replaced
    (None removes one)."""
    shutil.copytree(source, dest)
    if config:
        path = dest / "config.json"
        cfg = json.loads(path.read_text())
        for key, value in config.items():
            if value is None:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        path.write_text(json.dumps(cfg))
    if tensors:
        path = dest / "model.safetensors"
        weights = safetensors_torch.load_file(str(path))
        for key, value in tensors.items():
            if value is None:
                weights.pop(key)
            else:
                weights[key] = value
        safetensors_torch.save_file(weights, str(path))
    for name in drop:
        (dest / name).unlink()
    return str(dest)


def _refusal(model_dir: str) -> str:
    with pytest.raises(ValueError) as info:
        LLM(model_dir, device="cpu", max_model_len=128)
    message = str(info.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("config, tensors, expected", [
    # cut to fit: the first 64 of 128 rows of gate/up, the first 256 of 512 embedding rows (other tokens, no word)
    ({"intermediate_size": 64}, None, "'model.layers.0.mlp.down_proj.weight' has shape (64, 128); the sizes in "
                                      "config.json give (64, 64)"),
    ({"vocab_size": 256, "eos_token_id": 255}, None, "'model.embed_tokens.weight' has shape (512, 64); the sizes in "
                                                    "config.json give (256, 64)"),
    # failed in torch: "start (0) + length (1024) exceeds dimension size (512)", "shape mismatch: parameter (32,)"
    ({"vocab_size": 1024}, None, "'model.embed_tokens.weight' has shape (512, 64)"),
    ({"head_dim": 32}, None, "has shape (16,); the sizes in config.json give (32,)"),
    (None, {"model.layers.0.self_attn.q_proj.weight": torch.zeros(32, 64)},
     "'model.layers.0.self_attn.q_proj.weight' has shape (32, 64); the sizes in config.json give (64, 64)"),
    (None, {"model.layers.1.self_attn.o_proj.weight": torch.zeros(64, 32)}, "'model.layers.1.self_attn.o_proj.weight'"),
    # broadcast by copy_ into every row, without a word
    (None, {"model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 1)}, "has shape (32, 1)"),
    # an integer (quantized) tensor was converted to floats as if it held weights
    (None, {"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 64, dtype=torch.int8)},
     "'model.layers.0.mlp.up_proj.weight' is int8; expected floating-point weights"),
    # an untied model without lm_head.weight ran on an uninitialised head: every token 0
    ({"tie_word_embeddings": False}, None, "lacks 1 parameters, e.g. ['lm_head.weight'] (config.json's "
                                           "tie_word_embeddings is false)"),
])
def test_a_checkpoint_that_disagrees_with_its_config_is_refused_by_tensor(tiny_qwen3, tmp_path, config, tensors,
                                                                          expected):
    # without generation_config.json, whose eos id 511 a smaller vocabulary would refuse before the tensors are read
    model_dir = _variant(tiny_qwen3[0], tmp_path / "m", config, tensors, drop=("generation_config.json",))
    message = _refusal(model_dir)
    assert expected in message, message
    assert message.startswith(model_dir), message


@pytest.mark.parametrize("cut", ["half", "foreign"])
def test_a_file_that_is_not_safetensors_is_named(tiny_qwen3, tmp_path, cut):
    """A truncated or foreign *.safetensors was "SafetensorError: Error while deserializing header: header too large",
    which named no file (a sharded checkpoint has many)."""
    model_dir = _variant(tiny_qwen3[0], tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2] if cut == "half" else b"not a checkpoint")
    message = _refusal(model_dir)
    assert message.startswith(f"{path}: not a readable safetensors file ("), message


def test_an_untied_checkpoint_with_its_lm_head_still_loads(tiny_qwen2, tmp_path):
    outputs = LLM(tiny_qwen2[0], device="cpu", max_model_len=128).generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert len(outputs[0]["token_ids"]) == 4


def test_a_tied_models_lm_head_in_a_later_shard_is_skipped_as_in_vllm(tiny_qwen3, tmp_path):
    """A tied model's head is its embedding, one parameter: a checkpoint's lm_head.weight was loaded into it, and
    from a shard after the embedding's it replaced the embedding too (other tokens, without a word). vLLM skips it;
    a copy of the embedding still loads (one that differs is refused: test_probe_session29_a)."""
    model_dir, _ = tiny_qwen3
    dest = tmp_path / "sharded"
    shutil.copytree(model_dir, dest)
    weights = safetensors_torch.load_file(str(dest / "model.safetensors"))
    (dest / "model.safetensors").unlink()
    safetensors_torch.save_file(weights, str(dest / "model-00001-of-00002.safetensors"))
    head = weights["model.embed_tokens.weight"].clone()
    safetensors_torch.save_file({"lm_head.weight": head}, str(dest / "model-00002-of-00002.safetensors"))
    prompts = [[1, 2, 3, 4], [7, 8, 9]]
    expected = LLM(model_dir, device="cpu", max_model_len=128).generate(prompts, GREEDY, use_tqdm=False)
    outputs = LLM(str(dest), device="cpu", max_model_len=128).generate(prompts, GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in expected]


@pytest.mark.parametrize("extra, expected", [
    ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' is 'false'; expected true or false"),  # was truthy
    ({"attention_bias": 1}, "'attention_bias' is 1; expected true or false"),
    ({"quantization_config": {"quant_method": "fp8"}}, "'quantization_config' asks for 'fp8' quantization"),
    # a KeyError and a TypeError when the model was built, taken by the simulator; equal factors gave NaN frequencies
    ({"rope_scaling": {"rope_type": "llama3"}}, "rope scaling's 'factor' is None; expected a finite number > 0"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": "8", "original_max_position_embeddings": 64}},
     "rope scaling's 'factor' is '8'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 64,
                       "low_freq_factor": 4, "high_freq_factor": 4}}, "'high_freq_factor' (4) is not above"),

    # transformers 5's place for it: 0 was read as "unset" and became 10000 without a word
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_parameters' 'rope_theta' is 0; expected a"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": False}}, "'rope_theta' is False; expected a finite"),
])
def test_config_values_of_the_wrong_kind_are_refused_by_key(extra, expected):
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512}
    with pytest.raises(ValueError) as info:
        ModelShape.from_config_dict({**base, **extra}, name="m", source="m/config.json")
    assert str(info.value).startswith("m/config.json: ") and expected in str(info.value)


def test_qwen2_has_its_qkv_biases_whatever_attention_bias_says(tiny_qwen2, tmp_path):
    """transformers and vLLM build Qwen2's q/k/v biases unconditionally: "attention_bias": false built a model
    without them, and its checkpoint was refused ('q_proj.bias' matches no model parameter)."""
    model_dir, model = tiny_qwen2
    reference = LLM(model_dir, device="cpu", max_model_len=128).generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    variant = _variant(model_dir, tmp_path / "m", {"attention_bias": False})
    outputs = LLM(variant, device="cpu", max_model_len=128).generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert outputs[0]["token_ids"] == reference[0]["token_ids"]


def test_generation_configs_eos_ids_stop_as_in_vllm(tiny_qwen3, tmp_path):
    """Instruct models list more end-of-sequence ids in generation_config.json than in config.json (Qwen's
    <|endoftext|> beside <|im_end|>); vLLM stops on them all. An answer that ended with one ran on to max_tokens."""
    model_dir = tiny_qwen3[0]
    free = LLM(model_dir, device="cpu", max_model_len=128).generate(
        [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0]["token_ids"]
    variant = _variant(model_dir, tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [511, free[2]]}))
    out = LLM(variant, device="cpu", max_model_len=128).generate(
        [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0]
    assert out["token_ids"] == free[:free.index(free[2]) + 1] and out["finish_reason"] == "stop"
    (tmp_path / "m" / "generation_config.json").write_text('{"eos_token_id": "x"}')
    message = _refusal(variant)
    assert message.startswith(f"{variant}/generation_config.json: 'eos_token_id' is 'x'"), message


def test_a_tokenizer_that_cannot_load_is_one_line_naming_the_folder(tmp_path):
    """A tokenizer_config.json without its tokenizer.json was transformers' five lines on converting slow
    tokenizers."""
    from tests.engine.test_server_openai import make_tiny_model_with_tokenizer

    model_dir = make_tiny_model_with_tokenizer(tmp_path / "full")
    variant = _variant(model_dir, tmp_path / "m", drop=("tokenizer.json",))
    message = _refusal(variant)
    assert message.startswith(f"{variant}: its tokenizer cannot be loaded: "), message
