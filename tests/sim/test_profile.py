"""python -m sim.profile end to end on CPU with a tiny random model: every grid family is measured and fitted."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_profile_cli_measures_every_family_and_fits(tmp_path):
    from sim.profile import main as profile_main
    from sim.profiled_cost_model import ProfiledCostModel

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=20000, tie_word_embeddings=True,
    )
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(tmp_path / "model")
    out = tmp_path / "profile.json"
    assert profile_main([
        "--model", str(tmp_path / "model"), "--device", "cpu", "--quick", "--repeats", "1", "--max-model-len", "20000",
        "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--gpu", "h200", "--out", str(out),
    ]) == 0
    profile = json.loads(out.read_text())
    families = {p["family"] for p in profile["points"]}
    assert families == {"decode", "decode_skewed", "decode_after_eager", "prefill", "multi_prefill", "mixed"}
    for p in profile["points"]:
        f = p["features"]
        assert p["median_s"] > 0 and len(p["times_s"]) == 1
        if p["family"] == "decode_skewed":  # one long context among short ones (one token longer after the warm-up)
            assert f["max_decode_context_tokens"] == p["long_decode"][1] + 1
            assert f["num_decode_seqs"] == p["decode"][0] + 1
        if p["family"] == "decode_after_eager":  # timed: the decode step after the prefill, with its sequence
            assert f["num_prefill_tokens"] == 0 and f["num_decode_seqs"] == p["decode"][0] + 1
    fit = profile["fit"]
    assert fit["held_out"]["num_points"] > 0 and "per_excess_context_token_s" in fit["graph_decode"]
    model = ProfiledCostModel.load(out)
    assert all(model.predict(p["features"]) > 0 for p in profile["points"])
