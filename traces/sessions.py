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


class _Builder:
    def __init__(self, config: SessionConfig, streams: SessionStreams) -> None:
        self.config = config
        self.streams = streams
        self.next_block_id = 0
        self.columns: dict[str, list] = {
            "arrival_s": [], "prompt_tokens": [], "output_tokens": [], "hash_ids": [], "session_id": [], "turn": []
        }

    def add_session(self, session_id: int, start_s: float) -> None:
        cfg, rng = self.config, self.streams
        num_turns = int(cfg.turns.sample(1, rng.turns)[0])
        user = cfg.user_tokens.sample(num_turns, rng.user)
        answer = cfg.answer_tokens.sample(num_turns, rng.answer)
        gaps = gamma_gaps_s(num_turns, cfg.think_time_s, cfg.think_time_cv, rng.think)
        blocks: list[int] = []
        stream_tokens, arrival = 0, start_s
        for turn in range(num_turns):
            prompt = stream_tokens + int(user[turn])
            output = int(answer[turn])
            if prompt + output > cfg.max_context_tokens:
                if turn > 0:
                    break
                prompt = max(1, min(prompt, cfg.max_context_tokens // 2))
                output = max(1, min(output, cfg.max_context_tokens - prompt))
            num_blocks = cdiv(prompt, cfg.hash_block_size)
            while len(blocks) < num_blocks:
                blocks.append(self.next_block_id)
                self.next_block_id += 1
            for name, value in (
                ("arrival_s", arrival), ("prompt_tokens", prompt), ("output_tokens", output),
                ("hash_ids", blocks[:num_blocks]), ("session_id", session_id), ("turn", turn),
            ):
                self.columns[name].append(value)
            stream_tokens = prompt + output
            arrival += float(gaps[turn])

    def kth_arrival_s(self, k: int) -> float | None:
        """The k-th earliest arrival at or after time 0, or None while there are fewer."""
        arrivals = np.asarray(self.columns["arrival_s"])
        arrivals = arrivals[arrivals >= 0]
        if arrivals.size < k:
            return None
        return float(np.partition(arrivals, k - 1)[k - 1])


def build_sessions(
    num_requests: int, qps: float, arrival_cv: float, config: SessionConfig, seed: int, warmup_s: float
) -> pl.DataFrame:
    """The first `num_requests` turns arriving after a warm-up, of sessions started at rate qps / mean turns.

    `qps` is the long-run request rate. Sessions start `warmup_s` before the trace window
    so that it opens in steady state (sessions already mid-conversation) instead of ramping
    up from nothing; turns before the window are dropped and the window is shifted to
    start at 0. Sessions keep being added until no later one could arrive among the first
    `num_requests` requests of the window.
    """
    streams = SessionStreams.from_seed(seed)
    builder = _Builder(config, streams)
    mean_start_gap_s = config.turns.mean() / qps
    session_id, next_start_s = 0, -warmup_s
    while True:
        for gap_s in gamma_gaps_s(256, mean_start_gap_s, arrival_cv, streams.starts):
            kth = builder.kth_arrival_s(num_requests) if next_start_s >= 0 else None
            if kth is not None and next_start_s > kth:
                break
            builder.add_session(session_id, next_start_s)
            session_id += 1
            next_start_s += float(gap_s)
        else:
            continue
        break
    frame = pl.DataFrame(builder.columns, schema_overrides={"hash_ids": pl.List(pl.Int64)})
    frame = (
        frame.filter(pl.col("arrival_s") >= 0)
        .sort(["arrival_s", "session_id", "turn"], maintain_order=True)
        .head(num_requests)
    )
    frame = frame.with_columns(pl.col("arrival_s") - pl.col("arrival_s").first())
    return frame.with_row_index("request_id").with_columns(pl.col("request_id").cast(pl.Int64))
