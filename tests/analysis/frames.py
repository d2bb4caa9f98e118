"""Builders of small hand-made replay tables for the analysis tests."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from analysis.schema import REQUESTS_SCHEMA, STEPS_SCHEMA

_REQUEST_DEFAULTS = {
    "replica": 0,
    "first_scheduled_s": None,
    "first_token_s": None,
    "prompt_tokens": 10,
    "output_tokens": 0,
    "cached_tokens": 0,
    "num_preemptions": 0,
    "finish_reason": "stop",
    "reject_reason": None,
    "token_times_s": [],
}


def requests_frame(rows: list[dict]) -> pl.DataFrame:
    """A requests table from partial rows (ids and unspecified columns filled in)."""
    full = []
    for index, row in enumerate(rows):
        merged = {"request_id": f"r{index}", **_REQUEST_DEFAULTS, **row}
        merged.setdefault("finish_s", merged["arrival_s"])
        full.append(merged)
    return pl.DataFrame(full, schema=REQUESTS_SCHEMA)


def steps_frame(rows: list[dict]) -> pl.DataFrame:
    """A steps table from partial rows (unspecified columns are 0)."""
    full = [{column: 0 for column in STEPS_SCHEMA} | {"step": index} | row for index, row in enumerate(rows)]
    return pl.DataFrame(full, schema=STEPS_SCHEMA)


def synthetic_requests(
    num_requests: int, mean_output_tokens: int, seed: int = 0, num_replicas: int = 1
) -> pl.DataFrame:
    """A large finished-only requests table built with numpy (for speed and size tests)."""
    rng = np.random.default_rng(seed)
    output_tokens = rng.integers(1, 2 * mean_output_tokens, num_requests)
    arrival_s = np.sort(rng.uniform(0, 600, num_requests))
    first_token_s = arrival_s + rng.uniform(0.01, 1.0, num_requests)
    offsets = np.concatenate([[0], np.cumsum(output_tokens)])
    gaps_s = rng.uniform(0.01, 0.05, offsets[-1])
    gaps_s[offsets[:-1]] = 0.0  # each request's first token is at first_token_s
    within_request_s = np.cumsum(gaps_s) - np.repeat(np.cumsum(gaps_s)[offsets[:-1]], output_tokens)
    token_times_s = np.repeat(first_token_s, output_tokens) + within_request_s
    token_lists = pl.Series(
        "token_times_s", pa.ListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(token_times_s))
    ).cast(pl.List(pl.Float64))
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(num_requests)],
            "replica": rng.integers(0, num_replicas, num_requests),
            "arrival_s": arrival_s,
            "first_scheduled_s": arrival_s + 0.005,
            "first_token_s": first_token_s,
            "finish_s": token_lists.list.last(),
            "prompt_tokens": rng.integers(10, 2000, num_requests),
            "output_tokens": output_tokens,
            "cached_tokens": np.zeros(num_requests, dtype=np.int64),
            "num_preemptions": np.zeros(num_requests, dtype=np.int64),
            "finish_reason": ["stop"] * num_requests,
            "reject_reason": pl.Series([None] * num_requests, dtype=pl.Utf8),
            "token_times_s": token_lists,
        },
        schema=REQUESTS_SCHEMA,
    )


def synthetic_steps(num_steps: int, num_replicas: int = 1, seed: int = 0) -> pl.DataFrame:
    """A large steps table with random counts, `num_steps` rows split over replicas."""
    rng = np.random.default_rng(seed)
    per_replica = num_steps // num_replicas
    columns = {
        "replica": np.repeat(np.arange(num_replicas), per_replica),
        "step": np.tile(np.arange(per_replica), num_replicas),
        "start_s": np.tile(np.linspace(0.0, 600.0, per_replica), num_replicas),
        "duration_s": rng.uniform(0.01, 0.05, per_replica * num_replicas),
        "kv_usage": rng.uniform(0.0, 1.0, per_replica * num_replicas),
    }
    for column in STEPS_SCHEMA:
        if column not in columns:
            columns[column] = rng.integers(0, 512, per_replica * num_replicas)
    return pl.DataFrame(columns, schema=STEPS_SCHEMA)
