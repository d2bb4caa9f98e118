"""Replays a trace on simulated replicas with simpy: each replica runs the engine's own step body
(``LLMEngine.step_body``) with a cost-model runner, behind a router.

Requests join a replica's waiting queue at their arrival time and are considered at the next step
boundary, exactly as on hardware; an idle replica sleeps until a request arrives.
"""

from __future__ import annotations

import functools
import gc
import heapq
import math
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from heapq import heappop, heappush
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Protocol

import numpy as np
import simpy
from simpy.events import NORMAL, URGENT

from engine.core.host_memory import host_memory_available
from engine.core.llm_engine import LLMEngine
from engine.core.model_config import ModelShape
from engine.core.quiet_window import QuietRun, admits_none_from, plan_quiet_window
from engine.core.records import REQUEST_COLUMNS, request_row
from engine.core.sampling_params import samples_argmax
from engine.core.sequence import FinishReason, Sequence
from sim.config import SimConfig
from sim.cost_model import CostModel, RooflineCostModel
from sim.hardware import get_gpu
from sim.host_speed import parse_host_slowdown
from sim.limits import chosen_profile, other_model_of_that_name
from sim.memory import BYTES_PER_STEP_WRITTEN, return_freed_memory_promptly
from sim.profiled_cost_model import ProfiledCostModel, calibration_label
from sim.router import make_router
from sim.runner import CostModelRunner
from traces.requests import TraceRequests, check_host_memory

# A window's plan and bulk apply cost what a few steps of the step loop do: no window is tried where the horizon
# leaves room for fewer steps than this (at the last decode step's length).
_MIN_WINDOW_STEPS = 4
# Where a window's end is not known (a router that reads the replicas: the window ends at the replica's next
# request, whenever the router sends one) its plan is sized by the windows before it: twice the steps the last one
# ran when it was cut, twice its plan when it was not, within these bounds. A longer plan costs more of the steps a
# cut throws away (with a time-varying host speed each planned step is a cost-model call), a shorter one more plans,
# and a plan costs far more than its steps: from 16 and 512, the 64-replica benchmark's first 5,000 requests took
# 4.5 % fewer instructions, 20,000 on 16 replicas (a load nearer the million-request run's) 10.5 % fewer, a band
# replay (host-speed episodes of milliseconds) 7.2 % fewer; from 256 or 512 up, the first two gained 1-2.5 % more and
# the band replay lost 2-3 %.
_LAZY_MIN_STEPS = 128
_LAZY_MAX_STEPS = 4096
# With requests waiting, a window ends at its batch's first finish: in a large batch one comes within a few steps
# (sharegpt's 256-row batches past saturation: windows of 4-8 steps, after a plan refused for 17 of every 18 tries),
# and the step loop's lazy tokens (engine.core.steady_decodes) make its steps cheap there. Such windows are planned
# only for batches of at most this many sequences (the Azure trace's first 5,000 requests at 100 req/s, planned at
# every size: +27 % instructions).
_MAX_QUEUED_WINDOW_SEQS = 32
# A run with a step limit (simulate's max_steps) counts its steps once per this many arrivals and finishes.
_STEP_CHECK_EVERY = 256


class SimEnvironment(simpy.Environment):
    """simpy's environment, able to schedule an event at a given time: ``schedule`` adds a delay to ``now``, and no
    delay from 0.2 s adds up to exactly 0.9 s (one ulp under or over it)."""

    def schedule_at(self, event: simpy.Event, priority: int, at_s: float) -> None:
        heappush(self._queue, (at_s, priority, next(self._eid), event))  # as schedule() pushes it, at ``at_s``

    # The simulated time read in C (simpy's ``now`` is a property in Python): the replicas' loops and every engine's
    # clock (SimClock) read it ~14 times a request, each a Python call.
    now = property(attrgetter("_now"))

    def run(self, until=None):
        """simpy's ``run``; to the end of the queue (``until`` None), its ``step`` in one loop: a call and a try
        less for each event."""
        if until is not None:
            return super().run(until)
        queue = self._queue
        pop = heapq.heappop  # (not this module's heappop: the windows' heaps', which a test counts)
        while queue:
            self._now, _, _, event = pop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):  # a failed event nobody handled: raised, as step
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc
        return None


class ReplicaProcess:
    """A replica's endless process (simulate's ``replica``): started as simpy starts a process (an urgent event now),
    resumed by each event it yields. simpy's Process, less what these never need (a return value, a failed event
    thrown into the generator, interruption, the active process): an exception raised in the generator propagates
    from the event loop as it is."""

    __slots__ = ("_generator", "_resume")

    def __init__(self, env: SimEnvironment, generator) -> None:
        self._generator = generator
        self._resume = resume = self._next  # (one bound method, appended to every event it yields)
        start = simpy.Event(env)
        start._ok, start._value = True, None
        start.callbacks.append(resume)
        env.schedule_at(start, URGENT, env.now)  # as Process's Initialize

    def _next(self, event: simpy.Event) -> None:
        self._generator.send(event._value).callbacks.append(self._resume)


class Arrival(simpy.Event):
    """A request's arrival: at exactly ``at_s`` (a delay added to the previous arrival's time could round next to
    it, and a request reached an idle replica one ulp before it arrived, a negative queue time), and before every
    step that ends at that instant (simpy's urgent priority, as its own process starts). Otherwise which of the two
    came first was simpy's order of scheduling, which a quiet window changes (its end is scheduled at its start, a
    step's at the step's): a request arriving just as a step ended was taken by the next step in one run and waited
    a step longer in the fast-forwarded one."""

    def __init__(self, env: SimEnvironment, at_s: float) -> None:
        # (simpy's Event.__init__, inlined as WindowEnd's: one of these per request)
        self.env = env
        self.callbacks = []
        self._ok = True  # triggered, as simpy's own Timeout and Initialize set it
        self._value = None
        env.schedule_at(self, URGENT, at_s)


class WindowEnd(simpy.Event):
    """The end of a replica's quiet window, at exactly ``at_s`` (its last step's end), with simpy's normal priority: as
    a step's timeout lands on its end, scheduled at the window's start as that timeout would be. A timeout from now
    needed a delay searched for that lands on the very float (now + delay may miss it by an ulp)."""

    def __init__(self, env: SimEnvironment, at_s: float) -> None:
        # (simpy's Event.__init__, inlined as its own Timeout does: one of these per window)
        self.env = env
        self.callbacks = []
        self._ok = True  # triggered, as simpy's own Timeout sets it
        self._value = None
        env.schedule_at(self, NORMAL, at_s)


class LazyWindowEnd(simpy.Event):
    """The end of a replica's lazy window (one that a request routed to the replica cuts short), queued in simpy only
    once no request can cut it any more: before, a cut left the first end queued, resuming no one when its time came
    (0.2 of an event per request on the 64-replica benchmark at 5,000 sessions, 0.73 at 50,000), and moved the replica
    onto a second one. It keeps the place in simpy's order that ``WindowEnd(env, at_s)`` made now would have
    (``reserve``: the event id then taken), so that the run is the same event for event."""

    __slots__ = ("at_s", "eid")

    def __init__(self, env: SimEnvironment) -> None:
        # (simpy's Event.__init__, inlined as WindowEnd's)
        self.env = env
        self.callbacks = []
        self._ok = True
        self._value = None

    def reserve(self, at_s: float) -> None:
        """End at ``at_s``, in simpy's order as if queued now."""
        self.at_s = at_s
        self.eid = next(self.env._eid)

    def schedule(self) -> None:
        heappush(self.env._queue, (self.at_s, NORMAL, self.eid, self))


class StepEnd(simpy.Event):
    """The end of a step ``delay_s`` from now: simpy's Timeout (normal priority, at ``now + delay_s``), made without
    its bound-class lookup and schedule call (one of these per step that the step loop runs: ~2,600 instructions
    less of ~9,700 for the event and its resume)."""

    def __init__(self, env: SimEnvironment, delay_s: float) -> None:
        if delay_s < 0:
            raise ValueError(f"Negative delay {delay_s}")  # (as Timeout says it)
        self.env = env
        self.callbacks = []
        self._ok = True
        self._value = None
        heappush(env._queue, (env._now + delay_s, NORMAL, next(env._eid), self))  # as schedule() pushes it


class StepLimitError(ValueError):
    """A run whose step log grew past what its outputs can be written in (``simulate(max_steps=...)``): stopped then,
    with the limit named, where the kernel's out-of-memory killer ended it later without a word."""


class RunWatch(Protocol):
    """What may end a simulation before its requests are done (``simulate(watch=...)``): told of each request as it
    arrives, asked at the times it names whether the run's outcome is already certain (a capacity point that has
    certainly missed an SLO, ``analysis.capacity.certain_miss``). It only reads the sequences it is given."""

    def arrived(self, index: int, seq: Sequence) -> None: ...

    def next_check_s(self) -> float: ...  # math.inf: no check left

    def check(self, now_s: float) -> bool: ...  # True: stop the run now


class SimClock:
    """The engines' clock (engine.core.clock.Clock): ``now()`` reads the environment's time in one C call, not a
    method calling the environment's property (two Python calls, at every step's start and end)."""

    def __init__(self, env: SimEnvironment) -> None:
        self.now = functools.partial(attrgetter("_now"), env)


@dataclass
class SimResult:
    request_rows: list[tuple]
    engines: list[LLMEngine]
    config: SimConfig  # as asked (num_gpu_blocks, max_model_len may be None)
    scheduler_config: SimConfig  # resolved: what the engines ran with
    cost_model_name: str
    wall_s: float
    meta: dict = field(default_factory=dict)
    num_fast_forward_steps: int = 0  # steps advanced in quiet windows; not in describe(): outputs never differ
    # When a watch stopped the run (simulate(watch=...)): then request_rows also holds a row for each request in
    # flight (no finish), and none for requests that had not arrived.
    stopped_s: float | None = None

    def requests_table(self):
        from engine.core.records import requests_to_arrow

        return requests_to_arrow(self.request_rows)

    def steps_table(self):
        import pyarrow as pa

        return pa.concat_tables([e.step_log.to_arrow() for e in self.engines])

    def describe(self) -> dict:
        """The options and derived figures that produced this run, for summary.json."""
        config = asdict(self.config)
        del config["top_k"], config["top_p"]  # recorded as engine.replay records them: only when on
        return {
            **config,
            **self.config.describe_sampling(),
            "num_gpu_blocks": self.scheduler_config.num_gpu_blocks,
            "max_model_len": self.scheduler_config.max_model_len,
            "cost_model": self.cost_model_name,
            "simulator_wall_s": round(self.wall_s, 3),
            **self.meta,
        }


class StepEnds:
    """A finished request's token times kept as a run of its replica's step end times (``ends_s[first:first +
    count]``): a request that took part in every step from its first token to its last got its tokens at exactly
    those ends, which the replica keeps once for all its requests; 8 bytes a step instead of 8 bytes a token of
    every request. Read as a float64 array (``np.asarray``), as ``requests_to_arrow`` reads token times."""

    __slots__ = ("ends_s", "first", "count")

    def __init__(self, ends_s: array, first: int, count: int) -> None:
        self.ends_s = ends_s
        self.first = first
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        # A view for as long as it is read: the replica's array must not grow meanwhile (it does not once the
        # simulation is over).
        return np.frombuffer(self.ends_s, dtype=np.float64)[self.first:self.first + self.count]


# Fewer token times than this are kept as they are: a StepEnds is about as large as an array of a few floats.
_MIN_STEP_ENDS_TOKENS = 8


def compact_token_times(row: tuple, ends_s: array) -> tuple:
    """``row`` (from ``request_row``) with its token times as a ``StepEnds`` of the replica's step ends ``ends_s``
    where they are exactly a run of them (compared byte for byte), else as it is."""
    times = row[-1]
    count = len(times)
    if count < _MIN_STEP_ENDS_TOKENS:
        return row
    first = bisect_left(ends_s, times[0])
    if ends_s[first:first + count].tobytes() != times.tobytes():
        return row
    return (*row[:-1], StepEnds(ends_s, first, count))


# Room for a replica's step ends not yet written (simulate's step_ends_s): later than every step's end.
_NO_STEP_END = array("d", (math.inf,))
# A replica's step ends grow by their length at least (a copy of it every doubling), up to this many ends at a time
# (512 KiB: larger blocks are mapped memory, which realloc moves without copying).
_STEP_ENDS_GROWTH = 1 << 16


def _grown_step_ends(ends_s: array, length: int) -> None:
    """``ends_s`` grown (room, _NO_STEP_END) to hold ``length`` ends at least, with room ahead."""
    ends_s.extend(_NO_STEP_END * max(length - len(ends_s), min(max(len(ends_s), 64), _STEP_ENDS_GROWTH)))


_COLUMN_INDEX = {c.name: i for i, c in enumerate(REQUEST_COLUMNS)}
_FINISH_THEN_REPLICA = itemgetter(_COLUMN_INDEX["finish_s"], _COLUMN_INDEX["replica"])


def make_cost_model(config: SimConfig, model: ModelShape) -> CostModel:
    path = chosen_profile(config, model)  # the one rule for which profile a run uses (limits and bands read it too)
    if path is None:
        return RooflineCostModel(model, get_gpu(config.gpu), config.tensor_parallel_size)
    if not path.is_file():
        raise ValueError(f"cost model {config.cost_model!r} is neither 'auto', 'roofline' nor an existing profile JSON")
    cost_model = ProfiledCostModel.load(path, model.name, config.gpu, config.tensor_parallel_size,
                                        sampling=config.sampling_mode(model.vocab_size))
    other = other_model_of_that_name(model)
    if other is not None and measured_on_shipped_config(cost_model.measured_model):
        # A profile of the shipped config, given by path for a --model folder of that name holding another model:
        # load compares names only, and the run was priced by the shipped model's step times without a word ('auto'
        # leaves such a folder to the roofline, with a warning).
        shipped = Path(cost_model.measured_model).name
        raise ValueError(f"cost model {path} was measured for the shipped model {shipped}, but --model {config.model} "
                         f"is another model of that name ({other}); profile that model (python -m sim.profile) or use "
                         "--cost-model roofline")
    return cost_model


def measured_on_shipped_config(measured_model: str | None) -> bool:
    """Whether a profile's 'model' (as sim.profile writes it) is a shipped config: its bare name, or the config's
    folder in a checkout (engine/configs/NAME, as the shipped profiles were measured), not a model folder of its own."""
    if measured_model is None:
        return False
    return "/" not in measured_model or Path(measured_model).parts[-3:-1] == ("engine", "configs")


def cost_model_description(cost_model: CostModel, host_slowdown: str) -> str:
    """``cost_model``'s name, saying the host speed its steps were priced at where ``host_slowdown``
    (--host-slowdown) gave one: a calibrated profile's name quotes its serving average ("host x0.83"), which a
    replay at --host-slowdown 2 did not use, and the summary said so all the same."""
    speed = parse_host_slowdown(host_slowdown)  # the run's own spec, checked by SimConfig
    if speed is None:  # calibrated: the model's own average
        return cost_model.name
    given = f"host slowdown {speed.name} (--host-slowdown"
    serving = cost_model.fit.get("serving") if isinstance(cost_model, ProfiledCostModel) else None
    calibrated = f", serving-calibrated ({calibration_label(serving)})" if serving else None
    if calibrated and cost_model.name.endswith(calibrated):
        return f"{cost_model.name.removesuffix(calibrated)}, {given}, not the serving-calibrated " \
               f"{calibration_label(serving)})"
    return f"{cost_model.name}, {given})"


def for_replica(cost_model: CostModel, index: int) -> CostModel:
    """Replica ``index``'s view of ``cost_model``: its own, where the model draws per-step noise (sim.bands)."""
    view = getattr(cost_model, "for_replica", None)
    return cost_model if view is None else view(index)


# Objects the collector lets a simulation allocate (net of those freed) between its collections of the youngest
# generation (Python's default: 700). A simulation's live objects only grow (a row per finished request, its
# sequences and their arrays), so every collection found little to free, and each tenth of the oldest generation's
# chances passed over all of them: benchmarks/sim_million.py's collections (timed by gc.callbacks) took 0.88 CPU s of
# 18.3 at 100,000 requests, 2.5 s of 41 at 200,000 (1.7 s of it in 6 full collections); with this 0.13 s and 1.5 s
# (no full collection).
_GC_YOUNG_OBJECTS = 50_000


def _collecting_less(function):
    """``function`` run with the youngest generation's threshold at least _GC_YOUNG_OBJECTS, restored after it (a
    threshold of 0, collection off, is left as it is). Nothing a simulation writes depends on when the collector
    runs."""

    @functools.wraps(function)
    def collecting_less(*args, **kwargs):
        young, *older = gc.get_threshold()
        if young:
            gc.set_threshold(max(young, _GC_YOUNG_OBJECTS), *older)
        try:
            return function(*args, **kwargs)
        finally:
            gc.set_threshold(young, *older)

    return collecting_less


@_collecting_less
def simulate(
    trace,
    config: SimConfig,
    *,
    cost_model: CostModel | None = None,
    on_request_done: Callable[[int], None] | None = None,
    fast_forward: bool = True,
    watch: RunWatch | None = None,
    lazy_tokens: bool = True,
    max_steps: int | None = None,
) -> SimResult:
    """Run ``trace`` (a ``traces.schema.Trace``) to completion; every request finishes or is rejected.

    ``fast_forward`` advances runs of quiet decode steps in one go (``engine.core.quiet_window``), and with
    ``lazy_tokens`` a large batch's plain decode rows owe their tokens instead of getting them appended each step
    (engine.core.steady_decodes): the outputs are identical either way, only faster with them. ``watch`` may stop the
    run early (``RunWatch``; ``SimResult.stopped_s`` says when); a watch that never stops it changes nothing of its
    outputs. ``max_steps``: StepLimitError once the replicas' step logs together pass it (checked every
    _STEP_CHECK_EVERY arrivals and finishes).
    """
    started = time.perf_counter()
    return_freed_memory_promptly()
    model = config.model_shape
    sched_config = config.resolved_for(model)
    cost_model = cost_model or make_cost_model(config, model)
    env = SimEnvironment()
    clock = SimClock(env)
    engines = [
        LLMEngine(
            sched_config,
            # one host-speed process per replica: each replica is its own machine
            CostModelRunner(for_replica(cost_model, i),
                            host_speed=parse_host_slowdown(config.host_slowdown, config.seed + i), clock=clock,
                            distinct_first_tokens=not samples_argmax(config.temperature, config.top_k)),
            clock=clock,
            eos_token_ids=model.eos_token_ids,
            replica=i,
            lazy_tokens=lazy_tokens,  # the cost model reads no sequence's tokens
        )
        for i in range(config.num_replicas)
    ]
    wakeups: list[simpy.Event | None] = [None] * len(engines)
    rows: list[tuple] = []
    rejected_rows: list[tuple] = []  # after the served ones, at the end (see the sort there)
    router = make_router(config.router)

    # Every step's end time, per replica (a window's as planned, taken back where it is cut): a finished request's
    # token times are kept as a run of them where they are one (StepEnds), not as an array of their own. Each array
    # holds num_step_ends[index] ends, then room for more (inf, so that it stays sorted for compact_token_times'
    # bisection), grown ahead (_grown_step_ends) and written in place: grown by its windows' ends as it ran,
    # array('d') reallocated a replica's whole array once every few windows (it keeps 1/16 of its length ahead), and
    # a cut shrank it (del) for the next window to grow it again (60 MB of realloc's copies at 5,000 sessions on 64
    # replicas: ~0.5 % of their instructions).
    step_ends_s = [array("d") for _ in engines]
    num_step_ends = [0] * len(engines)

    checks_left = [_STEP_CHECK_EVERY]

    def check_steps(count: int, final: bool = False) -> None:
        """StepLimitError once the step logs pass ``max_steps`` (every step has an end time in ``step_ends_s``), and
        at the end (``final``, the logs as they are): a run whose last check came before its last steps passed it
        unchecked."""
        checks_left[0] -= count
        if final:
            num_steps = sum(len(engine.step_log) for engine in engines)
        elif checks_left[0] > 0:
            return
        else:
            checks_left[0] = _STEP_CHECK_EVERY
            num_steps = sum(num_step_ends)
            now_s = env.now
            for run in runs:
                if run is not None:
                    # A window's steps are in step_ends_s from its start: those not ended yet (one ending now: the
                    # arrival checking comes first) are not in the step loop's logs. Counted, a window that requests
                    # wait through (it spans their arrivals) stopped a run the step loop finished.
                    num_steps -= len(run.ends) - bisect_left(run.ends, now_s)
        if num_steps > max_steps:
            raise StepLimitError(
                f"the simulation reached {num_steps:,} engine steps across its replicas, and writing its outputs "
                f"(a row per step, the summary and the report) needs about {BYTES_PER_STEP_WRITTEN} bytes a step: "
                f"more than the {max_steps:,} steps this host's available memory holds; replay fewer requests "
                "(--limit) or a shorter span of the trace")

    def done(seqs: list[Sequence]) -> None:
        if max_steps is not None:
            check_steps(len(seqs))
        for seq in seqs:
            if seq.error is not None:  # the cost model failed: a bug to surface, not a request to record
                raise RuntimeError(f"simulating request {seq.request_id} failed: {seq.error}")
            if seq.finish_reason is FinishReason.REJECTED:
                rejected_rows.append(request_row(seq))
            else:
                rows.append(compact_token_times(request_row(seq), step_ends_s[seq.replica]))
        if on_request_done is not None and seqs:
            on_request_done(len(seqs))

    requests = TraceRequests(trace, model.vocab_size, config.seed, config.temperature, config.top_k, config.top_p)
    check_host_memory(trace, sched_config, host_memory_available())
    next_arrival_s = [math.inf]  # the arrivals process keeps it current: quiet windows end before it
    fast_forwarded = [0]  # steps advanced in quiet windows (not an output: outputs are the same without)
    # A router that reads no engine state is asked up front, in arrival order, as the arrivals would ask it (a
    # request every replica turns away is never routed): then a replica's windows end only before the next
    # request routed to it, not before every arrival.
    routed_to: list[int] | None = None
    if getattr(router, "reads_engine_state", True) is False:
        scheduler = engines[0].scheduler
        routed_to = [-1 if scheduler.rejection_reason_for(n) is not None else router.route(None, engines)
                     for n in requests.prompt_tokens]
        replica_arrivals_s: list[list[float]] = [[] for _ in engines]
        for index, arrival_s in zip(routed_to, requests.arrivals_s):
            if index >= 0:
                replica_arrivals_s[index].append(arrival_s)
        for times in replica_arrivals_s:
            times.append(math.inf)
        next_routed = [0] * len(engines)  # the first arrival of each replica's list not yet queued

    def arrives_at(index: int, t_s: float) -> bool:
        """Whether a request routed to replica ``index`` arrives at exactly ``t_s`` (from its next one on)."""
        times = replica_arrivals_s[index]
        at = bisect_left(times, t_s, next_routed[index])
        return times[at] == t_s  # the list ends with inf

    def horizon_s(index: int) -> float:
        """When replica ``index``'s quiet windows must end: the next arrival that may reach it."""
        if routed_to is None:
            return next_arrival_s[0]
        return replica_arrivals_s[index][next_routed[index]]

    # A router that reads the replicas (their queues, their prefix caches) sees a replica in a quiet window as the
    # step loop would have left it at each arrival: the window is applied lazily (QuietRun.advance) up to the
    # arrival, and cut after its step in progress when the request is routed to it. Its windows then end only at
    # its own next request, not at every arrival anywhere.
    lazy = fast_forward and routed_to is None
    # Every request reaches the replicas through the router (a router that reads engine state is asked here, at each
    # arrival): one that can follow what it sent where (the prefix router: which replica was given each first block)
    # is told each admission.
    admitted = getattr(router, "admitted", None) if routed_to is None else None
    if admitted is not None:
        router.track_admissions(engines)
    # A router that follows the replicas' loads (track_loads) is told of each replica whose queues may have changed:
    # its own process at every resume (the top of its loop: a step, a window's finish, a wakeup), and an arrival that
    # adds to it or advances its window. (Without one, the set only collects replica indices.)
    track_loads = getattr(router, "track_loads", None) if routed_to is None else None
    stale_loads: set[int] = set() if track_loads is None else track_loads(engines)
    runs: list[QuietRun | None] = [None] * len(engines)  # each replica's window in progress (lazy or not)

    def lazy_window(engine: LLMEngine, now_s: float, max_steps: int, min_steps: int = 2,
                    refusal: list | None = None):
        """A window from ``now_s`` for a replica whose window ends at its own next request (or, one in which no
        waiting request can be admitted, at its first finish): at most ``max_steps``. An arrival at the very end of
        one of its steps needs no care: it comes before the step that ends at its instant (Arrival), as advance and cut
        take it (the step's finishes not applied yet, the step kept). Each window was checked against every arrival it
        spans and planned again to end before such a one, from before arrivals took their urgent priority: ~4 % of a
        64-replica run's instructions, the same outputs (tested with arrivals on step ends)."""
        if not next_arrival_s[0] > now_s:  # an arrival at this instant not yet taken in: it may change this step
            return None
        runner = engine.runner
        return plan_quiet_window(engine, runner.token_id, runner.quiet_step_ends_s, now_s, math.inf,
                                 max_steps=max_steps, min_steps=min_steps, refusal=refusal,
                                 segment_ends=runner.quiet_segment_ends_s)

    # The event each replica in a lazy window waits on (its end), for a cut to move it to its new end.
    window_waits: list[LazyWindowEnd | None] = [None] * len(engines)
    # The lazy windows' ends not in simpy's queue yet, as (end_s, event id, replica): ends a request may still cut
    # (after the next arrival), queued by the arrivals process once the next arrival is not before them (then no
    # request cuts the window: a cut keeps the step in progress at an arrival, and with it the window's last step; so
    # a cut window's end is queued at the cut). An entry whose replica's wait is no longer that event (cut since) is
    # passed over.
    unqueued_ends: list[tuple[float, int, int]] = []
    # A lazy window in which every running sequence finishes leaves its replica idle until a request is routed to it:
    # its end is not queued at all, and the replica waits through the window and the idleness after it on the one
    # event (its wakeup), which that request queues where the replica resumes (the window's end, or its cut end, or
    # the request's arrival after the window: the same time and place in simpy's order as the end, or the wakeup
    # that it saves, had), the window finished then (its finishes were applied by the arrivals that came after them,
    # as every router that reads the replicas needs). A window never woken is finished after the run. Before, each
    # such window cost a second event and resume (~8,000 instructions each), most windows of a fleet of 64 at 1-2
    # sequences a replica. Not with a watch or a step limit, which read the replicas' progress between arrivals.
    wake_after_windows = lazy and watch is None and max_steps is None
    # There, too, a replica woken from now (idle, or its window over: the request arrived after its end) is resumed by
    # the arrivals process itself, once every request arriving at this instant is in (as simpy resumed it: after the
    # urgent arrivals), rather than by an event queued now: an event and a resume less for most requests. simpy
    # resumed it after any other event queued for this instant before it: another replica's, and the replicas' runs
    # are independent between arrivals (the router reads them at arrivals only; the rows are sorted at the end).
    woken: list[LazyWindowEnd] = []

    def wake() -> None:
        """Resume the replicas in ``woken``, in the order they were woken (as simpy processes an event)."""
        for wakeup in woken:
            callbacks, wakeup.callbacks = wakeup.callbacks, None
            for callback in callbacks:
                callback(wakeup)
        woken.clear()
    # The lazy windows by their next event: (next_event_s, replica) for each, pushed when it changes, so that an
    # arrival advances the windows with an event before it without reading all of them (a fleet of 64 read all 64
    # windows at every arrival, ~2 due: 0.35 % of the 64-replica benchmark's instructions at 5,000 requests, but ~6 %
    # of its sampled time at 40,000, each window's next event a read from memory). An entry whose replica's window
    # has moved on (another next event, or none) is passed over: a replica's pushes come at ever later times (an
    # advance moves its next event past the arrival, a cut only drops events, and a replica's next window starts
    # where its last ended), so the entry that still matches is its one current entry. Advanced in time order instead
    # of replica order, each replica's finishes come in its own order still (the rows are sorted at the end).
    due_windows: list[tuple[float, int]] = []

    step_end = functools.partial(StepEnd, env)  # (engine.step_body's wait)

    def replica(env: simpy.Environment, index: int):
        engine = engines[index]
        runner = engine.runner
        # Planning a window that cannot happen costs a pass over the batch; two cheap signs skip it (skipping
        # only ever trades a window for the same steps taken one by one): a window that stopped short of the
        # horizon stopped before a finish or an allocation that might fail, which the next step is (unless it ran to
        # its step cap, lazy_steps); and a horizon closer than _MIN_WINDOW_STEPS of the last decode step's length
        # leaves no room for a window worth it.
        try_window = fast_forward
        last_step_s = 0.0
        # The last decode step's length, kept over prefill steps: a window (cross_horizon) needs its first step to
        # end before the horizon, and a horizon closer than one such step refused ~25 % of the plans near capacity
        # (one request arriving within a step of the one just admitted), each after a pass over the batch.
        last_decode_s = 0.0
        lazy_steps = _LAZY_MIN_STEPS
        # With requests waiting, a window forms only where none of them can be admitted, and ends with its first
        # finish (plan_quiet_window): refused because a finish or a block allocation that may fail comes within
        # _MIN_WINDOW_STEPS, none forms until a step finishes or preempts a sequence (nothing else changes the
        # batch then), and none is planned.
        until_finish = False
        # Nor is one planned for a batch smaller than that: with the default limits (256 sequences, 8,192 tokens) no
        # batch of at most _MAX_QUEUED_WINDOW_SEQS is, and the planner was asked (and refused) after every arrival,
        # nearly half of its calls on the Azure trace.
        fewest_queued_seqs = admits_none_from(engine.scheduler.config)
        has_unfinished = engine.scheduler.has_unfinished  # (a simulation never resets its engines' schedulers)
        while True:
            stale_loads.add(index)  # (what this resume changed, before it yields again: the router reads it after)
            if not has_unfinished():
                wakeups[index] = LazyWindowEnd(env) if wake_after_windows else env.event()
                yield wakeups[index]
                continue
            planned = None
            queued = bool(engine.scheduler.waiting)
            if queued:
                if try_window and not until_finish and (
                        fewest_queued_seqs <= len(engine.scheduler.running) <= _MAX_QUEUED_WINDOW_SEQS):
                    refusal: list[str] = []
                    if lazy:
                        planned = lazy_window(engine, env.now, 1 << 16, _MIN_WINDOW_STEPS, refusal)
                    else:  # arrivals only join the queue: no horizon but the window's first finish
                        planned = plan_quiet_window(engine, runner.token_id, runner.quiet_step_ends_s, env.now,
                                                    math.inf, min_steps=_MIN_WINDOW_STEPS, refusal=refusal,
                                                    segment_ends=runner.quiet_segment_ends_s)
                    until_finish = bool(refusal)
            elif lazy:
                if try_window:
                    planned = lazy_window(engine, env.now, lazy_steps)
            else:
                horizon = horizon_s(index) if try_window else 0.0
                room_s = horizon - env.now
                if try_window and room_s > _MIN_WINDOW_STEPS * last_step_s and room_s > last_decode_s:
                    # The window takes the step the next request arrives in too (the step loop would run it
                    # before that request's prefill), unless another request arrives exactly at its end.
                    planned = plan_quiet_window(engine, runner.token_id, runner.quiet_step_ends_s, env.now, horizon,
                                                cross_horizon=True, segment_ends=runner.quiet_segment_ends_s)
                    if planned is not None and planned[0].end_s >= horizon and arrives_at(index, planned[0].end_s):
                        planned = plan_quiet_window(engine, runner.token_id, runner.quiet_step_ends_s, env.now,
                                                    horizon, segment_ends=runner.quiet_segment_ends_s)
            if planned is not None:
                window, starts, ends = planned
                run = QuietRun(engine, runner.token_id, window, starts, ends)
                count = num_step_ends[index]
                num_step_ends[index] = after = count + len(ends)
                if after > len(step_ends_s[index]):
                    _grown_step_ends(step_ends_s[index], after)
                step_ends_s[index][count:after] = ends
                if lazy:
                    runs[index] = run
                    if run.next_event_s < math.inf:
                        heappush(due_windows, (run.next_event_s, index))
                    planned_steps = window.num_steps
                    wait = window_waits[index] = LazyWindowEnd(env)
                    wait.reserve(window.end_s)
                    if wake_after_windows and not window.admits_none and window.due is None and (
                            max(window.lefts) <= window.num_steps):  # (see wake_after_windows)
                        wakeups[index] = wait
                    elif window.end_s <= next_arrival_s[0]:  # no request can cut it
                        wait.schedule()
                    else:
                        heappush(unqueued_ends, (window.end_s, wait.eid, index))
                    yield wait  # to the window's end, or to its cut end where a request routed here cut it
                    window_waits[index] = None
                    # Ran to its step cap (planned to it, not cut): it stopped before no finish or allocation, so the
                    # next window is planned at once. The step loop ran the step after it first, for 11 % of the
                    # 64-replica benchmark's requests at 5,000 (15 % at 100,000): a step_body each, for nothing.
                    capped = not queued and window.num_steps == lazy_steps
                    if window.num_steps < planned_steps:  # cut
                        lazy_steps = min(max(2 * window.num_steps, _LAZY_MIN_STEPS), _LAZY_MAX_STEPS)
                    elif not window.admits_none:  # (one that does ends at its first finish: says nothing of these)
                        lazy_steps = min(2 * lazy_steps, _LAZY_MAX_STEPS)
                    runs[index] = None
                    done(run.finish())
                else:
                    # Finished at its end (a request arriving during it waits, counted in its last row), and held in
                    # runs until then: a watch that stops the run mid-window takes only the steps before the stop
                    # (QuietRun.stop). Finished at its start, a stopped run had the window's later finishes too.
                    runs[index] = run
                    yield WindowEnd(env, window.end_s)
                    runs[index] = None
                    done(run.finish())
                    capped = False
                fast_forwarded[0] += window.num_steps
                try_window = window.stopped_by_horizon or capped
                last_step_s = last_decode_s = run.ends[-1] - run.starts[-1]
                continue
            started_s = env.now
            num_steps = engine.step_log.num_rows
            batch, finished = yield from engine.step_body(step_end)
            if engine.step_log.num_rows > num_steps:  # a step ran (an empty or failed one records none)
                count = num_step_ends[index]
                num_step_ends[index] = count + 1
                if count == len(step_ends_s[index]):
                    _grown_step_ends(step_ends_s[index], count + 1)
                step_ends_s[index][count] = env.now
            if batch.num_prefill_tokens:
                last_step_s = 0.0  # a prefill's says nothing
            else:
                last_step_s = last_decode_s = env.now - started_s
            try_window = fast_forward
            if finished or batch.preempted:
                until_finish = False
            if finished:  # (done([]) would do nothing: its step count is of finishes)
                done(finished)

    def arrivals(env: simpy.Environment):
        for i, arrival_s in enumerate(requests.arrivals_s):
            if max_steps is not None:
                check_steps(1)
            next_arrival_s[0] = arrival_s
            while unqueued_ends and unqueued_ends[0][0] <= arrival_s:  # (see unqueued_ends)
                _, eid, index = heappop(unqueued_ends)
                wait = window_waits[index]
                if wait is not None and wait.eid == eid:
                    wait.schedule()
            if arrival_s > env.now:
                if woken:
                    wake()
                yield Arrival(env, arrival_s)
            # Every replica has the same limits: a request none can serve is turned away before routing,
            # and before its prompt is built.
            seq = requests.reject_unservable(engines[0], i)
            if seq is not None:
                if watch is not None:
                    watch.arrived(i, seq)
                done([seq])
                continue
            prompt = requests.prompt_array(i)
            block_hashes = None
            if routed_to is None:
                # The router reads every replica: each as the step loop would have it now.
                while due_windows and due_windows[0][0] < arrival_s:
                    event_s, index = heappop(due_windows)
                    run = runs[index]
                    if run is not None and run.next_event_s == event_s:  # (else passed over: see due_windows)
                        stale_loads.add(index)
                        finished = run.advance(arrival_s)
                        if finished:  # (most events a window meets are blocks taken or filled, not finishes)
                            done(finished)
                        if run.next_event_s < math.inf:
                            heappush(due_windows, (run.next_event_s, index))
                index = router.route(prompt, engines)
                block_hashes = getattr(router, "last_block_hashes", None)  # (the prefix router's: not made again)
                run = runs[index]
                if run is not None and not run.window.admits_none:  # (in one that does, the request only waits)
                    planned_steps = run.window.num_steps
                    # (A cut drops events from the end: the window's next one stays, its entry with it, or it has
                    # none, its entry passed over.)
                    if run.cut(arrival_s):
                        # (the window's ends are the last: those of its dropped steps are room again)
                        count = num_step_ends[index]
                        num_step_ends[index] = kept = count + run.window.num_steps - planned_steps
                        step_ends_s[index][kept:count] = _NO_STEP_END * (count - kept)
                        # (a window whose end is queued is never cut, nor one cut again: see unqueued_ends)
                        wait = window_waits[index]
                        wait.reserve(run.window.end_s)
                        wait.schedule()
                        if wakeups[index] is wait:
                            wakeups[index] = None
            else:
                index = routed_to[i]
                next_routed[index] += 1
            seq = requests.add_to(engines[index], i, prompt, block_hashes)
            stale_loads.add(index)
            if admitted is not None:
                admitted(index, seq)
            run = runs[index]
            if run is not None:  # a window in progress: the rows of its steps that end from now on count it
                run.waited(env.now)
            if watch is not None:
                watch.arrived(i, seq)
            if seq.is_finished:  # rejected
                done([seq])
            wakeup = wakeups[index]
            if wakeup is not None:
                wakeups[index] = None
                if not wake_after_windows:
                    wakeup.succeed()
                elif wakeup is window_waits[index] and arrival_s <= wakeup.at_s:
                    wakeup.schedule()  # at the end of its window, in which every sequence finishes
                else:  # idle, or its window over: resumed from now (see woken)
                    woken.append(wakeup)

        next_arrival_s[0] = math.inf
        for _, eid, index in unqueued_ends:  # (in any order: each keeps its place by time, then event id)
            wait = window_waits[index]
            if wait is not None and wait.eid == eid:
                wait.schedule()
        unqueued_ends.clear()
        if woken:
            wake()

    def watcher(env: simpy.Environment):
        """Asks the watch at the times it names; True when it stopped the run. Its own events only add to simpy's
        queue (each event keeps its place by time, then by when it was scheduled), so the run is the same."""
        while True:
            check_s = watch.next_check_s()
            if check_s == math.inf:
                return False
            if check_s > env.now:
                yield env.timeout(check_s - env.now)
            if watch.check(env.now):
                return True

    for i in range(len(engines)):
        ReplicaProcess(env, replica(env, i))
    env.process(arrivals(env))
    stopped_s = None
    if watch is not None:
        watching = env.process(watcher(env))
        env.run(until=watching)
        if watching.value:
            stopped_s = env.now
    if stopped_s is None:
        env.run()
        for run in runs:  # windows no request woke their replica after (see wake_after_windows)
            if run is not None:
                done(run.finish())
                fast_forwarded[0] += run.window.num_steps
    else:
        for run in runs:  # windows in progress: their steps before now, as the step loop would have them
            if run is not None:
                done(run.stop(stopped_s))
    for ends_s, count in zip(step_ends_s, num_step_ends):
        del ends_s[count:]  # (the room left: StepEnds views each array whole)
    if max_steps is not None:
        check_steps(0, final=True)
    # By finish time, then replica: the order the step loop records them in, except for finishes at the same
    # instant on two replicas (simpy's order, which differs once a window records its finishes at its end, or at
    # an arrival that reads it). A request turned away at the very instant a step ends comes after that step's
    # finishes (the sort keeps the order of equal keys): a window records those at another moment than the step loop
    # (after the arrival, which comes first), and the rows' order differed.
    rows.extend(rejected_rows)
    rows.sort(key=_FINISH_THEN_REPLICA)
    if stopped_s is not None:  # the requests in flight, unfinished, after the finished ones
        for engine in engines:
            engine.scheduler.settle_tokens()
        rows.extend(request_row(seq) for engine in engines
                    for seq in (*engine.scheduler.running, *engine.scheduler.waiting))
    result = SimResult(rows, engines, config, sched_config, cost_model_description(cost_model, config.host_slowdown),
                       time.perf_counter() - started)
    result.num_fast_forward_steps = fast_forwarded[0]
    result.stopped_s = stopped_s
    features = getattr(cost_model, "engine_features", None)  # a profile's: what the engine it measured did
    if features:
        result.meta["profile_engine_features"] = features
    return result
