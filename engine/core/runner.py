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


class RequestError(Exception):
    """A failure a runner can pin on particular sequences (a seed it cannot use, say): the engine finishes
    those with an error and keeps the rest of the batch; any other exception fails the whole step."""

    def __init__(self, seqs: list[Sequence], message: str) -> None:
        super().__init__(message)
        self.seqs = seqs


@dataclass(slots=True)
class RunnerOutput:
    token_ids: list[int]  # one per batch sequence; ignored where the sequence samples nothing this step
    duration_s: float | None = None  # predicted step time (simulator); None: the clock measures it
    ran_ahead: bool = False  # launched during the step before, its host work overlapped (step log's ran_ahead)


class Runner(Protocol):
    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        """Compute one scheduled step; returns a token for each sequence that samples one."""
        ...

    def release(self, seqs: list[Sequence]) -> None:
        """Forget per-request state (sampling generators, ...) of sequences that finished or were
        aborted; the engine calls it once per sequence, after the step that finished it (as vLLM's
        scheduler output carries ``finished_req_ids``)."""
        ...
