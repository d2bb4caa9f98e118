"""Session 39 (helper B): decode_steps_s reads the prices of a small batch's repeating steps from a table by context
once a batch size has been priced often (a fleet's replicas hold a row or two: a pass's numpy operations cost more
than their work), and the decode coefficients are interpolated once for every batch size. The same floats as the
arithmetic of each pass."""

from __future__ import annotations

import numpy as np
import pytest

from sim import profiled_cost_model as cost_module
from sim.profiled_cost_model import ProfiledCostModel, find_profile


def _arithmetic(model: ProfiledCostModel, monkeypatch, *args) -> np.ndarray:
    """decode_steps_s without its table (every pass priced by its arithmetic)."""
    with monkeypatch.context() as patch:
        patch.setattr(cost_module, "_MAX_PRICED_CONTEXT", -1)
        return model.decode_steps_s(*args)


@pytest.mark.parametrize("sampling", ["greedy", "temperature"])
@pytest.mark.parametrize("model_name", ["qwen3-0.6b", "qwen3-8b"])
def test_prices_from_the_table_are_the_arithmetics_floats(model_name, sampling, monkeypatch):
    """Bit for bit, up to _MAX_TABLED_ROWS rows (below the skew's smallest batch, 32), whether the first step
    continues the batch or not, from the first context to the table's last (it grows as larger contexts come: each
    pass's prices are read after)."""
    model = ProfiledCostModel.load(find_profile(model_name, "h200"), sampling=sampling)
    monkeypatch.setattr(cost_module, "_PASSES_BEFORE_TABLE", 0)
    cap = cost_module._MAX_PRICED_CONTEXT
    for bs in (1, 2, 3, 7, cost_module._MAX_TABLED_ROWS):
        for context, num_steps in ((bs, 1), (900 * bs, 150), (3_000 * bs, 400), (cap - 20 * bs, 20), (0, 3)):
            for continues in (0, 1):
                args = (bs, context, context // bs + 5, continues, num_steps)
                table = model.decode_steps_s(*args)
                assert len(model._repeating_price_tables[bs]) > context + bs * (num_steps - 1)  # read from it
                arithmetic = _arithmetic(model, monkeypatch, *args)
                assert len(table) == num_steps
                assert table.tobytes() == arithmetic.tobytes(), args
    assert len(model._repeating_price_tables[1]) == cap + 1  # at most the cap


def test_a_batch_size_is_tabled_after_its_first_passes(monkeypatch):
    """The first _PASSES_BEFORE_TABLE passes of a size are priced by the arithmetic (a table costs some twenty), the
    next one builds its table; the floats are the same throughout."""
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    for k in range(cost_module._PASSES_BEFORE_TABLE + 1):
        args = (2, 1_000 + 2 * k, 600, k % 2, 40)
        prices = model.decode_steps_s(*args)
        assert (2 in model._repeating_price_tables) == (k == cost_module._PASSES_BEFORE_TABLE)
        assert prices.tobytes() == _arithmetic(model, monkeypatch, *args).tobytes()
    assert 1 not in model._repeating_price_tables


def test_the_table_is_not_read_for_skewed_batches_a_host_slowdown_or_contexts_past_it(monkeypatch):
    """Skewed batches (from 32 rows: their prices read the longest context too), batches of more than
    _MAX_TABLED_ROWS rows, a host slowdown other than the calibrated one and a pass whose contexts end past
    _MAX_PRICED_CONTEXT are priced by the arithmetic, as before."""
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    monkeypatch.setattr(cost_module, "_PASSES_BEFORE_TABLE", 0)
    cap = cost_module._MAX_PRICED_CONTEXT
    for args in ((32, 900 * 32, 1_000, 0, 50, None), (17, 900 * 17, 1_000, 1, 50, None), (1, 900, 900, 1, 50, 1.3),
                 (2, cap - 10, 9_000, 1, 6, None)):
        prices = model.decode_steps_s(*args)
        assert prices.tobytes() == _arithmetic(model, monkeypatch, *args).tobytes()
        assert model._repeating_price_tables == {}


def test_a_pass_from_the_table_is_the_callers_to_change(monkeypatch):
    """The runner adds a pass's start to its first price in place: the table keeps its prices."""
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    monkeypatch.setattr(cost_module, "_PASSES_BEFORE_TABLE", 0)
    first = model.decode_steps_s(1, 1_000, 1_000, 1, 10)
    expected = first.tobytes()
    first += 7.0
    assert model.decode_steps_s(1, 1_000, 1_000, 1, 10).tobytes() == expected
    assert 1 in model._repeating_price_tables


@pytest.mark.parametrize("model_name", ["qwen3-0.6b", "qwen3-8b"])
def test_decode_coefficients_are_each_batch_sizes_own_interpolation(model_name):
    """One np.interp over every batch size gives each one's floats, as one call a batch size did."""
    model = ProfiledCostModel.load(find_profile(model_name, "h200"))
    decode = model.fit["graph_decode"]
    measured = np.array(decode["batch_sizes"], dtype=float)
    for bs in range(1, model.max_graph_bs + 1):
        bucket = model.graph_bucket(bs)
        assert model._decode_a[bs] == float(np.interp(bucket, measured, decode["intercept_s"]))
        assert model._decode_b[bs] == float(np.interp(bucket, measured, decode["per_kv_token_s"]))
        assert type(model._decode_a[bs]) is float and type(model._decode_b[bs]) is float
