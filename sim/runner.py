"""The simulator's Runner: no model, a cost model's predicted step time, tokens chosen by the trace."""

from __future__ import annotations

from engine.core.clock import Clock
from engine.core.runner import RunnerOutput
from engine.core.scheduler import ScheduledBatch
from sim.cost_model import CostModel
from sim.host_speed import HostSpeed


class CostModelRunner:
    """Samples a fixed token for every sequence: output lengths come from the trace (as with ignore_eos),
    and since block hashes chain over the prompt, equal generated tokens never fake a prefix-cache hit.
    With a ``host_speed``, each step's host-bound part is scaled by its slowdown at the step's start."""

    def __init__(self, cost_model: CostModel, token_id: int = 0, host_speed: HostSpeed | None = None,
                 clock: Clock | None = None) -> None:
        if host_speed is not None and clock is None:
            raise ValueError("a host speed that varies over time needs the simulation clock")
        self.cost_model = cost_model
        self.token_id = token_id
        self.host_speed = host_speed
        self.clock = clock

    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        start_s = self.clock.now() if self.host_speed is not None else 0.0  # the only reader of the time
        return RunnerOutput([self.token_id] * len(batch.seqs), self.duration_at(batch, start_s))

    def duration_at(self, batch: ScheduledBatch, start_s: float) -> float:
        """The predicted time of a step that starts at ``start_s`` (the host may run slower at times)."""
        if self.host_speed is None:
            return self.cost_model.step_time_s(batch)
        return self.cost_model.step_time_s(batch, self.host_speed.slowdown_at(start_s))

    def release(self, seqs) -> None:
        """Nothing to forget: the cost model keeps no per-request state."""
