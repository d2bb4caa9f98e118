"""Greedy tokens from engine.LLM equal transformers' generate(do_sample=False) on tiny random models (CPU, float32)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine import LLM, SamplingParams  # noqa: E402

MAX_TOKENS = 16
PROMPT_LENS = (3, 17, 40, 75, 130)


def prompts(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # Two prompts share a 40-token prefix so the prefix cache has something to hit.
    shared = torch.randint(0, 500, (40,), generator=g).tolist()
    out = [torch.randint(0, 500, (n,), generator=g).tolist() for n in PROMPT_LENS]
    out.append(shared + torch.randint(0, 500, (9,), generator=g).tolist())
    out.append(shared + torch.randint(0, 500, (30,), generator=g).tolist())
    return out


def reference(model, prompt_list: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    outs = []
    for p in prompt_list:
        ids = torch.tensor([p])
        with torch.no_grad():  # the mask given: without it transformers masks every prompt token equal to the pad id
            ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        outs.append(ids[0, len(p):].tolist())
    return outs


@pytest.fixture(scope="module")
def qwen3_reference(tiny_qwen3):
    path, model = tiny_qwen3
    return path, reference(model, prompts())


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
CASES = {
    "mixed": dict(),
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "chunked-prefill": dict(max_num_batched_tokens=32),
    "nano": dict(policy="nano", max_num_batched_tokens=256),
    "eager-small-batch": dict(max_num_seqs=2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_qwen3_greedy_matches_transformers(qwen3_reference, case):
    path, expected = qwen3_reference
    options = {"block_size": 16, "max_model_len": 256, **CASES[case]}
    llm = LLM(path, **options)
    outputs = llm.generate(prompts(), GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outputs] == expected
    log = llm.engine.step_log.to_arrow().to_pydict()
    if case == "chunked-prefill":
        assert max(log["num_batched_tokens"]) <= 32
    if case == "nano":
        assert all(p == 0 or d == 0 for p, d in zip(log["num_prefill_seqs"], log["num_decode_seqs"]))
    bm = llm.engine.scheduler.block_manager
    assert bm.num_used_blocks == 0
    if case == "mixed":
        assert bm.num_hit_tokens > 0


@pytest.mark.parametrize("policy", ["mixed", "nano"])
def test_greedy_matches_under_preemption(tiny_qwen3, policy):
    path, model = tiny_qwen3
    # Six 15-token prompts fill six of eight blocks; each needs a second block on its second token.
    g = torch.Generator().manual_seed(3)
    prompt_list = [torch.randint(0, 500, (15,), generator=g).tolist() for _ in range(6)]
    llm = LLM(path, block_size=16, max_model_len=128, num_gpu_blocks=8, policy=policy)
    outputs = llm.generate(prompt_list, GREEDY, use_tqdm=False)
    assert sum(llm.engine.step_log.to_arrow().to_pydict()["num_preempted"]) > 0
    assert [o["token_ids"] for o in outputs] == reference(model, prompt_list)
    assert llm.engine.scheduler.block_manager.num_used_blocks == 0


def test_layers_share_one_rotary_table(tiny_qwen3):
    """Every layer's cos/sin table is the model's one (one per layer took num_layers times the memory)."""
    path, _ = tiny_qwen3
    llm = LLM(path, block_size=16, max_model_len=128)
    model = llm.engine.runner.model
    tables = {id(layer.self_attn.rotary_emb.cos_sin_cache) for layer in model.model.layers}
    assert len(model.model.layers) > 1 and len(tables) == 1
    assert [name for name, _ in model.named_buffers() if name.endswith("cos_sin_cache")] == [
        "model.layers.0.self_attn.rotary_emb.cos_sin_cache"]


def test_prefix_cache_hits_reuse_blocks_and_keep_outputs(qwen3_reference):
    path, expected = qwen3_reference
    llm = LLM(path, block_size=16, max_model_len=256)
    first = llm.generate(prompts(), GREEDY, use_tqdm=False)
    hits_before = llm.engine.scheduler.block_manager.num_hit_tokens
    second = llm.generate(prompts(), GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.block_manager.num_hit_tokens - hits_before >= 16 * sum(
        (n - 1) // 16 for n in map(len, prompts())
    )
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in second] == expected


@pytest.mark.parametrize("fixture_name", ["tiny_llama", "tiny_qwen2"])
def test_other_architectures_match_transformers(request, fixture_name):
    path, model = request.getfixturevalue(fixture_name)
    prompt_list = prompts(1)
    expected = reference(model, prompt_list)
    llm = LLM(path, block_size=16, max_model_len=256, max_num_batched_tokens=64)
    outputs = llm.generate(prompt_list, GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outputs] == expected
