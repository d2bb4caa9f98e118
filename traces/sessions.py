"""Multi-turn chat sessions whose later turns reuse earlier turns as a prompt prefix.

Each session is one growing token stream: user message 1, answer 1, user message 2, ...
Turn k's prompt is the stream up to the end of user message k, so it contains every
earlier prompt and answer. The stream is cut into `hash_block_size`-token blocks, each
with a globally unique id; a prompt's `hash_ids` are the ids of the blocks it covers, so
the ids of turn k are a prefix of the ids of turn k+1. A prompt's last block may be
partial: its tokens are the leading part of that block, which keeps "equal id at the same
position means equal tokens" true (see token_synth).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from engine.core.config import cdiv
from traces.arrivals import gamma_gaps_s
from traces.lengths import LengthDist


@dataclass(frozen=True)
class SessionConfig:
    """How sessions are drawn; lengths are per message, not per prompt."""

    turns: LengthDist
    user_tokens: LengthDist
    answer_tokens: LengthDist
    think_time_s: float  # mean gap between a turn's arrival and the next turn's arrival
    think_time_cv: float  # 1 = exponential, 0 = fixed
    hash_block_size: int
    max_context_tokens: int  # a session ends before a turn whose prompt + answer would exceed this


@dataclass(frozen=True)
class SessionStreams:
    """Independent random streams, so changing one distribution leaves the others' draws alone."""

    starts: np.random.Generator
    turns: np.random.Generator
    user: np.random.Generator
    answer: np.random.Generator
    think: np.random.Generator

    @classmethod
    def from_seed(cls, seed: int) -> SessionStreams:
        return cls(*(np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)))


MAX_WARMUP_SESSIONS = 2_000_000

# build_sessions draws the sessions again, started closer together, only when max_context_tokens took more than this
# share of the turns they drew: less moves the rate by less than its sampling noise over a trace, and leaves the
# traces drawn before as they were (the committed traces/sharegpt.parquet lost 2 of 6160 turns).
IGNORED_TURN_SHORTFALL = 0.01

# build_sessions' column of first turns cut to fit max_context_tokens: counted for the summary line, then dropped
# (it is no part of a trace).
CUT_COLUMN = "_cut_to_fit"

# Sessions are drawn in blocks (the first this many, then twice as many each time): every stream is drawn
# value after value, so the draws, and the trace, do not depend on the block sizes.
_FIRST_BLOCK = 256
_MAX_BLOCK = 1 << 16
# The most turns drawn in one block (each some 80 bytes over the block's arrays: about 1.3 GB at the most).
_MAX_BLOCK_TURNS = 1 << 24


@dataclass
class _Block:
    """The turns of a block of sessions, one entry per turn (turns a session never reached are left out)."""

    session: np.ndarray  # int64, global session ids
    turn: np.ndarray
    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    first_block: np.ndarray  # the hash id of the turn's first block
    num_blocks: np.ndarray  # the hash blocks its prompt covers
    cut: np.ndarray  # bool: a first turn cut to fit max_context_tokens
    drawn_turns: np.ndarray  # one entry per session: the turns it drew, kept or not


def _draw_block(config: SessionConfig, streams: SessionStreams, first_session: int, starts_s: np.ndarray,
                first_block_id: int) -> tuple[_Block, int]:
    """Sessions ``first_session ..`` starting at ``starts_s``: their kept turns, and the next unused block id.

    The same numbers as drawing and walking one session at a time: each session draws its number of turns,
    then that many user messages, answers and think times; a turn whose prompt and answer would exceed
    ``max_context_tokens`` ends the session (a first turn is cut to fit instead); turn k arrives at the
    session's start plus the first k think times, summed in that order; each session's blocks are numbered
    from the next unused id."""
    num_sessions = len(starts_s)
    # Turns past the most a session can keep were drawn whole and thrown away: --turns fixed:1000000 drew 256
    # million turns (10 GB, over a minute) for a 10-request trace.
    drawn = config.turns.sample(num_sessions, streams.turns)
    turns = np.minimum(drawn, max_kept_turns(config))
    total = int(turns.sum())
    if total > _MAX_BLOCK_TURNS:  # blocks are sized to stay below this; only one session this long can pass it
        raise ValueError(f"--turns {config.turns.spec}: a session drew {total:,} turns; expected at most "
                         f"{_MAX_BLOCK_TURNS:,} (lower --turns, or --max-context-tokens: a session keeps at most "
                         "half of it in turns)")
    user = config.user_tokens.sample(total, streams.user)
    answer = config.answer_tokens.sample(total, streams.answer)
    gaps_s = gamma_gaps_s(total, config.think_time_s, config.think_time_cv, streams.think, "think_time_cv")
    session = np.repeat(np.arange(num_sessions), turns)
    firsts = np.zeros(num_sessions, dtype=np.int64)
    np.cumsum(turns[:-1], out=firsts[1:])
    turn = np.arange(total) - firsts[session]
    limit = config.max_context_tokens
    # A first turn that does not fit is cut to fit; later turns extend the stream by a message and an answer.
    user0, answer0 = user[firsts], answer[firsts]
    over = user0 + answer0 > limit
    cut_user = np.maximum(1, np.minimum(user0, limit // 2))
    user[firsts] = np.where(over, cut_user, user0)
    answer[firsts] = np.where(over, np.maximum(1, np.minimum(answer0, limit - cut_user)), answer0)
    stream = np.cumsum(user + answer)  # each turn's stream end: its prompt and answer
    before = stream - (user + answer)
    prompt = before - before[firsts][session] + user
    # Contexts only grow within a session: the first turn that does not fit ends it, and every later one.
    kept = (turn == 0) | (prompt + answer <= limit)
    arrival_s = np.empty(total)
    arrival_s[firsts] = starts_s
    if int(turns.max()) <= num_sessions:
        for k in range(1, int(turns.max())):  # turn k at turn k - 1 plus its think time: the sums in session order
            rows = firsts[turns > k] + k
            arrival_s[rows] = arrival_s[rows - 1] + gaps_s[rows - 1]
    else:  # few long sessions: the same sums, a session at a time (a step per turn took minutes for 10**7 turns)
        for first, count in zip(firsts.tolist(), turns.tolist()):
            np.add.accumulate(np.concatenate(([arrival_s[first]], gaps_s[first:first + count - 1])),
                              out=arrival_s[first:first + count])
    rows = np.flatnonzero(kept)
    session, turn, prompt = session[rows], turn[rows], prompt[rows]
    num_blocks = cdiv(prompt, config.hash_block_size)
    # A session's blocks are those of its last kept turn, its longest prompt.
    last_kept = np.zeros(num_sessions, dtype=np.int64)
    np.maximum.at(last_kept, session, num_blocks)
    base = np.empty(num_sessions, dtype=np.int64)
    base[0] = first_block_id
    np.cumsum(last_kept[:-1], out=base[1:])
    base[1:] += first_block_id
    cut = np.zeros(total, dtype=bool)
    cut[firsts] = over
    block = _Block(session + first_session, turn, arrival_s[rows], prompt, answer[rows], base[session], num_blocks,
                   cut[rows], drawn)
    return block, first_block_id + int(last_kept.sum())


def max_kept_turns(config: SessionConfig) -> int:
    """The most turns a session can keep: turn k's prompt holds k messages and k answers before its own message,
    at least one token each, so with its answer it needs 2 (k + 1) tokens of max_context_tokens."""
    return max(1, config.max_context_tokens // 2)


def _longest_session(config: SessionConfig) -> int:
    """The most turns one session draws: the distribution's largest value (unbounded ones: the most it keeps)."""
    upper = {"fixed": "value", "uniform": "high"}.get(config.turns.kind, "max")
    return int(min(config.turns.param(upper, float("inf")), max_kept_turns(config)))


def _kth_smallest(values: np.ndarray, k: int) -> float | None:
    return float(np.partition(values, k - 1)[k - 1]) if values.size >= k else None


def build_sessions(
    num_requests: int, qps: float, arrival_cv: float, config: SessionConfig, seed: int, warmup_s: float | None
) -> pl.DataFrame:
    """The first `num_requests` turns arriving after a warm-up, of sessions started at rate qps / mean turns
    kept per session.

    `qps` is the long-run request rate. Sessions start at qps / mean turns; where max_context_tokens ended some
    early, they kept fewer turns than they drew (--qps 6 with --max-context-tokens 500 gave 1.8 requests/s), and
    the same sessions are drawn again, started closer together by the share of their turns they kept: each stream
    draws value after value, so only the start times change, and their think times stay as drawn. ``warmup_s``
    None: 4 x mean turns kept x mean think time."""

    def warmup(mean_start_gap_s: float, kept_share: float) -> float:
        lead_s = 4 * config.turns.mean() * kept_share * config.think_time_s if warmup_s is None else warmup_s
        # Every session started in the warm-up is drawn: bound them, or a huge warm-up (or think time) never ends.
        warmup_sessions = lead_s / mean_start_gap_s
        if warmup_s is None and not warmup_sessions <= MAX_WARMUP_SESSIONS:
            # The default warm-up (4 x mean turns x think time) draws 4 x think_time_s x qps sessions: the error named
            # warmup_s, an option not given, at the inf the default overflowed to (think_time_s 1e308).
            raise ValueError(
                f"think_time_s {config.think_time_s:g} at qps {qps:g} makes the default warm-up draw "
                f"{warmup_sessions:.3g} sessions before the trace starts; expected think_time_s at most "
                f"{MAX_WARMUP_SESSIONS / (4 * qps):.6g} s at this qps (or give warmup_s)"
            )
        if not warmup_sessions <= MAX_WARMUP_SESSIONS:
            raise ValueError(
                f"warmup_s {lead_s:g} at qps {qps:g} would draw {warmup_sessions:.3g} sessions before the "
                f"trace starts; expected at most {MAX_WARMUP_SESSIONS:,} (lower warmup_s or think_time_s)"
            )
        return lead_s

    mean_start_gap_s = config.turns.mean() / qps
    frame, kept_turns, drawn_turns = _build_sessions(num_requests, mean_start_gap_s, arrival_cv, config, seed,
                                                     warmup(mean_start_gap_s, 1.0))
    if kept_turns < (1 - IGNORED_TURN_SHORTFALL) * drawn_turns:
        kept_share = kept_turns / drawn_turns
        mean_start_gap_s *= kept_share
        frame = _build_sessions(num_requests, mean_start_gap_s, arrival_cv, config, seed,
                                warmup(mean_start_gap_s, kept_share))[0]
    return frame


def _build_sessions(
    num_requests: int, mean_start_gap_s: float, arrival_cv: float, config: SessionConfig, seed: int, warmup_s: float
) -> tuple[pl.DataFrame, int, int]:
    """build_sessions' trace of sessions started ``mean_start_gap_s`` apart on average, and the turns its sessions
    and those of the warm-up kept and drew.

    Sessions start `warmup_s` before the trace window
    so that it opens in steady state (sessions already mid-conversation) instead of ramping
    up from nothing; turns before the window are dropped and the window is shifted to
    start at 0. Sessions keep being added until no later one could arrive among the first
    `num_requests` requests of the window: a session starting (at or after 0) later than the
    `num_requests`-th earliest arrival in the window of the sessions before it, and every
    session after it, is left out.
    """
    streams = SessionStreams.from_seed(seed)
    blocks: list[_Block] = []
    window_arrivals: list[np.ndarray] = []  # arrivals at or after 0, per block
    # Fewer sessions a block when each may be long, so that a block draws at most _MAX_BLOCK_TURNS turns.
    max_block = max(1, min(_MAX_BLOCK, _MAX_BLOCK_TURNS // _longest_session(config)))
    next_start_s, next_block_id, num_sessions, size = -warmup_s, 0, 0, min(_FIRST_BLOCK, max_block)
    while True:
        # Each start is the one before plus a gap, summed in order (the first one -warmup_s).
        starts_s = np.empty(size + 1)
        starts_s[0] = next_start_s
        starts_s[1:] = gamma_gaps_s(size, mean_start_gap_s, arrival_cv, streams.starts, "arrival_cv")
        np.add.accumulate(starts_s, out=starts_s)
        block, next_block_id = _draw_block(config, streams, num_sessions, starts_s[:-1], next_block_id)
        blocks.append(block)
        window_arrivals.append(block.arrival_s[block.arrival_s >= 0])
        num_sessions += size
        next_start_s = float(starts_s[-1])
        if next_start_s >= 0:
            kth = _kth_smallest(np.concatenate(window_arrivals), num_requests)
            if kth is not None and next_start_s > kth:  # the next session would be left out: the stop is in here
                break
        size = min(2 * size, max_block)
    # The first session of the last block that is left out (monotone: later starts, more arrivals before them).
    earlier = np.concatenate(window_arrivals[:-1]) if len(window_arrivals) > 1 else np.zeros(0)
    first_in_block = num_sessions - size
    low, high = 0, size  # session first_in_block + high is left out; find the first one that is
    last_arrivals, last_sessions = block.arrival_s, block.session
    while low < high:
        mid = (low + high) // 2
        start_s = float(starts_s[mid])
        if start_s >= 0:
            before = last_arrivals[(last_sessions < first_in_block + mid) & (last_arrivals >= 0)]
            kth = _kth_smallest(np.concatenate([earlier, before]), num_requests)
            if kth is not None and start_s > kth:
                high = mid
                continue
        low = mid + 1
    stop = first_in_block + low
    columns = {name: np.concatenate([getattr(b, name) for b in blocks])
               for name in ("session", "turn", "arrival_s", "prompt", "output", "first_block", "num_blocks", "cut")}
    rows = np.flatnonzero((columns["session"] < stop) & (columns["arrival_s"] >= 0))
    # By arrival, then session, then turn (no two turns tie on all three), the first num_requests.
    order = np.lexsort((columns["turn"][rows], columns["session"][rows], columns["arrival_s"][rows]))
    rows = rows[order[:num_requests]]
    num_blocks = columns["num_blocks"][rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(num_blocks, out=offsets[1:])
    hash_ids = np.repeat(columns["first_block"][rows] - offsets[:-1], num_blocks) + np.arange(offsets[-1])
    arrival_s = columns["arrival_s"][rows]
    # Over the sessions up to the stop (the trace's, and those of the warm-up), as the trace is: not the block sizes'.
    kept_turns = int(np.count_nonzero(columns["session"] < stop))
    drawn_turns = int(np.concatenate([b.drawn_turns for b in blocks])[:stop].sum())
    return pl.DataFrame({
        "request_id": np.arange(len(rows), dtype=np.int64),
        "arrival_s": arrival_s - arrival_s[0],
        "prompt_tokens": columns["prompt"][rows],
        "output_tokens": columns["output"][rows],
        "hash_ids": pl.from_arrow(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(hash_ids, pa.int64()))),
        "session_id": columns["session"][rows],
        "turn": columns["turn"][rows],
        CUT_COLUMN: columns["cut"][rows],
    }), kept_turns, drawn_turns
