"""SamplingParams refuses what the engine cannot honour with a ValueError that names the field (torch-free)."""

from __future__ import annotations

import math

import pytest

from engine.core.sampling_params import SamplingParams


@pytest.mark.parametrize(("kwargs", "message"), [
    # inf reached the sampler: float32 logits / inf are 0 or NaN, a uniform draw that ignored top_k
    ({"temperature": math.inf}, "SamplingParams.temperature must be a number from 0 to 3.4e+38, got inf"),
    # inf in float32; was refused as not 'a finite number >= 0', which 1e39 is
    ({"temperature": 1e39}, "SamplingParams.temperature must be a number from 0 to 3.4e+38, got 1e+39"),
    ({"temperature": math.nan}, "SamplingParams.temperature must be a number from 0 to 3.4e+38, got nan"),
    ({"temperature": -0.5}, "SamplingParams.temperature must be a number from 0 to 3.4e+38, got -0.5"),
    # a string was a TypeError from the comparison, not a ValueError naming the field
    ({"temperature": "0.5"}, "SamplingParams.temperature must be a number from 0 to 3.4e+38, got '0.5'"),
    ({"top_p": "1"}, "SamplingParams.top_p must be in (0, 1], got '1'"),
    ({"top_p": math.nan}, "SamplingParams.top_p must be in (0, 1], got nan"),
    # True passed as 1
    ({"max_tokens": True}, "SamplingParams.max_tokens must be an int >= 1, got True"),
    ({"seed": True}, "SamplingParams.seed must be an integer in [0, 2**64), got True"),
    ({"top_k": False}, "SamplingParams.top_k must be an int (<= 0 disables it), got False"),
    ({"ignore_eos": "no"}, "SamplingParams.ignore_eos must be True or False, got 'no'"),
    # a string was taken as its characters, ids that never match: nothing stopped, without a word
    ({"stop_token_ids": "12"}, "SamplingParams.stop_token_ids must be a sequence of ints, got '12'"),
    ({"stop_token_ids": 7}, "SamplingParams.stop_token_ids must be a sequence of ints, got 7"),  # was a TypeError
    ({"stop_token_ids": [1, 2.5]}, "SamplingParams.stop_token_ids must be a sequence of ints, got 2.5 in it"),
])
def test_a_bad_value_or_type_is_a_value_error_naming_the_field(kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert str(info.value) == message


def test_stop_token_ids_are_a_set_whatever_iterable_they_came_as() -> None:
    """Every generated token is looked up in them: in a tuple, 100,000 ids cost that many comparisons per token."""
    assert SamplingParams(stop_token_ids=[5, 3, 5]).stop_token_ids == frozenset({3, 5})
    assert SamplingParams(stop_token_ids=(t for t in (1, 2))).stop_token_ids == frozenset({1, 2})
    assert SamplingParams().stop_token_ids == frozenset()
    assert 99_999 in SamplingParams(stop_token_ids=range(100_000)).stop_token_ids
    import numpy as np

    assert SamplingParams(stop_token_ids=np.array([1, 2])).stop_token_ids == frozenset({1, 2})  # was a broadcast error


def test_the_largest_finite_float32_temperatures_are_accepted() -> None:
    assert SamplingParams(temperature=3e38).temperature == 3e38
    assert SamplingParams(temperature=0).is_greedy
