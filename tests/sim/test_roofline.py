"""The roofline estimate's host time: less for a decode step that repeats the batch before it (the engine plans it
while that one runs), and a quiet run's prices the very floats of its steps priced one by one."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence
from sim.config import SimConfig
from sim.cost_model import RooflineConstants, RooflineCostModel, roofline_constants_for
from sim.hardware import get_gpu


def _decode(rows: int, context: int, continues: int) -> ScheduledBatch:
    return ScheduledBatch(seqs=[Sequence(i, [1], SamplingParams()) for i in range(rows)], num_new_tokens=[1] * rows,
                          num_decode_seqs=rows, decode_context_tokens=rows * context,
                          max_decode_context_tokens=context, continues_batch=continues)


def _model(model: str = "qwen3-8b", gpu: str = "h200") -> RooflineCostModel:
    return RooflineCostModel(SimConfig(model=model, gpu=gpu).model_shape, get_gpu(gpu))


def test_a_repeating_decode_step_pays_the_continuing_host_time() -> None:
    model = _model()
    constants = model.constants  # (the H200's own, fitted to its profiles)
    assert constants == roofline_constants_for("h200") != RooflineConstants()
    new, repeating = (model.step_time_s(_decode(32, 2000, continues)) for continues in (0, 1))
    assert new - repeating == pytest.approx(constants.step_overhead_s - constants.continuing_step_overhead_s,
                                            rel=1e-9)
    assert constants.continuing_step_overhead_s < constants.step_overhead_s
    # The host part alone scales with a host slowdown: twice the difference at 2x
    new2, repeating2 = (model.step_time_s(_decode(32, 2000, continues), 2.0) for continues in (0, 1))
    assert new2 - repeating2 == pytest.approx(2 * (new - repeating), rel=1e-9)


@pytest.mark.parametrize("continues", [0, 1])
@pytest.mark.parametrize("slowdown", [None, 1.37])
def test_a_quiet_runs_prices_are_its_steps_prices(continues: int, slowdown: float | None) -> None:
    """sim.runner prices a quiet run in one pass (contexts as arrays, continues_batch the first step's, the later
    steps repeating it): each element must be the float step_time_s gives that step, or fast-forward would change
    a replay's outputs."""
    model, rows, first_context, num_steps = _model("qwen3-0.6b"), 7, 900, 12
    one_by_one = [model.step_time_s(_decode(rows, first_context + k, continues if k == 0 else 1), slowdown)
                  for k in range(num_steps)]
    run = _decode(rows, first_context, continues)
    run.decode_context_tokens = np.arange(rows * first_context, rows * (first_context + num_steps), rows)
    run.max_decode_context_tokens = np.arange(first_context, first_context + num_steps)
    assert model.decode_run_s(run, slowdown).tolist() == one_by_one  # exactly, not approximately
    assert (one_by_one[0] > one_by_one[1]) == (continues == 0)


def test_a_gpu_without_profiles_gets_the_default_constants() -> None:
    assert _model(gpu="l40s").constants == RooflineConstants() == roofline_constants_for("a100-80g")
    assert roofline_constants_for("h100") not in (RooflineConstants(), roofline_constants_for("h200"))
