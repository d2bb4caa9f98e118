"""The step loop: ``schedule -> runner.run -> postprocess``, over a Runner and a Clock (torch-free).

The GPU engine calls ``step()``. The simulator calls ``begin_step()`` and ``end_step()`` itself with a
simulated wait between them, so the scheduling, stop rules and records are this very code in both.
"""

from __future__ import annotations

import itertools
from typing import Iterable

from engine.core.clock import Clock, WallClock
from engine.core.config import SchedulerConfig
from engine.core.records import StepLog
from engine.core.runner import Runner, RunnerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import Sequence


class LLMEngine:
    def __init__(
        self,
        config: SchedulerConfig,
        runner: Runner,
        *,
        clock: Clock | None = None,
        eos_token_ids: Iterable[int] = (),
        replica: int = 0,
    ) -> None:
        self.config = config
        self.runner = runner
        self.clock = clock if clock is not None else WallClock()
        self.scheduler = Scheduler(config, eos_token_ids)
        self.replica = replica
        self.step_log = StepLog(replica=replica, num_kv_blocks=config.num_gpu_blocks)
        self._seq_ids = itertools.count()
        self._step_start_s = 0.0

    def reset(self) -> None:
        """Start over with an empty scheduler, cache and step log (e.g. after a warm-up)."""
        if self.has_unfinished_requests():
            raise RuntimeError("cannot reset an engine with unfinished requests")
        self.scheduler = Scheduler(self.config, self.scheduler.eos_token_ids)
        self.step_log = StepLog(replica=self.replica, num_kv_blocks=self.config.num_gpu_blocks)

    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        request_id: object = None,
        arrival_s: float | None = None,
    ) -> Sequence:
        """Queue a request. One that can never be served comes back already finished as rejected."""
        now_s = self.clock.now()
        seq = Sequence(
            next(self._seq_ids),
            prompt_token_ids,
            sampling_params,
            arrival_s=now_s if arrival_s is None else arrival_s,
            request_id=request_id,
        )
        seq.replica = self.replica
        if not self.scheduler.add(seq):
            seq.finish_s = now_s
        return seq

    def abort_request(self, seq: Sequence) -> None:
        self.scheduler.abort(seq)
        if seq.finish_s is None:
            seq.finish_s = self.clock.now()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def begin_step(self) -> ScheduledBatch:
        self._step_start_s = now_s = self.clock.now()
        return self.scheduler.schedule(now_s)

    def end_step(self, batch: ScheduledBatch, output: RunnerOutput) -> list[Sequence]:
        """Apply the runner's tokens at the step's end time; returns the sequences that finished."""
        end_s = self.clock.now()
        scheduler = self.scheduler
        finished = scheduler.postprocess(batch, output.token_ids, end_s)
        self.step_log.record(
            batch,
            self._step_start_s,
            end_s - self._step_start_s,
            len(scheduler.running),
            len(scheduler.waiting),
            scheduler.block_manager.num_used_blocks,
            len(finished),
        )
        return finished

    def step(self) -> tuple[ScheduledBatch, list[Sequence]]:
        """Run one step on hardware time: the batch that ran and the sequences that finished."""
        batch = self.begin_step()
        if batch.is_empty:
            return batch, []
        output = self.runner.run(batch)
        return batch, self.end_step(batch, output)
