"""The simulator's Runner: no model, a cost model's predicted step time, tokens chosen by the trace."""

from __future__ import annotations

from engine.runner import RunnerOutput
from engine.scheduler import ScheduledBatch
from sim.cost_model import CostModel


class CostModelRunner:
    """Samples a fixed token for every sequence: output lengths come from the trace (as with ignore_eos),
    and since block hashes chain over the prompt, equal generated tokens never fake a prefix-cache hit."""

    def __init__(self, cost_model: CostModel, token_id: int = 0) -> None:
        self.cost_model = cost_model
        self.token_id = token_id

    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        return RunnerOutput([self.token_id] * len(batch.seqs), self.cost_model.step_time_s(batch))
