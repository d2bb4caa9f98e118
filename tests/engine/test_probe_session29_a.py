"""Probe of model folders whose config.json reads like a hub checkpoint's, against transformers' greedy tokens.

Found:
- rope_theta and the rope object were read otherwise than transformers reads them: transformers 5 takes rope_scaling
  over rope_parameters where both are set, and the rope_theta inside that object over a top-level one. The engine
  took rope_parameters' theta beside a rope_scaling (which transformers ignores) and passed over a theta inside
  rope_scaling: other tokens, without a word. A top-level rope_theta or original_max_position_embeddings that differs
  from the rope object's (transformers 4 takes the top-level rope_theta and the object's original_max_position_
  embeddings, 5 the reverse of both: other tokens than one of them, without a word) is now refused in one line.
- A config.json with tie_word_embeddings true over a checkpoint whose lm_head.weight differs from its embedding ran on
  the embedding (as vLLM does) while transformers 5 unties it and runs on lm_head.weight: other tokens, without a word.
  Refused now in one line naming the setting; a copy of the embedding still loads.

Pinned (they matched): Llama-3.2 (llama3 rope, tied, eos list, bfloat16 weights in shards with an index), Llama-2 (no
head_dim nor num_key_value_heads) and Qwen2.5 (q/k/v biases, a sliding_window not used) configs as the hub has them.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.model_config import ModelShape  # noqa: E402

VOCAB = 512
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 16, "hidden_size": 64,
         "intermediate_size": 128, "max_position_embeddings": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
         "num_key_value_heads": 2, "tie_word_embeddings": True, "vocab_size": VOCAB, "eos_token_id": 2}
LLAMA3 = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 16,
          "rope_type": "llama3"}


def _folder(path, config: dict, weights_dtype=torch.float32, **save) -> None:
    """A random model of ``config`` saved by transformers, under ``config`` as written (transformers would rewrite it
    in its own spelling). Weights drawn wide (and biases non-zero) so that every setting shows in the tokens."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path),
                                                          dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(1.0 if "norm" in name else 0.0, 0.3)
    model.to(weights_dtype).save_pretrained(path, **save)
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").unlink(missing_ok=True)


def _greedy_pair(path) -> tuple[list[list[int]], list[list[int]]]:
    """(transformers' greedy tokens, the engine's) for three prompts, the last crossing several blocks."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB - 1, (n,), generator=g).tolist() for n in (3, 29, 70)]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        expected.append(out[0, len(p):].tolist())
    llm = LLM(str(path), block_size=16, max_model_len=128, max_num_batched_tokens=32)
    return expected, [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("rope", [
    {"rope_scaling": {"rope_type": "default", "rope_theta": 100.0}},  # the engine used 10000
    # transformers ignores rope_parameters beside a rope_scaling: the engine took its theta, 1000 for 10000
    {"rope_scaling": {"rope_type": "default"}, "rope_parameters": {**LLAMA3, "rope_theta": 1000.0}},
    {"rope_scaling": LLAMA3, "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}},
], ids=["theta-in-rope_scaling", "rope_scaling-over-llama3-rope_parameters",
        "llama3-rope_scaling-over-rope_parameters"])
def test_rope_settings_are_read_as_transformers_reads_them(tmp_path, rope):
    _folder(tmp_path, {**QWEN3, **rope})
    expected, got = _greedy_pair(tmp_path)
    assert got == expected


@pytest.mark.parametrize("rope", [{"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                                  {"rope_scaling": {"rope_type": "default", "rope_theta": 1e6}}])
def test_two_different_rope_thetas_are_refused(rope):
    """transformers 4 runs the top-level one, transformers 5 the other."""
    key = next(iter(rope))
    with pytest.raises(ValueError) as info:
        ModelShape.from_config_dict({**QWEN3, "rope_theta": 100, **rope}, name="m", source="m/config.json")
    assert str(info.value) == (f"m/config.json: 'rope_theta' (100) and {key}' 'rope_theta' (1e+06) differ; expected "
                               "one value")
    # one value in both places is no conflict
    assert ModelShape.from_config_dict({**QWEN3, "rope_theta": 1e6, **rope}, name="m").rope_theta == 1e6


def test_a_top_level_original_max_position_embeddings_that_differs_is_refused():
    """transformers 5 runs Llama 3's scaling with it, transformers 4 (and the engine) with the rope object's."""
    config = {**QWEN3, "rope_scaling": LLAMA3, "original_max_position_embeddings": 64}
    with pytest.raises(ValueError) as info:
        ModelShape.from_config_dict(config, name="m", source="m/config.json")
    assert str(info.value) == ("m/config.json: 'original_max_position_embeddings' (64) and rope_scaling' "
                               "'original_max_position_embeddings' (16) differ; expected one value")
    assert ModelShape.from_config_dict({**config, "original_max_position_embeddings": 16}, name="m").rope_scaling


def test_a_tied_config_over_a_head_of_its_own_is_refused(tmp_path):
    _folder(tmp_path, {**QWEN3, "tie_word_embeddings": False})
    (tmp_path / "config.json").write_text(json.dumps(QWEN3))  # says tied; the checkpoint has its own lm_head.weight
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)  # what transformers runs on
    with pytest.raises(ValueError) as info:
        LLM(str(tmp_path), max_model_len=128)
    assert str(info.value) == (
        f"{tmp_path / 'model.safetensors'}: checkpoint tensor 'lm_head.weight' differs from "
        "'model.embed_tokens.weight' while config.json's 'tie_word_embeddings' is true; expected false for a head of "
        "its own (transformers then uses lm_head.weight, vLLM the embedding)")


LLAMA_3_2 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 1, "eos_token_id": [2, 3, 4], "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
             "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 256, "mlp_bias": False,
             "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
             "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": LLAMA3, "rope_theta": 500000.0,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": VOCAB}
LLAMA_2 = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
           "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 256,
           "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "pretraining_tp": 1,
           "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
           "use_cache": True, "vocab_size": VOCAB}
QWEN2_5 = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
           "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
           "max_position_embeddings": 256, "max_window_layers": 1, "model_type": "qwen2", "num_attention_heads": 4,
           "num_hidden_layers": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
           "sliding_window": 32, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
           "use_sliding_window": False, "vocab_size": VOCAB}


@pytest.mark.parametrize("config, save", [
    (LLAMA_3_2, dict(weights_dtype=torch.bfloat16, max_shard_size="100KB")),
    (LLAMA_2, {}),
    (QWEN2_5, {}),
], ids=["llama-3.2-bf16-shards", "llama-2-mha", "qwen2.5-mqa"])
def test_hub_configs_match_transformers(tmp_path, config, save):
    _folder(tmp_path, config, **save)
    assert (tmp_path / "model.safetensors.index.json").is_file() == bool(save)
    expected, got = _greedy_pair(tmp_path)
    assert got == expected
