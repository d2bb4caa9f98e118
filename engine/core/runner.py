"""The one interface between the step loop and whatever executes a step (torch-free).

Two implementations: ``engine.gpu.model_runner.ModelRunner`` runs the model on a GPU (or CPU), and
``sim.runner.CostModelRunner`` predicts the step's duration from a cost model. Everything the
simulator knows about a step comes through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from engine.core.scheduler import ScheduledBatch
    from engine.core.sequence import Sequence


@dataclass(slots=True)
class RunnerOutput:
    token_ids: list[int]  # one per batch sequence; ignored where the sequence samples nothing this step
    duration_s: float | None = None  # predicted step time (simulator); None: the clock measures it


class Runner(Protocol):
    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        """Compute one scheduled step; returns a token for each sequence that samples one."""
        ...

    def release(self, seqs: list[Sequence]) -> None:
        """Forget per-request state (sampling generators, ...) of sequences that finished or were
        aborted; the engine calls it once per sequence, after the step that finished it (as vLLM's
        scheduler output carries ``finished_req_ids``)."""
        ...
