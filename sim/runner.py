"""The simulator's Runner: no model, a cost model's predicted step time, tokens chosen by the trace."""

from __future__ import annotations

import math

import numpy as np

from engine.core.clock import Clock
from engine.core.runner import RunnerOutput
from engine.core.scheduler import ScheduledBatch
from sim.cost_model import CostModel
from sim.host_speed import ConstantHostSpeed, HostSpeed

# Fewer steps than this are summed one by one: an array pass has a fixed cost of some twenty numpy calls.
_MIN_ARRAY_STEPS = 12


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

    def quiet_step_ends_s(self, batch: ScheduledBatch, start_s: float, max_steps: int,
                          horizon_s: float) -> np.ndarray:
        """End times of the decode steps that repeat ``batch`` (which this changes) from ``start_s``, each context
        one token longer than in the step before (engine.core.quiet_window): at most ``max_steps`` of them, each
        ending strictly before ``horizon_s``, as a float64 array. Each end is the previous one plus ``duration_at``,
        as the step loop adds them."""
        run_s = getattr(self.cost_model, "decode_run_s", None)
        host = self.host_speed
        # The first steps one by one: many plans end within them (the next arrival is that close), arrays only
        # pay off over more steps, and the last one's length sizes the first array.
        ends = self._step_ends_one_by_one(batch, start_s, min(max_steps, 2), horizon_s)
        if len(ends) < 2 or len(ends) == max_steps:
            return np.array(ends, dtype=np.float64)
        # Durations hardly change within a run (contexts only grow): the last one sizes the rest to the horizon
        # (a short guess only costs another chunk).
        num_done = len(ends)
        step_s = ends[-1] - ends[-2]
        fit = (horizon_s - ends[-1]) / step_s if step_s > 0 else math.inf
        num_steps = max_steps - num_done if fit >= max_steps else min(max_steps - num_done, int(fit) + 1)
        if num_steps <= _MIN_ARRAY_STEPS or run_s is None or not (host is None or isinstance(host, ConstantHostSpeed)):
            ends += self._step_ends_one_by_one(batch, ends[-1], max_steps - num_done, horizon_s)
            return np.array(ends, dtype=np.float64)
        slowdown = None if host is None else host.slowdown
        bs = batch.num_decode_seqs
        first_context = batch.decode_context_tokens - bs * num_done  # the run's first step, counted from there
        first_longest = batch.max_decode_context_tokens - num_done
        t_s = ends[-1]
        chunks = [np.array(ends, dtype=np.float64)]
        while True:
            steps = np.arange(num_done, num_done + num_steps, dtype=np.int64)
            batch.decode_context_tokens = first_context + bs * steps
            batch.max_decode_context_tokens = first_longest + steps
            durations_s = run_s(batch, slowdown)
            if durations_s is None:  # the cost model takes no arrays for this batch
                batch.decode_context_tokens = first_context + bs * num_done
                batch.max_decode_context_tokens = first_longest + num_done
                chunks.append(np.array(self._step_ends_one_by_one(batch, t_s, max_steps - num_done, horizon_s),
                                       dtype=np.float64))
                return np.concatenate(chunks)
            sums_s = np.empty(num_steps + 1)
            sums_s[0] = t_s
            sums_s[1:] = durations_s
            np.add.accumulate(sums_s, out=sums_s)  # strictly left to right: the step loop's own additions
            sums_s = sums_s[1:]
            past = sums_s >= horizon_s
            reached = int(past.argmax()) if past.any() else num_steps  # the first step that would end too late
            chunks.append(sums_s[:reached])
            num_done += reached
            if reached < num_steps or num_done == max_steps:
                return np.concatenate(chunks)
            t_s = float(sums_s[-1])
            # Durations hardly change within a run (contexts only grow): the first one sizes the next chunk
            # (a short guess only costs another chunk).
            fit = (horizon_s - t_s) / float(durations_s[0])
            num_steps = max_steps - num_done if fit >= max_steps else min(max_steps - num_done, int(fit) + 1)

    def _step_ends_one_by_one(self, batch: ScheduledBatch, start_s: float, max_steps: int,
                              horizon_s: float) -> list[float]:
        ends: list[float] = []
        t_s = start_s
        for _ in range(max_steps):
            end_s = t_s + self.duration_at(batch, t_s)
            if end_s >= horizon_s:
                break
            ends.append(end_s)
            t_s = end_s
            batch.decode_context_tokens += batch.num_decode_seqs
            batch.max_decode_context_tokens += 1
        return ends

    def release(self, seqs) -> None:
        """Nothing to forget: the cost model keeps no per-request state."""
