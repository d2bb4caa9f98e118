"""The load a capacity search offers at one QPS: the trace's sessions, resampled into a long steady stream.

Rescaling a short trace to a high QPS makes it arrive in seconds, so its latency percentiles are
taken over a transient that starts empty and ends before any queue has built up; and it compresses
the think time between a session's turns with the arrivals, so follow-up turns arrive before the
previous answer could have been read. Here, instead:

- The trace is cut into sessions (rows sharing a `session_id`; every row is its own session when
  there is none). Each keeps its turns, lengths and arrival offsets from its first turn.
- Sessions start as a renewal process whose gaps are drawn (with replacement) from the trace's own
  gaps between session starts, scaled so that requests arrive at `qps` on average; each start
  replays a session drawn (with replacement) from the trace. The request mix is therefore the
  trace's, and a session's think times stay as recorded (`think_times="scale"` compresses them with
  the start rate, as plain rescaling did).
- Every drawn session gets fresh request ids and fresh prefix-block ids, so two copies of one
  session do not share a cache prefix; blocks that several sessions of the trace share (a system
  prompt) stay shared, as they were. A trace with prompt token ids and no hash ids gets chained
  block ids derived from its tokens, so the same rules apply.
- Sessions start from `-longest session span` so the stream is already in steady state at time 0;
  turns before 0 are dropped. The stream lasts `duration_s`; requests arriving in its first
  `warmup_s` are served but not measured (the replicas start empty).

All randomness comes from one seed: different seeds give independent extensions of the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl
import pyarrow as pa

from analysis.capacity.stability import DEFAULT_STABILITY_TOLERANCE
from traces.schema import Trace
from traces.validation import MAX_ARRIVAL_S

THINK_TIME_MODES = ("keep", "scale")
# Requests in one simulated stream: ten times the fleet benchmark's largest single run per replica, and what
# fits in memory with room to spare (each costs its token times); past it a stream took hours or overflowed.
MAX_STREAM_REQUESTS = 10_000_000


class StreamTooLong(ValueError):
    """A stream past MAX_STREAM_REQUESTS, met mid-search (the bracket grew there): the CLI ends with its message."""


class EmptyStream(ValueError):
    """No request of the stream arrives within its duration (a low QPS with a small --min-requests): there is
    nothing to simulate, and a trace holds at least one request."""
# Block size for hash ids derived from prompt token ids (the simulator's default KV block size).
DERIVED_HASH_BLOCK_SIZE = 16
# --max-requests' default: the most requests one stream holds (its T-versus-2T check twice as many) before it is
# shortened below --min-duration-s. A trace of tiny requests (prompts of ~10 tokens, outputs of ~4) meets a 1 s TTFT
# up to thousands of req/s, so its 240 s streams held 1-4 million requests, a minute or more each, and its sweep ran
# for most of an hour. Ten times the default stream at the capacity of traces/sharegpt.parquet (10,175 requests at
# 41.86 req/s; the largest of its default sweep is the 2T check's 20,140), and above the streams of the other sweeps
# measured (2 replicas at ~75 req/s: ~18,000, its check ~36,000; validation's prefill-heavy trace at 117 req/s:
# ~28,000, its check ~56,000): below ~417 req/s (at 240 s) it never binds.
DEFAULT_MAX_REQUESTS = 100_000
# The fewest --max-requests may be: a p90 and a queue trend over fewer measured requests are noise (the same 100 as
# analysis.capacity.point.PROBE_MIN_REQUESTS, which imports this module).
MIN_MAX_REQUESTS = 100


@dataclass(frozen=True)
class Window:
    """The measured part of a replay: requests arriving in [start_s, end_s)."""

    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class SessionLibrary:
    """A trace as sessions: what `steady_trace` resamples. Build it once per trace with `from_trace`."""

    source: str
    hash_block_size: int | None
    trace_qps: float
    requests_per_session: float
    start_gaps: np.ndarray  # gaps between session starts in the trace, divided by their mean
    session_rows: list[np.ndarray]  # per session: its row indices, in arrival order
    offsets_s: np.ndarray  # per row: arrival - its session's first arrival
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    # Every row's hash ids, row after row, and where each row's start (one entry more: the end), as
    # ``Trace._hash_id_offsets`` holds a trace's; ids private to one session are < num_hash_ids. None: the trace has
    # none.
    hash_id_offsets: tuple[np.ndarray, np.ndarray] | None
    shared_hash_ids: np.ndarray | None  # ids used by more than one session: kept as they are
    num_hash_ids: int

    @property
    def num_sessions(self) -> int:
        return len(self.session_rows)

    @property
    def hash_ids(self) -> list[np.ndarray] | None:
        """Per row, its hash ids (views of ``hash_id_offsets``)."""
        if self.hash_id_offsets is None:
            return None
        flat, starts = self.hash_id_offsets
        return [flat[starts[i]:starts[i + 1]] for i in range(len(starts) - 1)]

    @cached_property
    def _flat_session_rows(self) -> tuple[np.ndarray, np.ndarray]:
        return _flattened(self.session_rows)

    def session_copies(self, sessions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``sessions`` (indices of ``session_rows``, one per copy started), copy after copy, and each
        row's copy (its session's position in ``sessions``)."""
        rows, offsets = _ragged_take(*self._flat_session_rows, sessions)
        return rows, np.repeat(np.arange(len(sessions)), np.diff(offsets))

    def stream_hash_ids(self, rows: np.ndarray, instances: np.ndarray) -> pl.Series:
        """The hash ids of ``rows`` as session copies ``instances`` send them, a list column: ids private to one
        session are made fresh per copy (``+ (copy + 1) * num_hash_ids``), shared ones kept. Built from flat arrays
        (one list per request, made row by row, was ~4 % of a capacity sweep)."""
        return _id_lists(*self.stream_hash_id_arrays(rows, instances))

    def stream_hash_id_arrays(self, rows: np.ndarray, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``stream_hash_ids`` flattened: every id, list after list (int64), and where each list starts (one entry
        more: the end), as ``Trace._hash_id_offsets`` holds a trace's."""
        assert self.hash_id_offsets is not None
        ids, offsets = _ragged_take(*self.hash_id_offsets, rows)
        # Each id's shift, 0 for the shared ones (none in most traces: then not looked up): fewer passes over the
        # stream's ids than choosing between two shifted copies of them (~0.8M ids at 42 req/s on sharegpt).
        shifts = np.repeat((instances.astype(np.int64) + 1) * self.num_hash_ids, np.diff(offsets))
        if self.shared_hash_ids.any():
            shifts[self.shared_hash_ids[ids]] = 0
        ids += shifts
        return ids, offsets

    @cached_property
    def longest_session_s(self) -> float:
        """The longest span of a session's turns (s): read for every stream and each step of max_stream_qps's search."""
        return float(max(self.offsets_s[rows[-1]] for rows in self.session_rows))

    @classmethod
    def from_trace(cls, trace: Trace) -> SessionLibrary:
        frame = trace.requests
        if len(frame) < 2:
            raise ValueError(f"{trace.source}: a trace of {len(frame)} request(s) has no rate to extend")
        arrivals = frame["arrival_s"].to_numpy().astype(np.float64)
        span_s = float(arrivals[-1] - arrivals[0])
        if span_s <= 0:
            raise ValueError(f"{trace.source}: every request arrives at once, so it has no rate to extend")
        if "session_id" in frame.columns:
            # A null session id is a request of its own: give each a key no real session can have.
            keys = frame.select(
                pl.when(pl.col("session_id").is_null()).then(pl.lit("row:") + pl.int_range(pl.len()).cast(pl.String))
                .otherwise(pl.lit("s:") + pl.col("session_id").cast(pl.String)).alias("key")
            )["key"]
            codes = keys.cast(pl.Categorical).to_physical().to_numpy()
            session_of_row = np.unique(codes, return_inverse=True)[1]
        else:
            session_of_row = np.arange(len(frame))
        order = np.argsort(session_of_row, kind="stable")
        bounds = np.flatnonzero(np.diff(session_of_row[order])) + 1
        session_rows = np.split(order, bounds)  # rows are in arrival order, so each session's are too
        session_rows.sort(key=lambda rows: rows[0])
        first_arrival = arrivals[[rows[0] for rows in session_rows]]
        offsets = np.empty(len(frame))
        for rows in session_rows:
            offsets[rows] = arrivals[rows] - arrivals[rows[0]]
        gaps = np.diff(np.sort(first_arrival))
        if len(gaps) == 0 or gaps.mean() <= 0:  # one session, or all starting together: even starts
            gaps = np.ones(1)
        hash_id_offsets, shared, num_ids, block_size = _session_hash_ids(trace, session_of_row)
        return cls(
            source=trace.source, hash_block_size=block_size, trace_qps=(len(frame) - 1) / span_s,
            requests_per_session=len(frame) / len(session_rows), start_gaps=gaps / gaps.mean(),
            session_rows=session_rows, offsets_s=offsets,
            prompt_tokens=frame["prompt_tokens"].to_numpy(), output_tokens=frame["output_tokens"].to_numpy(),
            hash_id_offsets=hash_id_offsets, shared_hash_ids=shared, num_hash_ids=num_ids,
        )


def _id_lists(ids: np.ndarray, offsets: np.ndarray) -> pl.Series:
    """The hash_ids list column of flat ``ids`` and the ``offsets`` where each row's start."""
    lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids, type=pa.int64()))
    return pl.Series("hash_ids", lists, dtype=pl.List(pl.Int64))


def _ragged_take(flat: np.ndarray, starts: np.ndarray, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lists ``picks`` of a flattened list of lists (``_flattened``'s ``flat`` and ``starts``), flattened in
    turn: their items, list after list, and where each starts (one entry more: the end). A few passes over the items,
    not a list per pick joined: a stream at 42 req/s on traces/sharegpt.parquet takes ~3,500 sessions' rows and
    ~0.8M hash ids this way."""
    first = starts[picks]
    lengths = starts[picks + 1] - first
    offsets = np.zeros(len(picks) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # Item j of the result is flat[starts[its pick] + (j - offsets[its pick])].
    index = np.repeat(first - offsets[:-1], lengths)
    index += np.arange(offsets[-1], dtype=np.int64)
    return flat[index], offsets


def _flattened(per_row: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every row's ids in one int64 array, and where each row's start (one entry more: the end)."""
    lengths = np.fromiter((len(ids) for ids in per_row), dtype=np.int64, count=len(per_row))
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    flat = np.concatenate(per_row) if per_row else np.zeros(0, dtype=np.int64)
    return flat.astype(np.int64, copy=False), starts


def _session_hash_ids(trace: Trace, session_of_row: np.ndarray):
    """The rows' hash ids (flat, and where each row's start), the ids shared between sessions (``session_of_row``: a
    number per row, equal within a session, below the row count), the id count, and the block size. On flat arrays,
    not a list per row and a pass per session: the library of traces/sharegpt.parquet (696 sessions, once per sweep)
    in ~27 ms instead of ~42."""
    frame = trace.requests
    if "hash_ids" in frame.columns:
        flat, starts = trace._hash_id_offsets
        block_size = trace.hash_block_size
    elif "prompt_token_ids" in frame.columns:
        flat, starts = _flattened(_hash_ids_from_tokens(frame["prompt_token_ids"].to_list(), DERIVED_HASH_BLOCK_SIZE))
        block_size = DERIVED_HASH_BLOCK_SIZE
    else:
        return None, None, 0, None
    # Renumber densely so that "fresh ids" can be made by adding a multiple of the count.
    uniques, dense = np.unique(flat, return_inverse=True)
    # An id is shared when it is used by more than one session: count its distinct (id, session) pairs.
    num_rows = len(session_of_row)
    pairs = np.unique(dense * num_rows + np.repeat(session_of_row, np.diff(starts)))
    shared = np.bincount(pairs // num_rows, minlength=len(uniques)) > 1
    return (dense.astype(np.int64, copy=False), starts), shared, len(uniques), block_size


def _hash_ids_from_tokens(token_lists: list[list[int]], block_size: int) -> list[np.ndarray]:
    """Chained block ids: equal ids mean equal tokens in that block and in every block before it."""
    table: dict[tuple[int, bytes], int] = {}
    out = []
    for tokens in token_lists:
        array = np.asarray(tokens, dtype=np.int64)
        parent, ids = -1, []
        for start in range(0, len(array), block_size):
            parent = table.setdefault((parent, array[start:start + block_size].tobytes()), len(table))
            ids.append(parent)
        out.append(np.asarray(ids, dtype=np.int64))
    return out


@dataclass(frozen=True)
class WorkloadParams:
    """How each simulation of a search is made and judged.

    The stream lasts max(min_duration_s, min_requests / qps) seconds, shortened to max_requests / qps where
    max_requests is given and min_duration_s would hold more (`shortened`); the first warmup_fraction of it is
    served but not measured. `stability_tolerance`: see `analysis.capacity.stability`; `early_stop`: stop clearly
    overloaded runs after a probe (see `analysis.capacity.point`). `max_requests` None: no bound (the CLI's default
    is DEFAULT_MAX_REQUESTS).
    """

    min_duration_s: float = 240.0
    min_requests: int = 3000
    warmup_fraction: float = 0.25
    think_times: str = "keep"
    stability_tolerance: float = DEFAULT_STABILITY_TOLERANCE
    early_stop: bool = True
    max_requests: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_duration_s) and self.min_duration_s >= 0):
            raise ValueError(f"--min-duration-s must be a finite number >= 0, got {self.min_duration_s}")
        if not 0 <= self.min_requests <= MAX_STREAM_REQUESTS:
            raise ValueError(f"--min-requests must be from 0 to {MAX_STREAM_REQUESTS:,}, got {self.min_requests}")
        if self.max_requests is not None:
            if not MIN_MAX_REQUESTS <= self.max_requests <= MAX_STREAM_REQUESTS:
                raise ValueError(f"--max-requests must be from {MIN_MAX_REQUESTS} to {MAX_STREAM_REQUESTS:,}, got "
                                 f"{self.max_requests}")
            if self.max_requests < self.min_requests:
                raise ValueError(f"--max-requests {self.max_requests} is below --min-requests {self.min_requests}: "
                                 "a stream cannot hold at most fewer requests than it must hold at least; raise "
                                 "--max-requests or lower --min-requests")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"--warmup-fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.think_times not in THINK_TIME_MODES:
            raise ValueError(f"--think-times must be one of {', '.join(THINK_TIME_MODES)}, got {self.think_times!r}")
        if not 0 < self.stability_tolerance < 1:
            raise ValueError(f"--stability-tolerance must be in (0, 1), got {self.stability_tolerance}")

    def duration_s(self, qps: float, scale: float = 1.0) -> float:
        """The stream's length at `qps`, times `scale` (2 for the T-versus-2T check): max(min_duration_s,
        min_requests / qps), at most max_requests / qps (`shortened`). Where max_requests does not bind, exactly the
        length it had without the option."""
        length_s = max(self.min_duration_s, self.min_requests / qps)
        if self.shortened(qps):  # max_requests >= min_requests: min_duration_s is what exceeds it
            length_s = self.max_requests / qps
        return scale * length_s

    def shortened(self, qps: float) -> bool:
        """Whether max_requests shortens the stream at `qps` below min_duration_s (its requests would be more)."""
        return self.max_requests is not None and self.min_duration_s * qps > self.max_requests

    def shortened_above_qps(self) -> float | None:
        """The QPS above which streams are shortened (None: never)."""
        if self.max_requests is None or self.min_duration_s <= 0:
            return None
        return self.max_requests / self.min_duration_s

    def check_stream_size(self, qps: float, scale: float = 1.0) -> None:
        """ValueError naming the options when the stream at `qps` would hold more than MAX_STREAM_REQUESTS, or last
        longer than a trace may (MAX_ARRIVAL_S)."""
        expected = qps * self.duration_s(qps, scale)
        if not expected <= MAX_STREAM_REQUESTS:
            raise ValueError(f"a stream of {self.duration_s(qps, scale):.6g} s at {qps:.6g} requests/s holds about "
                             f"{expected:.3g} requests, more than the {MAX_STREAM_REQUESTS:,} one simulation takes; "
                             "lower --min-duration-s, --max-requests or the QPS bracket (--qps-max)")
        # --qps-min 1e-300 stretched --min-requests arrivals past the trace bound: a TraceError traceback.
        if not self.duration_s(qps, scale) <= MAX_ARRIVAL_S:
            raise ValueError(f"a stream of {self.duration_s(qps, scale):.6g} s at {qps:.6g} requests/s lasts longer "
                             f"than a trace may ({MAX_ARRIVAL_S:g} s); raise --qps-min (at least "
                             f"{self.min_qps(scale):.3g}) or lower --min-requests or --min-duration-s")

    def min_qps(self, scale: float = 1.0) -> float:
        """The lowest QPS whose stream (times `scale`) still ends within a trace's MAX_ARRIVAL_S: below it
        --min-requests arrivals take longer than a trace may last, so a search halving downwards stops there."""
        return scale * self.min_requests / MAX_ARRIVAL_S


def drawn_stream_requests(library: SessionLibrary, qps: float, duration_s: float, think_times: str) -> float:
    """About how many requests `steady_trace` draws for a stream, those of the sessions started in the lead-in
    before time 0 included (their turns before 0 are dropped later)."""
    think_scale = library.trace_qps / qps if think_times == "scale" else 1.0
    return (library.longest_session_s * think_scale + duration_s) * qps


def max_stream_qps(library: SessionLibrary, workload: WorkloadParams, scale: float = 1.0) -> float:
    """The highest QPS whose stream (times `scale`) one simulation takes: both `check_stream_size`'s count and
    `steady_trace`'s draw grow with the QPS. A search doubling upwards stops below it: with a few --min-requests
    every load passed, up to 1.4e6 req/s, where the sweep ended in an error after every simulation, writing
    nothing. Found by bisection on a log scale (the bound has no simpler form across think-time modes)."""

    def fits(qps: float) -> bool:
        duration_s = workload.duration_s(qps, scale)
        return (qps * duration_s <= MAX_STREAM_REQUESTS
                and drawn_stream_requests(library, qps, duration_s, workload.think_times) <= 2 * MAX_STREAM_REQUESTS)

    low, high = 1e-12, 1e12
    if fits(high):
        return math.inf
    if not fits(low):
        return low
    for _ in range(100):  # 24 decades halved 100 times: far finer than the 6 digits candidates are rounded to
        middle = math.sqrt(low * high)
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def steady_trace(library: SessionLibrary, qps: float, duration_s: float, warmup_s: float,
                 think_times: str, seed: int) -> tuple[Trace, Window]:
    """A trace of the library's sessions arriving at `qps` requests/s for `duration_s` seconds.

    Returns the trace and the window to measure, [warmup_s, duration_s).
    """
    if not (qps > 0 and math.isfinite(qps)):
        raise ValueError(f"qps must be a finite number > 0, got {qps}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E55]))
    mean_gap_s = library.requests_per_session / qps
    think_scale = library.trace_qps / qps if think_times == "scale" else 1.0
    lead_s = library.longest_session_s * think_scale
    # Enough starts to cover [-lead_s, duration_s) in one draw; topped up in the rare case it falls short.
    expected = (lead_s + duration_s) / mean_gap_s
    drawn = drawn_stream_requests(library, qps, duration_s, think_times)
    if not drawn <= 2 * MAX_STREAM_REQUESTS:  # the sessions' lead in, too
        raise StreamTooLong(f"a stream of {duration_s:.6g} s at {qps:.6g} requests/s would hold about "
                            f"{drawn:.3g} requests, more than one simulation takes ({MAX_STREAM_REQUESTS:,}); "
                            "lower --min-duration-s or --qps-max")
    starts: list[np.ndarray] = []
    clock_s, total = -lead_s, 0
    while clock_s < duration_s:
        count = int(expected * 1.1 + 10 * math.sqrt(expected) + 16) if not starts else max(16, int(expected * 0.1))
        gaps = rng.choice(library.start_gaps, size=count) * mean_gap_s
        times = clock_s + np.cumsum(gaps) - gaps[0]
        starts.append(times)
        clock_s = float(times[-1] + gaps[0])
        total += count
    start_s = np.concatenate(starts)
    start_s = start_s[start_s < duration_s]
    sessions = rng.integers(0, library.num_sessions, size=len(start_s))
    rows, instance = library.session_copies(sessions)
    arrival = start_s[instance] + library.offsets_s[rows] * think_scale
    keep = (arrival >= 0) & (arrival < duration_s)
    rows, instance, arrival = rows[keep], instance[keep], arrival[keep]
    order = np.lexsort((rows, instance, arrival))
    rows, instance, arrival = rows[order], instance[order], arrival[order]
    # In the order and with the dtypes traces.validation gives a trace's columns.
    columns: dict[str, object] = {
        "request_id": np.arange(len(rows), dtype=np.int64),
        "arrival_s": arrival,
        "prompt_tokens": library.prompt_tokens[rows].astype(np.int64, copy=False),
        "output_tokens": library.output_tokens[rows].astype(np.int64, copy=False),
    }
    hash_id_offsets = None
    if library.hash_id_offsets is not None:
        hash_id_offsets = library.stream_hash_id_arrays(rows, instance)
        columns["hash_ids"] = _id_lists(*hash_id_offsets)
    columns["session_id"] = instance.astype(np.int64)
    if not len(rows):  # a low QPS with a small --min-requests: TraceError's traceback ("the trace is empty")
        raise EmptyStream(f"no request arrives in a stream of {duration_s:g} s at {qps:g} requests/s")
    frame = pl.DataFrame(columns)
    source = f"{library.source} resampled to {qps:g} req/s for {duration_s:g} s (seed {seed})"
    if not duration_s <= MAX_ARRIVAL_S:  # (a search never asks for one: WorkloadParams.min_qps) validation says why
        return Trace.from_frame(frame, source, library.hash_block_size), Window(start_s=warmup_s, end_s=duration_s)
    # Valid by construction: a validated trace's rows (token counts and hash ids as they were, private ids made
    # fresh), fresh unique request ids, arrivals sorted in [0, duration_s). Validated again, it was ~2 % of a
    # capacity sweep's CPU time (a stream per simulation).
    trace = Trace.of_valid_columns(frame, source, library.hash_block_size, hash_id_offsets)
    return trace, Window(start_s=warmup_s, end_s=duration_s)
