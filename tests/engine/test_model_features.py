"""Model settings beyond the default decoder: supported ones match transformers' greedy tokens, the others are refused
with one line naming the setting (they ran without a word and gave other tokens than the model's)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.model_config import ModelShape  # noqa: E402

VOCAB = 512
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.3,
             eos_token_id=VOCAB - 1)


def greedy_reference(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():  # an explicit mask: generate would otherwise mask prompt tokens equal to pad_token_id
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        outs.append(out[0, len(p):].tolist())
    return outs


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_attention_bias_matches_transformers(tmp_path, arch):
    """attention_bias=True gives Llama and Qwen3 q/k/v *and* o_proj biases; the engine had no o_proj bias, so such a
    checkpoint failed to load ('o_proj.bias' matches no model parameter)."""
    config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                             "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[arch]
    torch.manual_seed(4)
    model = model_cls(config_cls(**SMALL, attention_bias=True)).eval()
    with torch.no_grad():  # HF initialises biases to zero; make them matter
        for layer in model.model.layers:
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                proj.bias.normal_(0, 0.3)
    model.save_pretrained(tmp_path)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB - 1, (n,), generator=g).tolist() for n in (3, 29, 70)]
    llm = LLM(str(tmp_path), block_size=16, max_model_len=128, max_num_batched_tokens=32)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert [o["token_ids"] for o in outputs] == greedy_reference(model, prompts, 8)


BASE = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB}


@pytest.mark.parametrize("extra, setting", [
    ({"hidden_act": "gelu"}, "'hidden_act' is 'gelu'"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "'hidden_act' is 'gelu_pytorch_tanh'"),
    ({"architectures": ["LlamaForCausalLM"], "mlp_bias": True}, "'mlp_bias' is True"),
    ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 16}, "sliding-window attention"),
    ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, "sliding-window attention"),
    # Refused when the model was built (no file named), and not at all by the simulator, which builds none.
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn' is not supported"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope scaling type 'linear' is not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope scaling type 'dynamic'"),
    ({"rope_scaling": "linear"}, "'rope_scaling' is 'linear'; expected an object"),
])
def test_unimplemented_settings_are_refused(extra, setting):
    with pytest.raises(ValueError, match=setting) as info:
        ModelShape.from_config_dict({**BASE, **extra}, name="m", source="m/config.json")
    assert str(info.value).startswith("m/config.json: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("extra", [
    {"hidden_act": "silu"},
    {"layer_types": ["full_attention", "full_attention"], "sliding_window": None},
    # Qwen2.5's shipped configs: a window is named but not used (use_sliding_window false).
    {"use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 1},
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2},  # no layer from 2 on
    # with both frequency factors: without one transformers refuses the config, and so does the engine now (it took
    # Llama 3.1's 1.0 / 4.0; test_probe_session30_a)
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                      "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
])
def test_settings_that_change_nothing_are_accepted(extra):
    assert ModelShape.from_config_dict({**BASE, **extra}, name="m").num_layers == 2


@pytest.mark.parametrize(("architecture", "expected"), [("Qwen3ForCausalLM", 32768), ("Qwen2ForCausalLM", 32768),
                                                        ("LlamaForCausalLM", 2048)])
def test_max_position_embeddings_left_out_defaults_as_transformers(tmp_path, architecture, expected) -> None:
    """It sets the default max_model_len: one 4096 for every architecture refused Qwen prompts transformers takes."""
    import json

    from transformers import AutoConfig

    config = {"architectures": [architecture], "model_type": {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2",
              "LlamaForCausalLM": "llama"}[architecture], "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ModelShape.load(tmp_path).max_position_embeddings == expected
    assert AutoConfig.from_pretrained(tmp_path).max_position_embeddings == expected
