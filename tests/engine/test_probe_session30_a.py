"""Probe of config.json settings of Qwen3, Qwen2 and Llama against transformers 5: the same greedy tokens, or one line.

Found:
- llama3 rope scaling without low_freq_factor or high_freq_factor ran on Llama 3.1's 1 and 4; transformers refuses the
  config (KeyError "Missing required keys"). Refused now in one line naming the key.
- A Qwen3 config.json without head_dim is 128 in transformers (Qwen3Config's default), not hidden_size //
  num_attention_heads: the engine derived it and refused transformers' checkpoint by a k_norm shape that "config.json
  gives". A Qwen2/Qwen3 one without num_key_value_heads is 32 there (a null one is num_attention_heads): the engine took
  num_attention_heads. Both now as transformers reads them; a null Qwen head_dim (transformers refuses it) is one line.
- llama3 scaling with a partial_rotary_factor below 1 (top level or in the rope object): transformers fails on it (a
  shape error), the engine ran the whole head. Refused now in one line.
- Qwen2/Qwen3 with "mlp_bias": true were refused; transformers builds their MLPs without biases whatever it says.

Matched as they were (in the report, not pinned here): default rope with partial_rotary_factor (ignored by both),
attention_bias on Llama/Qwen3, Qwen2's "attention_bias": false, hidden_act swish, no tie_word_embeddings, no
rms_norm_eps, dtype beside torch_dtype, head_dim for Qwen2/Llama. Refused in one line as they were: linear, dynamic,
yarn and longrope rope, hidden_act gelu, Llama's mlp_bias, a prompt past max_position_embeddings.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine.core.model_config import ModelShape  # noqa: E402
from tests.engine.test_probe_session29_a import (  # noqa: E402
    LLAMA3,
    LLAMA_2,
    LLAMA_3_2,
    QWEN2_5,
    QWEN3,
    _folder,
    _greedy_pair,
)


def _without(config: dict, *keys: str) -> dict:
    return {k: v for k, v in config.items() if k not in keys}


def _refusal(config: dict) -> str:
    with pytest.raises(ValueError) as info:
        ModelShape.from_config_dict(config, name="m", source="m/config.json")
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("missing", ["low_freq_factor", "high_freq_factor"])
def test_llama3_scaling_without_a_frequency_factor_is_refused_as_transformers_refuses_it(tmp_path, key, missing):
    """The engine took Llama 3.1's 1.0 / 4.0 for a missing one; transformers will not load such a config."""
    config = {**LLAMA_3_2, "rope_scaling": None, key: _without(LLAMA3, missing)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KeyError, match=f"Missing required keys.*{missing}"):
        transformers.AutoConfig.from_pretrained(tmp_path)
    assert _refusal(config) == (
        f"m/config.json: rope scaling's {missing!r} is None; expected a finite number > 0 (llama3 scaling needs "
        "factor, original_max_position_embeddings, low_freq_factor and high_freq_factor)")


def test_a_qwen3_config_without_head_dim_has_transformers_128(tmp_path):
    """hidden_size 64 over 4 heads: transformers builds 128-wide heads; the engine built 16-wide ones and refused the
    checkpoint ("k_norm.weight has shape (128,); the sizes in config.json give (16,)")."""
    config = _without(QWEN3, "head_dim")
    _folder(tmp_path, config)
    assert transformers.AutoConfig.from_pretrained(tmp_path).head_dim == ModelShape.load(tmp_path).head_dim == 128
    expected, got = _greedy_pair(tmp_path)
    assert got == expected


@pytest.mark.parametrize("base", [QWEN3, QWEN2_5], ids=["qwen3", "qwen2"])
def test_a_qwen_config_without_num_key_value_heads_has_transformers_32(tmp_path, base):
    """64 heads of 4 over 32 KV heads in transformers; the engine took 64 KV heads and refused the checkpoint by its
    k_proj shape. A null one is num_attention_heads in both."""
    config = {**_without(base, "num_key_value_heads"), "num_attention_heads": 64, "head_dim": 4}
    _folder(tmp_path, config)
    assert transformers.AutoConfig.from_pretrained(tmp_path).num_key_value_heads == 32
    assert ModelShape.load(tmp_path).num_kv_heads == 32
    assert ModelShape.from_config_dict({**config, "num_key_value_heads": None}, name="m").num_kv_heads == 64
    expected, got = _greedy_pair(tmp_path)
    assert got == expected


def test_a_qwen_config_whose_heads_do_not_share_transformers_32_kv_heads_is_refused():
    """4 heads over 32 KV heads: transformers fails in the forward (a shape error); the engine ran 4 KV heads."""
    assert _refusal(_without(QWEN3, "num_key_value_heads")) == (
        "m/config.json: num_attention_heads (4) is not a multiple of num_key_value_heads (32, transformers' Qwen "
        "default where config.json has none)")
    # Llama takes num_attention_heads for a missing one, as transformers' LlamaConfig does
    assert ModelShape.from_config_dict(_without(LLAMA_2, "num_key_value_heads"), name="m").num_kv_heads == 4


@pytest.mark.parametrize("base", [QWEN3, QWEN2_5], ids=["qwen3", "qwen2"])
def test_a_null_qwen_head_dim_is_refused(base):
    """transformers' Qwen3Config refuses it, and its Qwen2 model fails on it; the engine derived one."""
    assert _refusal({**base, "head_dim": None}) == ("m/config.json: 'head_dim' is None; expected an integer >= 1, or "
                                                    "no 'head_dim' at all")
    assert ModelShape.from_config_dict({**LLAMA_2, "head_dim": None}, name="m").head_dim == 16  # Llama derives it


@pytest.mark.parametrize("config", [
    {**LLAMA_3_2, "partial_rotary_factor": 0.5},
    {**LLAMA_3_2, "rope_scaling": {**LLAMA3, "partial_rotary_factor": 0.5}},
    {**QWEN3, "rope_scaling": LLAMA3, "partial_rotary_factor": 0.5},
], ids=["llama-top-level", "llama-in-rope_scaling", "qwen3-top-level"])
def test_llama3_scaling_of_part_of_the_head_is_refused(tmp_path, config):
    """transformers computes the llama3 frequencies of that part and fails applying them to the whole head; the engine
    turned the whole head, without a word."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    with pytest.raises(RuntimeError, match="must match the size"):
        model(torch.tensor([[1, 2, 3]]))
    assert _refusal(config) == ("m/config.json: 'partial_rotary_factor' is 0.5 with llama3 rope scaling; expected 1 "
                                "(the whole head turned; transformers fails on a part of it)")
    whole = {**config, "rope_scaling": {**config["rope_scaling"], "partial_rotary_factor": 1.0}}
    assert ModelShape.from_config_dict({**whole, "partial_rotary_factor": 1.0}, name="m").rope_scaling
    if "partial_rotary_factor" in config:  # the rope object's value is transformers' over a top-level one
        assert ModelShape.from_config_dict(whole, name="m").rope_scaling


@pytest.mark.parametrize("base", [QWEN3, QWEN2_5], ids=["qwen3", "qwen2"])
def test_a_qwen_config_with_mlp_bias_runs_as_transformers_runs_it(tmp_path, base):
    """transformers' Qwen2 and Qwen3 have no MLP biases whatever 'mlp_bias' says; the engine refused the config."""
    _folder(tmp_path, {**base, "mlp_bias": True})
    expected, got = _greedy_pair(tmp_path)
    assert got == expected
