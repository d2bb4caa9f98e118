"""The one interface between the step loop and whatever executes a step (torch-free).

Two implementations: ``engine.gpu.model_runner.ModelRunner`` runs the model on a GPU (or CPU), and
``sim.runner.CostModelRunner`` predicts the step's duration from a cost model. Everything the
simulator knows about a step comes through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.core.scheduler import ScheduledBatch


@dataclass(slots=True)
class RunnerOutput:
    token_ids: list[int]  # one per batch sequence; ignored where the sequence samples nothing this step
    duration_s: float | None = None  # predicted step time (simulator); None: the clock measures it


class Runner(Protocol):
    def run(self, batch: ScheduledBatch) -> RunnerOutput: ...
