"""Triton kernels against the PyTorch reference on random paged inputs (skipped without CUDA)."""

from __future__ import annotations

import functools
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from engine.gpu.attention.torch_backend import TorchBackend  # noqa: E402


def kernels():
    from engine.gpu.attention import triton_kernels

    return triton_kernels


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN (or an unwritten poisoned element) in the output"
    return ((out - ref).norm() / ref.norm()).item()


def random_cache(num_blocks, num_kv_heads, page, head_dim, gen):
    shape = (num_blocks, num_kv_heads, page, head_dim)
    k = torch.randn(shape, generator=gen, device="cuda").bfloat16()
    v = torch.randn(shape, generator=gen, device="cuda").bfloat16()
    return k, v


def random_decode_inputs(lengths, page, num_kv_heads, group, dim, gen):
    """Paged K/V caches holding ``lengths`` tokens per sequence, their block tables, queries and context lengths."""
    num_blocks = sum(-(-n // page) for n in lengths) + 3
    k_cache, v_cache = random_cache(num_blocks, num_kv_heads, page, dim, gen)
    tables = random_tables(lengths, page, num_blocks, gen)
    q = torch.randn(len(lengths), num_kv_heads * group, dim, generator=gen, device="cuda").bfloat16()
    context = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, tables, q, context


def assert_decode_matches_reference(out, q, k_cache, v_cache, tables, lengths, scale):
    ref = TorchBackend()
    for i, n in enumerate(lengths):
        kk = ref._gather(k_cache, tables[i], n).float()
        vv = ref._gather(v_cache, tables[i], n).float()
        expected = ref._attend(q[i : i + 1].float(), kk, vv, n - 1, scale)
        assert rel_err(out[i : i + 1], expected) < 1e-2, f"sequence {i} (length {n})"


def random_tables(lengths, page, num_blocks, gen):
    """Distinct, shuffled blocks per sequence, padded with zeros to a common width."""
    need = [-(-n // page) for n in lengths]
    perm = torch.randperm(num_blocks, generator=gen, device="cuda")
    width = max(need)
    tables = torch.zeros(len(lengths), width, dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[start : start + n]
        start += n
    return tables


@pytest.mark.parametrize("heads_first", [True, False])
def test_store_kv_writes_every_valid_slot_and_skips_padding(heads_first):
    gen = torch.Generator(device="cuda").manual_seed(0)
    num_blocks, page, heads, dim = 12, 16, 8, 128
    shape = (num_blocks, heads, page, dim) if heads_first else (num_blocks, page, heads, dim)
    k_cache = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    qkv = torch.randn(37, 3 * heads, dim, generator=gen, device="cuda").bfloat16()
    k, v = qkv[:, heads : 2 * heads], qkv[:, 2 * heads :]  # strided views, as the model passes them
    slots = torch.randperm(num_blocks * page, generator=gen, device="cuda")[:37]
    slots[::5] = -1
    kernels().store_kv(k, v, k_cache, v_cache, slots, heads_first=heads_first)
    keep = slots >= 0
    blocks, offsets = slots[keep] // page, slots[keep] % page
    if heads_first:
        assert torch.equal(k_cache[blocks, :, offsets], k[keep]) and torch.equal(v_cache[blocks, :, offsets], v[keep])
    else:
        assert torch.equal(k_cache[blocks, offsets], k[keep]) and torch.equal(v_cache[blocks, offsets], v[keep])
    assert int((k_cache != 0).any(dim=-1).sum()) == int(keep.sum()) * heads


@pytest.mark.parametrize(
    "page,group,num_splits",
    [(16, 1, 1), (16, 2, 4), (64, 4, 2), (64, 8, 8), (256, 2, 1), (256, 2, 8), (256, 8, 4), (256, 4, 1)],
)
def test_paged_decode_matches_reference(page, group, num_splits):
    gen = torch.Generator(device="cuda").manual_seed(page * 100 + group * 10 + num_splits)
    num_kv_heads, dim = 4, 128
    lengths = [1, 7, page - 1, page, page + 1, 3 * page + 5, 700, 1500]
    k_cache, v_cache, tables, q, context = random_decode_inputs(lengths, page, num_kv_heads, group, dim, gen)
    out = torch.full_like(q, float("nan"))
    scale = dim**-0.5
    kernels().paged_decode(q, k_cache, v_cache, tables, context, scale, num_splits, out=out)
    assert_decode_matches_reference(out, q, k_cache, v_cache, tables, lengths, scale)


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("page,fill_splits,num_splits,long_rows", [
    (16, 1, 8, [5, 6, -1, -1]), (64, 2, 16, [1, 4, 5, 6]), (256, 1, 8, [6, -1, -1, -1]), (256, 4, 8, [-1, -1, -1, -1]),
    (256, 1, 1, []),
])
def test_paged_decode_with_long_rows_split_further_matches_reference(page, fill_splits, num_splits, long_rows, ordered):
    """The listed rows use num_splits ranges (their extra ranges first in the same launch), the others fill_splits;
    ``ordered``: the rows' programs start longest context first (the engine's order), with the same results."""
    from engine.gpu.attention.triton_kernels_host import decode_row_order

    gen = torch.Generator(device="cuda").manual_seed(page + fill_splits + num_splits)
    num_kv_heads, dim, group = 2, 128, 4
    lengths = [1, 40, 64, 65, 300, 2100, 5000, 9]
    k_cache, v_cache, tables, q, context = random_decode_inputs(lengths, page, num_kv_heads, group, dim, gen)
    out = torch.full_like(q, float("nan"))
    scale = dim**-0.5
    longs = torch.tensor(long_rows, dtype=torch.int32, device="cuda") if long_rows else None
    order = torch.tensor(decode_row_order(lengths), dtype=torch.int32, device="cuda") if ordered else None
    kernels().paged_decode(q, k_cache, v_cache, tables, context, scale, num_splits, out=out,
                           fill_splits=fill_splits, long_seqs=longs, row_order=order)
    assert_decode_matches_reference(out, q, k_cache, v_cache, tables, lengths, scale)


def test_paged_decode_padding_rows_are_zero_not_nan():
    gen = torch.Generator(device="cuda").manual_seed(5)
    k_cache, v_cache = random_cache(4, 2, 16, 64, gen)
    q = torch.randn(3, 4, 64, generator=gen, device="cuda").bfloat16()
    tables = torch.zeros(3, 2, dtype=torch.int32, device="cuda")
    context = torch.tensor([5, 0, 0], dtype=torch.int32, device="cuda")
    longs = torch.tensor([0, 1, -1, -1], dtype=torch.int32, device="cuda")  # a padding row listed as long, too
    for splits, fill in ((1, 1), (4, 4), (8, 1)):
        out = kernels().paged_decode(q, k_cache, v_cache, tables, context, 0.125, splits, fill_splits=fill,
                                     long_seqs=longs)
        assert torch.isfinite(out).all() and (out[1:] == 0).all()


@pytest.mark.parametrize("config", [None, (64, 64, 4, 3, 2, True), (128, 64, 8, 3, 2, True)])
@pytest.mark.parametrize("num_splits", [1, 2, 8, None])
@pytest.mark.parametrize("page,group", [(16, 1), (64, 2), (256, 2), (256, 4)])
def test_paged_prefill_over_cached_prefix_matches_reference(page, group, num_splits, config):
    """Every tile configuration, the tensor-memory-accelerator loads (a config's sixth entry; pages smaller than
    the key tile fall back to plain loads) too."""
    gen = torch.Generator(device="cuda").manual_seed(page + group)
    num_kv_heads, dim = 2, 128
    contexts = [0, 0, 5, page, 3 * page + 7, 300]  # tokens already cached
    q_lens = [1, 130, 64, 17, page + 3, 200]  # new tokens this chunk
    totals = [c + n for c, n in zip(contexts, q_lens)]
    num_blocks = sum(-(-t // page) for t in totals) + 2
    k_cache, v_cache = random_cache(num_blocks, num_kv_heads, page, dim, gen)
    tables = random_tables(totals, page, num_blocks, gen)
    q = torch.randn(sum(q_lens), num_kv_heads * group, dim, generator=gen, device="cuda").bfloat16()
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.tensor(q_lens, device="cuda").cumsum(0)
    ctx = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    scale = dim**-0.5
    # Split key ranges (a short chunk over a long prefix) must give the same attention; None: the heuristic.
    kernels().paged_prefill(q, k_cache, v_cache, tables, cu, ctx, max(q_lens), scale, out=out,
                            num_splits=num_splits, max_k_len=max(totals), config=config)
    ref = TorchBackend()
    for i, (c, n) in enumerate(zip(contexts, q_lens)):
        kk = ref._gather(k_cache, tables[i], c + n).float()
        vv = ref._gather(v_cache, tables[i], c + n).float()
        start = int(cu[i])
        expected = ref._attend(q[start : start + n].float(), kk, vv, c, scale)
        assert rel_err(out[start : start + n], expected) < 1e-2, f"sequence {i} (context {c}, chunk {n})"


def test_decode_split_heuristic_fills_the_gpu():
    from engine.gpu.attention.triton_kernels_host import decode_num_splits

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert decode_num_splits(1, 8, 64, sms) >= 32
    assert decode_num_splits(256, 8, 64, sms) == 1
    assert decode_num_splits(4, 8, 1, sms) == 1  # never more splits than tiles
    assert math.log2(decode_num_splits(16, 8, 64, sms)).is_integer()


def test_fused_rms_norm_matches_torch_reference():
    from engine.gpu.layers.fused_kernels import rms_norm
    from engine.gpu.layers.layernorm import RMSNorm

    gen = torch.Generator(device="cuda").manual_seed(11)
    norm = RMSNorm(1024, 1e-6).cuda().bfloat16()
    norm.weight.data = torch.randn(1024, generator=gen, device="cuda").bfloat16()
    x = torch.randn(77, 1024, generator=gen, device="cuda").bfloat16()
    res = torch.randn(77, 1024, generator=gen, device="cuda").bfloat16()
    assert rel_err(rms_norm(x, norm.weight, 1e-6), norm._norm(x)) < 1e-2
    expected_res = x + res
    expected = norm._norm(expected_res)
    res_inplace = res.clone()
    out = rms_norm(x, norm.weight, 1e-6, res_inplace)
    assert torch.equal(res_inplace, expected_res)
    assert rel_err(out, expected) < 1e-2


@pytest.mark.parametrize("has_norm", [True, False])
def test_fused_qk_norm_rope_matches_torch_reference(has_norm):
    from engine.gpu.layers.fused_kernels import qk_norm_rope_
    from engine.gpu.layers.layernorm import RMSNorm
    from engine.gpu.layers.rotary_embedding import RotaryEmbedding

    gen = torch.Generator(device="cuda").manual_seed(12)
    hq, hkv, d = 16, 8, 128
    rope = RotaryEmbedding(d, 4096, 1e6).cuda()
    qn, kn = RMSNorm(d).cuda().bfloat16(), RMSNorm(d).cuda().bfloat16()
    qn.weight.data = torch.rand(d, generator=gen, device="cuda").bfloat16() + 0.5
    kn.weight.data = torch.rand(d, generator=gen, device="cuda").bfloat16() + 0.5
    qkv = torch.randn(50, (hq + 2 * hkv) * d, generator=gen, device="cuda").bfloat16()
    positions = torch.randint(0, 4096, (50,), generator=gen, device="cuda")
    q = qkv[:, : hq * d].view(50, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(50, hkv, d)
    v_before = qkv[:, (hq + hkv) * d :].clone()
    if has_norm:
        q_ref, k_ref = rope(positions, qn(q), kn(k))
    else:
        q_ref, k_ref = rope(positions, q, k)
    qk_norm_rope_(qkv, positions, rope.cos_sin_cache, hq, hkv, d, qn.weight if has_norm else None,
                  kn.weight if has_norm else None, 1e-6)
    assert rel_err(qkv[:, : hq * d].view(50, hq, d), q_ref) < 1e-2
    assert rel_err(qkv[:, hq * d : (hq + hkv) * d].view(50, hkv, d), k_ref) < 1e-2
    assert torch.equal(qkv[:, (hq + hkv) * d :], v_before)


def test_fused_silu_and_mul_matches_torch_reference():
    from engine.gpu.layers.fused_kernels import silu_and_mul

    gen = torch.Generator(device="cuda").manual_seed(13)
    x = torch.randn(33, 2 * 3072, generator=gen, device="cuda").bfloat16()
    gate, up = x.chunk(2, dim=-1)
    assert rel_err(silu_and_mul(x), torch.nn.functional.silu(gate) * up) < 1e-2


def test_bound_kernel_recompiles_for_a_misaligned_view():
    """A launch bound for 16-byte-aligned tensors must not be reused for a view that is not aligned."""
    from engine.gpu.layers.fused_kernels import rms_norm

    gen = torch.Generator(device="cuda").manual_seed(21)
    flat = torch.randn(9 * 1024 + 1, generator=gen, device="cuda").bfloat16()
    weight = torch.rand(1024, generator=gen, device="cuda").bfloat16() + 0.5
    for offset in (0, 1, 0):  # aligned, misaligned by one element, aligned again
        x = flat[offset : offset + 8 * 1024].view(8, 1024)
        xf = x.float()
        expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16().float() * weight.float()
        assert rel_err(rms_norm(x, weight, 1e-6), expected) < 1e-2, f"offset {offset}"


@pytest.mark.parametrize("config", [(128, 128, 8, 3, 1), (64, 64, 4, 3, 2), (32, 64, 4, 2, 4), (64, 128, 8, 3, 4)])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_paged_prefill_tile_configs_match_reference(config, group):
    """Every tile shape, and query heads packed per program (capped by the group), over cached prefixes
    that end mid-tile and chunks shorter and longer than a tile."""
    gen = torch.Generator(device="cuda").manual_seed(sum(config) + group)
    page, num_kv_heads, dim = 256, 2, 128
    contexts = [0, 0, 77, 256, 300]
    q_lens = [1, 200, 130, 64, 333]
    totals = [c + n for c, n in zip(contexts, q_lens)]
    num_blocks = sum(-(-t // page) for t in totals) + 2
    k_cache, v_cache = random_cache(num_blocks, num_kv_heads, page, dim, gen)
    tables = random_tables(totals, page, num_blocks, gen)
    q = torch.randn(sum(q_lens), num_kv_heads * group, dim, generator=gen, device="cuda").bfloat16()
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.tensor(q_lens, device="cuda").cumsum(0)
    ctx = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    scale = dim**-0.5
    kernels().paged_prefill(q, k_cache, v_cache, tables, cu, ctx, max(q_lens), scale, out=out, config=config)
    ref = TorchBackend()
    for i, (c, n) in enumerate(zip(contexts, q_lens)):
        kk = ref._gather(k_cache, tables[i], c + n).float()
        vv = ref._gather(v_cache, tables[i], c + n).float()
        start = int(cu[i])
        expected = ref._attend(q[start : start + n].float(), kk, vv, c, scale)
        assert rel_err(out[start : start + n], expected) < 1e-2, f"sequence {i} (context {c}, chunk {n})"


@pytest.mark.parametrize("vocab_size,rows", [(151_936, 256), (151_936, 1), (1000, 7), (8192, 3)])
def test_gumbel_argmax_kernel_draws_the_reference_tokens(vocab_size, rows):
    """The one-pass kernel and the torch path compute the same noise and the same scaled logits, so they
    pick the same tokens (bf16 logits as the model returns them; greedy rows and several temperatures)."""
    from engine.gpu.layers.sampler import sample_reference
    from engine.gpu.layers.sampling_kernels import gumbel_argmax

    gen = torch.Generator(device="cuda").manual_seed(vocab_size + rows)
    logits = (torch.randn(rows, vocab_size, generator=gen, device="cuda") * 4).bfloat16()
    temperatures = torch.tensor([(0.0, 0.6, 1.0, 1.7)[r % 4] for r in range(rows)], device="cuda")
    words = torch.randint(0, 2**32, (rows, 3), generator=gen, device="cuda")
    got = gumbel_argmax(logits, temperatures, words)
    assert torch.equal(got, sample_reference(logits, temperatures, words))
    assert torch.equal(got[temperatures == 0], logits[temperatures == 0].float().argmax(-1))


@pytest.mark.parametrize("vocab_size,dtype", [(151_936, torch.bfloat16), (151_936, torch.float32),
                                              (1000, torch.float32), (5000, torch.bfloat16)])
def test_top_k_top_p_floors_keep_the_reference_tokens(vocab_size, dtype):
    """Top-k and top-p as a floor per row (a search, no sort) keep the torch path's tokens and draw its tokens
    (tests/engine/sampling_checks.py says where equal logits may differ)."""
    from engine.gpu.layers.sampling_kernels import FLOOR_BLOCK, FLOOR_PIVOTS, filter_floors, gumbel_argmax
    from tests.engine.sampling_checks import check_floors

    # The engine's search shape at both warp counts it uses, and others benchmarks/sampling.py times.
    shapes = ((FLOOR_PIVOTS, FLOOR_BLOCK, 8), (FLOOR_PIVOTS, FLOOR_BLOCK, 4), (8, 1024, 8), (16, 1024, 8))
    for seed, (pivots, block, num_warps) in enumerate(shapes):
        check_floors(functools.partial(filter_floors, pivots=pivots, block=block, num_warps=num_warps), gumbel_argmax,
                     vocab_size, dtype, "cuda", seed)


@pytest.mark.parametrize("rows", [1, 48, 49, 130])
def test_sample_sorts_small_filtered_batches_and_finds_floors_for_larger_ones(rows):
    """``sample`` takes the sort up to SORT_MAX_ROWS rows with filters and the floors past it, each drawing exactly
    what that path draws; float32 logits without ties, so both paths agree too."""
    from engine.gpu.layers.sampler import MASK32, SORT_MAX_ROWS, SamplingTensors, sample, sample_reference
    from engine.gpu.layers.sampling_kernels import filter_floors, gumbel_argmax

    assert SORT_MAX_ROWS == 48
    gen = torch.Generator(device="cuda").manual_seed(rows)
    logits = torch.randn(rows, 151_936, generator=gen, device="cuda") * 4
    params = SamplingTensors([0.6] * rows, [20 if r % 3 else -1 for r in range(rows)], [0.95] * rows,
                             [(7, r, MASK32) for r in range(rows)], torch.device("cuda"))
    sorted_ = sample_reference(logits, params.temperatures, params.words, params.top_ks, params.top_ps)
    floors = gumbel_argmax(logits, params.temperatures, params.words,
                           filter_floors(logits, params.temperatures, params.top_ks, params.top_ps))
    got = sample(logits, params)
    assert torch.equal(got, sorted_ if rows <= SORT_MAX_ROWS else floors)
    assert torch.equal(floors, sorted_)
