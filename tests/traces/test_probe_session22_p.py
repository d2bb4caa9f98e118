"""Probe session 22 P: length draws past int64 and the mean of extreme lognormals (traces.lengths)."""

from __future__ import annotations

import warnings

import numpy as np

from traces.lengths import MAX_LENGTH, parse_length_dist
from traces.synth import main


def test_uncapped_lognormal_draws_stay_within_max_length():
    # median 2**40, sigma 10: about 40 % of draws exceed 2**63 and cast to int64 as -2**63 (with a RuntimeWarning);
    # the rest above 2**40 were written as they came.
    dist = parse_length_dist("lognormal:median=1099511627776,sigma=10")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draws = dist.sample(100_000, np.random.default_rng(0))
    assert draws.min() >= 1 and draws.max() <= MAX_LENGTH


def test_cli_writes_a_trace_for_an_uncapped_extreme_lognormal(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    # was exit 2 with a RuntimeWarning line and "prompt_tokens is -9223372036854775808"
    assert main(["-o", str(out), "--num-requests", "2000", "--qps", "10",
                 "--prompt-dist", "lognormal:median=1099511627776,sigma=10"]) == 0


def _assert_mean_matches(spec: str, num: int = 400_000) -> None:
    dist = parse_length_dist(spec)
    draws = dist.sample(num, np.random.default_rng(1)).astype(np.float64)
    se = draws.std() / np.sqrt(num)
    # 6 standard errors: a false failure has probability below 1e-8 (the mean of 400,000 capped draws is normal)
    assert abs(draws.mean() - dist.mean()) < 6 * se, (spec, draws.mean(), dist.mean(), se)


def test_geometric_mean_accounts_for_the_implicit_cap():
    # mean=1e12 without max: draws are capped at 2**40, so their mean is 6.67e11, not 1e12
    _assert_mean_matches("geometric:mean=1e12")


def test_lognormal_mean_with_large_sigma_and_cap():
    # Q(a) - Q(b) with both ~1 cancelled: mean() gave 5.498e11 for draws averaging 5.93e11 (52 standard errors)
    _assert_mean_matches("lognormal:median=1099511627776,sigma=10,max=1099511627776")
    _assert_mean_matches("lognormal:median=1,sigma=10,max=1000000000")


def test_usual_means_unchanged():
    assert parse_length_dist("geometric:mean=3.51").mean() == 3.51
    _assert_mean_matches("lognormal:mean=161,sigma=1.0")
    _assert_mean_matches("lognormal:mean=161,sigma=1.0,max=4096")
