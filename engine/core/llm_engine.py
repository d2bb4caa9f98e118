"""The step loop: ``schedule -> runner.run -> postprocess``, over a Runner and a Clock (torch-free).

``step_body`` is the one step body. The GPU engine and the profiler call ``step()``, which runs it on
a real clock; the simulator's replica process runs it with ``yield from engine.step_body(env.timeout)``
so its clock advances by the runner's predicted duration between the run and the postprocess. The
scheduling, stop rules, records and the runner's release of finished requests are this very code in
every path.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator, Iterable

from engine.core.clock import Clock, WallClock
from engine.core.config import EngineConfig
from engine.core.records import StepLog
from engine.core.runner import RequestError, Runner, RunnerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import Sequence

_log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        runner: Runner,
        *,
        clock: Clock | None = None,
        eos_token_ids: Iterable[int] = (),
        replica: int = 0,
        lazy_tokens: bool = False,
    ) -> None:
        self.config = config
        self.runner = runner
        self.clock = clock if clock is not None else WallClock()
        self.lazy_tokens = lazy_tokens  # see Scheduler: for a runner that reads no sequence's tokens
        self.scheduler = Scheduler(config, eos_token_ids, lazy_tokens)
        self.replica = replica
        self.step_log = StepLog(replica=replica, num_kv_blocks=config.num_gpu_blocks)
        self._seq_ids = itertools.count()
        self._step_start_s = 0.0

    def reset(self) -> None:
        """Start over with an empty scheduler, cache and step log (e.g. after a warm-up)."""
        if self.has_unfinished_requests():
            raise RuntimeError("cannot reset an engine with unfinished requests")
        self.scheduler = Scheduler(self.config, self.scheduler.eos_token_ids, self.lazy_tokens)
        self.step_log = StepLog(replica=self.replica, num_kv_blocks=self.config.num_gpu_blocks)

    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        request_id: object = None,
        arrival_s: float | None = None,
        block_hashes: list[int] | None = None,
    ) -> Sequence:
        """Queue a request. One that can never be served comes back already finished as rejected. ``block_hashes``:
        the chained hashes of the prompt's full blocks at this engine's block size (block_manager.prefix_block_hashes
        of ``prompt_token_ids``), where the caller has them (a router that read the prefix caches): the sequence takes
        the list, and its blocks are not hashed again."""
        now_s = self.clock.now()
        # (positional: keywords to a class call cost a dict per request)
        seq = Sequence(next(self._seq_ids), prompt_token_ids, sampling_params,
                       now_s if arrival_s is None else arrival_s, request_id)
        seq.replica = self.replica
        if block_hashes is not None:
            seq.block_hashes = block_hashes
        if not self.scheduler.add(seq):
            seq.finish_s = now_s
        return seq

    def reject_unbuilt(
        self, num_prompt_tokens: int, sampling_params: SamplingParams, *, request_id: object, arrival_s: float
    ) -> Sequence | None:
        """Reject a request from its prompt length alone, before its tokens are built (a trace row may ask
        for more tokens than memory holds); None when it may be served."""
        reason = self.scheduler.rejection_reason_for(num_prompt_tokens)
        if reason is None:
            return None
        seq = Sequence(next(self._seq_ids), [], sampling_params, arrival_s=arrival_s, request_id=request_id)
        seq.num_prompt_tokens = num_prompt_tokens  # what it asked for, though its tokens were never made
        seq.replica = self.replica
        self.scheduler.reject(seq, reason)
        seq.finish_s = self.clock.now()
        return seq

    def abort_request(self, seq: Sequence) -> None:
        self.scheduler.abort(seq)
        if seq.finish_s is None:
            seq.finish_s = self.clock.now()
        self.runner.release([seq])

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def begin_step(self) -> ScheduledBatch:
        self._step_start_s = now_s = self.clock.now()
        batch = self.scheduler.schedule(now_s)
        batch.step_index = self.step_log.num_rows
        return batch

    def end_step(self, batch: ScheduledBatch, output: RunnerOutput) -> list[Sequence]:
        """Apply the runner's tokens at the step's end time and release what finished; returns those sequences."""
        end_s = self.clock.now()  # the tokens' time: when the runner handed them over
        scheduler = self.scheduler
        finished = scheduler.postprocess(batch, output.token_ids, end_s)
        # The step lasts until its postprocess is done, as the step log's column says (a simulated clock
        # has not moved since end_s; a real one has, by the postprocess's per-sequence work).
        self.step_log.record(
            batch,
            self._step_start_s,
            self.clock.now() - self._step_start_s,
            len(scheduler.running),
            len(scheduler.waiting),
            scheduler.block_manager.num_used_blocks,
            len(finished),
            output.ran_ahead,
        )
        if finished:
            self.runner.release(finished)
        return finished

    def step_body(
        self, wait: Callable[[float], object] | None = None
    ) -> Generator[object, object, tuple[ScheduledBatch, list[Sequence]]]:
        """One step: schedule, run, wait for the step's duration where the clock is simulated, postprocess.

        With ``wait`` (the simulator's ``env.timeout``), a runner that predicts its step time makes this
        yield ``wait(duration_s)`` once; the caller's clock then reads the step's end. Without it the
        clock is real: the runner returned after the work was done, and nothing is yielded. Returns the
        batch that ran and the sequences that finished.
        """
        batch = self.begin_step()
        if batch.is_empty:
            return batch, []
        try:
            output = self.runner.run(batch)
            if len(output.token_ids) != len(batch.seqs):
                raise RuntimeError(
                    f"the runner returned {len(output.token_ids)} tokens for {len(batch.seqs)} sequences")
        except Exception as exc:  # one bad request, or a failed step, must not wedge the engine
            return batch, self._fail_step(batch, exc)
        except BaseException:  # Ctrl-C mid-step: the step did not happen, so nothing may promise its KV
            self._forget_step(batch)
            raise
        if wait is not None and output.duration_s is not None:
            yield wait(output.duration_s)
        return batch, self.end_step(batch, output)

    def _fail_step(self, batch: ScheduledBatch, exc: Exception) -> list[Sequence]:
        """The runner could not complete the step. The sequences it blames (all of the batch when it names
        none) finish with ERROR; the others keep their place and compute this step's tokens next step.
        No block registered for this step's tokens stays in the prefix cache either way."""
        _log.warning("step failed: %s: %s", type(exc).__name__, exc, exc_info=not isinstance(exc, RequestError))
        blamed = exc.seqs if isinstance(exc, RequestError) else batch.seqs
        withdrawn = self._forget_step(batch)
        failed = self.scheduler.fail(blamed, f"{type(exc).__name__}: {exc}", self.clock.now())
        # A sequence admitted in this step on prefix-cache hits of blocks another one registered in it counts them as
        # computed, though the step that was to write their KV never happened: it starts over (it kept them, and its
        # next step read KV that was never written, other tokens without a word).
        self.scheduler.recompute_holders(withdrawn)
        if failed:
            self.runner.release(failed)
        return failed

    def _forget_step(self, batch: ScheduledBatch) -> set[int]:
        """Withdraw what the step's rows registered for tokens they did not compute; returns those blocks."""
        self.scheduler.settle_tokens()  # what follows reads every row's computed count
        block_manager = self.scheduler.block_manager
        withdrawn: set[int] = set()
        for seq in batch.seqs:
            withdrawn.update(block_manager.forget_uncomputed(seq))
        return withdrawn

    def step(self) -> tuple[ScheduledBatch, list[Sequence]]:
        """Run one step on a real clock: the batch that ran and the sequences that finished."""
        body = self.step_body()
        try:
            next(body)
        except StopIteration as done:
            return done.value
        raise RuntimeError("a step on a real clock never waits")
