"""The eager fit's hinge term: device time per token that grows beyond a knot (sim.profiled_cost_model._fit_sum)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from sim.profiled_cost_model import (
    MIN_TOKENS_KNOT,
    SUM_GPU_BASIS,
    TOKENS_BEYOND_KNOT,
    ProfiledCostModel,
    _fit_sum,
    check_fit,
    find_profile,
)

SIZES = [16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
FLOOR = [3e-3, 1e-5, 5e-5, 7e-4]  # per step, per sequence, per extra prefill chunk, with decode rows
GPU = [2e-5, 1e-9, 3e-8, 1e-7]  # per padded token, attention pair, decode KV token, prefill KV token


def _features(tokens: int, seqs: int, decode: int, prefix: int, context: int = 700) -> dict:
    chunk = tokens // seqs
    return {"num_prefill_tokens": tokens, "num_prefill_seqs": seqs, "num_decode_seqs": decode,
            "num_seqs": seqs + decode, "prefill_attention_pairs": seqs * (chunk * (chunk + 1) // 2 + chunk * prefix),
            "prefill_context_tokens": seqs * prefix, "decode_context_tokens": context * decode}


def _points(hinge_s_per_token: float, knot: int) -> list[dict]:
    """Eager grid points priced exactly by the sum model, with ``hinge_s_per_token`` beyond ``knot`` padded tokens."""
    points = []
    for tokens in (64, 256, 1024, 2048, 4096, 8192):
        for seqs, decode, prefix, context in ((1, 0, 0, 0), (2, 0, 512, 0), (4, 8, 0, 500), (1, 32, 2048, 1800),
                                              (2, 8, 0, 3000)):
            f = _features(tokens, seqs, decode, prefix, context)
            padded = next(s for s in SIZES if s >= tokens + decode) if tokens + decode <= SIZES[-1] else tokens + decode
            host = np.dot(FLOOR, [1.0, f["num_seqs"], seqs - 1, 1.0 if decode else 0.0])
            gpu = np.dot(GPU, [padded, f["prefill_attention_pairs"], f["decode_context_tokens"],
                               f["prefill_context_tokens"] + tokens]) + hinge_s_per_token * max(padded - knot, 0)
            points.append({"features": f, "median_s": float(host + gpu)})
    return points


def test_a_superlinear_grid_gets_its_knot_and_coefficients_back():
    fit = _fit_sum(_points(6e-6, 2048), SIZES)
    assert fit["tokens_knot"] == 2048
    assert fit["gpu_basis"] == [*SUM_GPU_BASIS, TOKENS_BEYOND_KNOT]
    np.testing.assert_allclose(fit["gpu_coef"], [*GPU, 6e-6], rtol=1e-6)
    np.testing.assert_allclose(fit["floor_coef"], FLOOR, rtol=1e-6)


def test_a_linear_grid_keeps_the_four_term_line():
    fit = _fit_sum(_points(0.0, 2048), SIZES)
    assert "tokens_knot" not in fit
    assert fit["gpu_basis"] == list(SUM_GPU_BASIS)
    np.testing.assert_allclose(fit["gpu_coef"], GPU, rtol=1e-6)


def test_no_knot_below_the_smallest_tried_nor_at_the_largest_size():
    fit = _fit_sum(_points(6e-6, 256), SIZES)  # a true knot below MIN_TOKENS_KNOT: the nearest one tried
    assert fit["tokens_knot"] == MIN_TOKENS_KNOT
    assert _fit_sum(_points(6e-6, 8192), SIZES).get("tokens_knot") is None  # nothing beyond the largest: a line


def _shipped() -> dict:
    return json.loads(find_profile("qwen3-0.6b", "h200").read_text())


def _with_knot(profile: dict, knot, coef: float = 5e-6) -> dict:
    profile = copy.deepcopy(profile)
    eager = profile["fit"]["eager"]
    eager["tokens_knot"] = knot
    eager["gpu_basis"] = [*SUM_GPU_BASIS, TOKENS_BEYOND_KNOT]
    eager["gpu_coef"] = [*eager["gpu_coef"][:4], coef]
    return profile


def test_the_hinge_prices_only_the_tokens_beyond_the_knot():
    plain = ProfiledCostModel(_shipped()["fit"], "plain")
    hinged = ProfiledCostModel(_with_knot(_shipped(), 2048, 5e-6)["fit"], "hinged")
    small, large = _features(1000, 1, 0, 0), _features(6000, 2, 0, 0)  # padded to 1024 and 6144
    assert hinged.eager_parts(small) == plain.eager_parts(small)
    host, gpu = hinged.eager_parts(large)
    assert host == plain.eager_parts(large)[0]
    assert gpu == pytest.approx(plain.eager_parts(large)[1] + 5e-6 * (6144 - 2048), rel=1e-12)


@pytest.mark.parametrize("change, message", [
    (lambda p: _with_knot(p, 8192), "'fit.eager.tokens_knot' is 8192"),
    (lambda p: _with_knot(p, 0), "'fit.eager.tokens_knot' is 0"),
    (lambda p: _with_knot(p, 1024.5), "'fit.eager.tokens_knot' is 1024.5"),
    (lambda p: _with_knot(p, True), "'fit.eager.tokens_knot' is True"),
    (lambda p: _with_knot(p, 2048, -1.0), "'fit.eager.gpu_coef'"),
    (lambda p: {**_with_knot(p, 2048), "fit": {**p["fit"], "eager": {**_with_knot(p, 2048)["fit"]["eager"],
                                                                     "gpu_coef": p["fit"]["eager"]["gpu_coef"]}}},
     "'fit.eager.gpu_coef'"),
    (lambda p: {**p, "fit": {**p["fit"], "eager": {**_with_knot(p, 2048)["fit"]["eager"], "tokens_knot": None}}},
     "'fit.eager.gpu_basis'"),
])
def test_an_unusable_knot_is_refused_naming_the_field(change, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        check_fit(change(_shipped()))
