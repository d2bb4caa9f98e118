"""The simulator's Runner: no model, a cost model's predicted step time, tokens chosen by the trace."""

from __future__ import annotations

import math
from array import array

import numpy as np

from engine.core.clock import Clock
from engine.core.runner import RunnerOutput
from engine.core.scheduler import ScheduledBatch
from sim.cost_model import CostModel
from sim.host_speed import ConstantHostSpeed, HostSpeed

# Fewer steps than this are summed one by one: an array pass has a fixed cost of some twenty numpy calls.
_MIN_ARRAY_STEPS = 12
# quiet_segment_ends_s sizes a pass to the horizon by the last step it priced, taken this much shorter (steps grow
# longer with their contexts, and a batch of other rows may be longer), and prices at least this many steps: one
# step's price more costs a few instructions, a pass more some twenty numpy calls.
_GUESS_SHARE = 0.75
_MIN_GUESSED_STEPS = 32
# quiet_segment_ends_s sums a segment one step at a time (the cost model's decode_step_s) where it expects at most this
# many steps before the horizon or the segment's end (near capacity most segments end within a few steps: the next
# arrival is that close), and takes array passes after _MAX_SCALAR_STEPS summed so (a guess too short).
_SCALAR_STEPS = 12
_MAX_SCALAR_STEPS = 24


def _ends_one_by_one(duration_s, start_s: float, max_steps: int, horizon_s: float,
                     cross_horizon: bool = False) -> list[float]:
    """The end times of up to ``max_steps`` steps from ``start_s``, step ``k`` lasting ``duration_s(k, its start)``,
    each the end before plus its duration, as the step loop adds them: those ending strictly before ``horizon_s``,
    and with ``cross_horizon`` the first that does not as well."""
    ends: list[float] = []
    t_s = start_s
    for k in range(max_steps):
        end_s = t_s + duration_s(k, t_s)
        if end_s >= horizon_s:
            if cross_horizon:
                ends.append(end_s)
            break
        ends.append(end_s)
        t_s = end_s
    return ends


def _joined(chunks: list[np.ndarray]) -> np.ndarray:
    """The step ends of a run's array passes, one array (most runs take one pass: no copy then)."""
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def _steps_within(span_s: float, step_s: float, max_steps: int) -> int:
    """The steps an array pass is sized for: those of ``step_s`` that start within ``span_s`` (one more than fit, a
    short guess costing only another pass), at most ``max_steps``."""
    fit = span_s / step_s if step_s > 0 else math.inf
    return max_steps if fit >= max_steps else min(max_steps, int(fit) + 1)


def _guessed_steps(span_s: float, step_s: float, max_steps: int) -> int:
    """The steps a pass of quiet_segment_ends_s prices: ``_steps_within`` a step _GUESS_SHARE of ``step_s`` (the last
    one priced; inf before the first), at least _MIN_GUESSED_STEPS, at most ``max_steps``."""
    fit = span_s / (_GUESS_SHARE * step_s) if step_s > 0 else math.inf
    if not fit < max_steps:  # (nan: an endless span and no step priced yet)
        return max_steps
    return max(int(fit) + 1, min(max_steps, _MIN_GUESSED_STEPS))


def _pass_ends(durations_s: np.ndarray, t_s: float, horizon_s: float, cross_horizon: bool) -> tuple[np.ndarray, bool]:
    """The end times of an array pass's steps (float64 ``durations_s``, changed) from ``t_s``, and whether the horizon
    ends the run in it: then only those that end strictly before ``horizon_s`` (with ``cross_horizon``, and the first
    that does not). The first end is t_s + durations_s[0] (added in place: the model's array is new, CostModel says; an
    addition is commutative, bit for bit), each next one the end before plus its duration, strictly left to right as
    the step loop adds them; a few numpy calls fewer than summing into [t_s, *durations_s]. The sums into a new array:
    accumulate with out= parses a keyword and checks the overlap, some 1,900 instructions more a pass than a fresh
    array of ~50 floats."""
    durations_s[0] += t_s
    ends_s = np.add.accumulate(durations_s)
    if ends_s[-1] < horizon_s:  # ends only grow (every duration is positive): then all of them do
        return ends_s, False
    reached = int(ends_s.searchsorted(horizon_s))  # the first that would end too late, by bisection
    return ends_s[:reached + 1] if cross_horizon else ends_s[:reached], True


# The token every simulated sequence "samples": an id no prompt holds (traces refuse negative ids, and synthesised ones
# lie in [0, vocab)). It was 0: a prompt with a block of zeros after another request's prompt (stored
# prompt_token_ids) hit that request's generated blocks in the prefix cache, cached tokens the engine, whose model
# samples real tokens, never had, and the offline schedules parted.
SIMULATED_TOKEN_ID = -1


def first_token_id(seq_id: int) -> int:
    """The first token a sampled sequence gets (CostModelRunner.distinct_first_tokens): negative as the common one (no
    prompt holds it), below it, and within int32 (the prefix cache hashes tokens as int32)."""
    return -2 - seq_id % (2**31 - 2)


class CostModelRunner:
    """Samples a fixed token for every sequence (with ``distinct_first_tokens``, each one's first token its own):
    output lengths come from the trace (as with ignore_eos),
    and since block hashes chain over the prompt and the token is one no prompt holds, generated tokens never fake
    a prefix-cache hit on a prompt. With a ``host_speed``, each step's host-bound part is scaled by its slowdown at
    the step's start."""

    def __init__(self, cost_model: CostModel, token_id: int = SIMULATED_TOKEN_ID, host_speed: HostSpeed | None = None,
                 clock: Clock | None = None, distinct_first_tokens: bool = False) -> None:
        if host_speed is not None and clock is None:
            raise ValueError("a host speed that varies over time needs the simulation clock")
        self.cost_model = cost_model
        # Whether the engine modelled launches a step that repeats its batch during the step before (its profile
        # says so: the GPU runner's run-ahead); the step log's ran_ahead marks the steps it launches so (run).
        self.runs_decode_ahead = getattr(cost_model, "runs_decode_ahead", False)
        self.token_id = token_id
        self.host_speed = host_speed
        self.clock = clock
        # Requests that sample with a temperature: each one's first token is its own (first_token_id), the rest the
        # common token. Two requests of one prompt then get continuations whose KV blocks hash apart, as a sampling
        # engine's do: with one token for all, a preempted one came back on the other's generated blocks in the
        # prefix cache, which the engine's differing samples never hold (tests/engine/test_probe_session29_b.py).
        # Greedy requests of one prompt continue alike on the GPU too, as do those with top_k=1 (an argmax at any
        # temperature: engine.core.sampling_params.samples_argmax): they keep the common token.
        self.distinct_first_tokens = distinct_first_tokens
        self._guess_s = math.inf  # quiet_segment_ends_s's guess at a decode step's length: the last it priced
        # What quiet_segment_ends_s prices with: the model's decode_steps_s, None where it has none or the host's speed
        # varies (asked once: it runs for every segment of every window).
        constant_host = host_speed is None or isinstance(host_speed, ConstantHostSpeed)
        self._segment_steps_s = getattr(cost_model, "decode_steps_s", None) if constant_host else None
        # ... and the price of one such step, for segments of a few steps (the calibrated host speed only).
        self._segment_step_s = (getattr(cost_model, "decode_step_s", None)
                                if host_speed is None and self._segment_steps_s is not None else None)
        self._max_graph_bs = getattr(cost_model, "max_graph_bs", 0)

    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        start_s = 0.0
        if self.host_speed is not None:
            start_s = self.clock.now()  # the only reader of the time
            self.host_speed.forget_before(start_s)
        tokens = [self.token_id] * len(batch.seqs)
        if self.distinct_first_tokens and batch.num_prefill_seqs:  # (a decode-only step samples no first token)
            for row, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
                if seq.num_computed_tokens + num_new == seq.num_prompt_tokens == len(seq.token_ids):
                    tokens[row] = first_token_id(seq.seq_id)
        # Launched ahead where the GPU runner launches it: a step that repeats its batch, where no request can be
        # admitted next. The runner decides during the step before, on that step's next_admits_none, and holds the
        # launch back for a request arriving meanwhile; a step that repeats its batch admitted nobody, so either
        # request still waits at its schedule (unless the batch is full, when both flags hold): its own flag says
        # it. Every repeating step was marked: under KV pressure, with requests waiting that did not fit, the
        # engine ran 21 of 113 such steps ahead (tests/engine/test_probe_session29_b.py).
        return RunnerOutput(tokens, self.duration_at(batch, start_s),
                            self.runs_decode_ahead and batch.continues_batch == 1 and batch.next_admits_none)

    def duration_at(self, batch: ScheduledBatch, start_s: float) -> float:
        """The predicted time of a step that starts at ``start_s`` (the host may run slower at times)."""
        if self.host_speed is None:
            return self.cost_model.step_time_s(batch)
        return self.cost_model.step_time_s(batch, self.host_speed.slowdown_at(start_s))

    def quiet_step_ends_s(self, batch: ScheduledBatch, start_s: float, max_steps: int,
                          horizon_s: float, cross_horizon: bool = False) -> np.ndarray:
        """End times of the decode steps that repeat ``batch`` (which this changes) from ``start_s``, each context
        one token longer than in the step before (engine.core.quiet_window): at most ``max_steps`` of them, each
        ending strictly before ``horizon_s`` (with ``cross_horizon``, the first one that does not as well), as a
        float64 array. Each end is the previous one plus ``duration_at``, as the step loop adds them. Only the
        first step can be one that does not repeat the batch before it (``batch.continues_batch``): the later
        ones repeat the first. ``batch.step_index`` goes along (an array where the contexts are)."""
        run_s = getattr(self.cost_model, "decode_run_s", None)
        # The same from the first step's numbers, the contexts built by the model (no batch to set for each pass).
        run_from = getattr(self.cost_model, "decode_steps_s", None)
        host = self.host_speed
        if host is not None:  # the clock, not start_s: a window is planned in segments, and planned again from now
            host.forget_before(self.clock.now())
        # The first step's length sizes the run to the horizon (durations hardly change within a run: contexts
        # only grow; a short guess only costs another array pass). Short runs are summed one by one: many plans
        # end within a few steps (the next arrival is that close), and an array pass costs some fifteen numpy calls.
        # The later steps continue the first one's batch, which a first step that does not continue the batch before
        # it prices apart (a step not planned ahead): sized by that one step, a window cut by the horizon took two or
        # three passes where one does (a third of the Azure trace's plans). So the run is sized by a step that
        # continues the batch, even where the first does not (a step more at most: the first is the longer); that
        # first step's own price is asked only where steps are summed one by one (an array pass prices it itself).
        # Both were asked up front: a second price for most calls (7,395 of the 9,002 in Azure's first 5,000
        # requests start with a step that does not continue the batch).
        continues = batch.continues_batch
        batch.continues_batch = 1
        first_s = self.duration_at(batch, start_s)
        batch.continues_batch = continues
        num_steps = _steps_within(horizon_s - start_s, first_s, max_steps)
        # A host speed that varies is piecewise constant (sim.host_speed): each array pass prices the steps that start
        # within one piece, at its slowdown, as the steps taken one by one ask it at their starts.
        pieces = host is not None and not isinstance(host, ConstantHostSpeed)
        if num_steps <= _MIN_ARRAY_STEPS or (run_s is None and run_from is None) or (
                pieces and not hasattr(host, "piece_at")):
            if not continues:
                first_s = self.duration_at(batch, start_s)
            end_s = start_s + first_s
            if max_steps < 1:
                return np.empty(0)
            if end_s >= horizon_s:
                return np.array([end_s]) if cross_horizon else np.empty(0)
            batch.continues_batch = 1
            batch.decode_context_tokens += batch.num_decode_seqs
            batch.max_decode_context_tokens += 1
            batch.step_index += 1
            ends = [end_s, *self._step_ends_one_by_one(batch, end_s, max_steps - 1, horizon_s, cross_horizon)]
            return np.array(ends, dtype=np.float64)
        slowdown = None if host is None or pieces else host.slowdown
        piece_end_s = math.inf  # the first step start another slowdown applies to
        bs = batch.num_decode_seqs
        first_context, first_longest = batch.decode_context_tokens, batch.max_decode_context_tokens
        first_index = batch.step_index
        t_s = start_s
        num_done = 0
        chunks = []

        def as_step(n: int) -> None:
            """The batch as the run's step ``n`` (scalars), for sums taken one step at a time from there."""
            batch.decode_context_tokens = first_context + bs * n
            batch.max_decode_context_tokens = first_longest + n
            batch.step_index = first_index + n

        while True:
            if pieces:
                slowdown, piece_end_s = host.piece_at(t_s)
                # Sized to the piece too (a step's margin more): a pass prices every step it holds, kept or not.
                num_steps = _steps_within(piece_end_s - t_s + first_s, first_s, num_steps)
                if num_steps <= _MIN_ARRAY_STEPS:  # a short piece (episodes of milliseconds): steps one by one,
                    # each asking its own start's slowdown, for as many as an array pass is worth
                    as_step(num_done)
                    count = min(max_steps - num_done, _MIN_ARRAY_STEPS)
                    ends = self._step_ends_one_by_one(batch, t_s, count, horizon_s, cross_horizon)
                    chunks.append(np.array(ends, dtype=np.float64))
                    num_done += len(ends)
                    if len(ends) < count or num_done == max_steps or ends[-1] >= horizon_s:  # the horizon, or all
                        return _joined(chunks)
                    t_s = ends[-1]
                    batch.continues_batch = 1
                    num_steps = _steps_within(horizon_s - t_s, first_s, max_steps - num_done)
                    continue
            if run_from is not None:  # the pass's first step: the model builds what it reads
                durations_s = run_from(bs, first_context + bs * num_done, first_longest + num_done,
                                       batch.continues_batch, num_steps, slowdown)
            else:
                batch.decode_context_tokens = np.arange(first_context + bs * num_done,
                                                        first_context + bs * (num_done + num_steps), bs, dtype=np.int64)
                batch.max_decode_context_tokens = np.arange(first_longest + num_done,
                                                            first_longest + num_done + num_steps, dtype=np.int64)
                # The run's first step: a model that keys on it numbers the others from it (sim.bands), an arange
                # less per pass for the models that do not.
                batch.step_index = first_index + num_done
                durations_s = run_s(batch, slowdown)  # the first step of the first pass as the batch says, the rest 1
            if durations_s is None:  # the cost model takes no arrays for this batch
                as_step(num_done)
                chunks.append(np.array(self._step_ends_one_by_one(batch, t_s, max_steps - num_done, horizon_s,
                                                                  cross_horizon), dtype=np.float64))
                return _joined(chunks)
            # The next pass is sized by this one's last step: the first may be priced apart (it need not continue
            # the batch before it), and durations grow with the contexts.
            first_s = float(durations_s[-1])
            ends_s = durations_s if durations_s.dtype == np.float64 else durations_s.astype(np.float64)
            # (With pieces, the step in progress at the horizon is kept to find the piece's last step: dropped below
            # unless asked for.)
            ends_s, cut = _pass_ends(ends_s, t_s, horizon_s, cross_horizon or pieces)
            if pieces:
                # Step k > 0 starts at ends_s[k - 1]: those from the piece's end on are priced again by the next pass
                # (where the horizon cut the pass, the step that crosses it is the last: the steps before it start
                # before the piece ends, or some do not).
                in_piece = 1 + int(ends_s[:-1].searchsorted(piece_end_s))
                if in_piece < len(ends_s):
                    chunks.append(ends_s[:in_piece])
                    num_done += in_piece
                    if num_done == max_steps:
                        return _joined(chunks)
                    t_s = float(ends_s[in_piece - 1])
                    batch.continues_batch = 1
                    num_steps = _steps_within(horizon_s - t_s, first_s, max_steps - num_done)
                    continue
                if cut and not cross_horizon:
                    ends_s = ends_s[:-1]
            chunks.append(ends_s)
            num_done += num_steps
            if cut or num_done == max_steps:
                return _joined(chunks)
            t_s = float(ends_s[-1])
            batch.continues_batch = 1
            num_steps = _steps_within(horizon_s - t_s, first_s, max_steps - num_done)

    def quiet_segment_ends_s(self, bs: int, context: int, longest: int, continues: int, start_s: float, max_steps: int,
                             horizon_s: float, cross_horizon: bool = False) -> np.ndarray | array | None:
        """``quiet_step_ends_s`` of a decode-only batch given by its numbers (engine.core.quiet_window's
        ``segment_ends``): ``bs`` rows whose contexts in the first step sum to ``context``, the longest ``longest``,
        that step continuing the batch before it as ``continues`` says; the very floats, without a batch to build or a
        first step priced apart to size the run by (the last pass's last step sizes it: a guess too long only prices
        steps past the horizon, a few floats each, too short another pass). None where the cost model has no
        ``decode_steps_s``, the host's speed varies or ``bs`` is no CUDA-graph batch: the caller then asks
        ``quiet_step_ends_s``. A segment expected to end within _SCALAR_STEPS steps comes as an array('d') of the same
        floats (summed one step at a time: the caller reads its length, its items, a slice and its bytes)."""
        steps_s = self._segment_steps_s
        if steps_s is None:
            return None
        host = self.host_speed
        slowdown = None
        if host is not None:
            host.forget_before(self.clock.now())
            slowdown = host.slowdown
        t_s = start_s
        num_done = 0
        chunks = []  # the passes before the last (most segments take one: no call to join them)
        step_s = self._segment_step_s
        if step_s is not None and 0 < bs <= self._max_graph_bs and (
                max_steps <= _SCALAR_STEPS or horizon_s - start_s < _SCALAR_STEPS * self._guess_s):
            # A few steps: each priced by the function the step loop prices it with and added to the end before, as
            # _pass_ends adds an array pass's (the same floats: decode_steps_s is that function element by element),
            # without a pass's fixed cost of some twenty numpy calls, or pricing steps past the horizon.
            limit = max_steps if max_steps < _MAX_SCALAR_STEPS else _MAX_SCALAR_STEPS
            last_s = [self._guess_s]  # the last step's price: the next pass's guess

            def duration_s(k: int, _start_s: float) -> float:
                last_s[0] = step_s(bs, context + bs * k, longest + k, continues if not k else 1)
                return last_s[0]

            ends = array("d", _ends_one_by_one(duration_s, start_s, limit, horizon_s, cross_horizon))
            self._guess_s = last_s[0]
            num_done = len(ends)
            if num_done < limit or num_done == max_steps or (ends and ends[-1] >= horizon_s):
                return ends  # the horizon, or every step
            t_s = ends[-1]
            chunks.append(np.frombuffer(ends))  # the rest in array passes, from the step after these
        num_steps = _guessed_steps(horizon_s - t_s, self._guess_s, max_steps - num_done)
        while True:
            durations_s = steps_s(bs, context + bs * num_done, longest + num_done, continues if not num_done else 1,
                                  num_steps, slowdown)
            if durations_s is None:
                return None
            self._guess_s = step_s = float(durations_s[-1])
            ends_s, cut = _pass_ends(durations_s, t_s, horizon_s, cross_horizon)
            num_done += num_steps
            if cut or num_done == max_steps:
                return np.concatenate((*chunks, ends_s)) if chunks else ends_s
            chunks.append(ends_s)
            t_s = float(ends_s[-1])
            num_steps = _guessed_steps(horizon_s - t_s, step_s, max_steps - num_done)

    def _step_ends_one_by_one(self, batch: ScheduledBatch, start_s: float, max_steps: int,
                              horizon_s: float, cross_horizon: bool = False) -> list[float]:
        def duration_s(k: int, t_s: float) -> float:
            if k:  # a step after the first repeats the batch before it, each context a token longer
                batch.continues_batch = 1
                batch.decode_context_tokens += batch.num_decode_seqs
                batch.max_decode_context_tokens += 1
                batch.step_index += 1
            return self.duration_at(batch, t_s)

        return _ends_one_by_one(duration_s, start_s, max_steps, horizon_s, cross_horizon)

    def release(self, seqs) -> None:
        """Nothing to forget: the cost model keeps no per-request state."""
