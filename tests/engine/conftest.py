"""Tiny random HF models saved to temp dirs: the reference for the engine's greedy outputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 512


def _save(model, path) -> str:
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=True,
        initializer_range=0.3, eos_token_id=VOCAB - 1,
    )
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    return _save(model, tmp_path_factory.mktemp("qwen3")), model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.3,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
        rope_theta=5000.0, eos_token_id=VOCAB - 1,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    return _save(model, tmp_path_factory.mktemp("llama")), model


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    torch.manual_seed(2)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.3,
        eos_token_id=VOCAB - 1,
    )
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # HF initialises biases to zero; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.3)
    return _save(model, tmp_path_factory.mktemp("qwen2")), model


@pytest.fixture
def trace(tmp_path):
    """A two-request trace for the command lines' refusals (a module may define its own ``trace``)."""
    import polars as pl

    path = tmp_path / "t.parquet"
    pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [3, 4],
                  "output_tokens": [1, 1]}).write_parquet(path)
    return path


@pytest.fixture
def no_load(monkeypatch):
    """The engine must not load: LLM (engine.replay) and the engine process (engine.serve) fail at once."""
    import engine.llm
    import engine.server.engine_client

    def stop(*args, **kwargs):
        raise ValueError("stopped before the load")

    class Client:
        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            stop()

        def stop(self, **kwargs):
            pass

    monkeypatch.setattr(engine.llm, "LLM", stop)
    monkeypatch.setattr(engine.server.engine_client, "EngineClient", Client)
