"""Shared helpers of the simulator tests: tiny hand-made traces, CLI runs and table checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from engine.core.scheduler import ScheduledBatch
from sim import router as routers
from traces.schema import Trace, save_trace

REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
SHAREGPT = REPO / "traces" / "sharegpt.parquet"

SUMMARY_STAT_KEYS = ("p50", "p90", "p99", "mean")


def trace_frame(
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    arrival_s: Sequence[float] | None = None,
    hash_ids: Sequence[Sequence[int]] | None = None,
) -> pl.DataFrame:
    n = len(prompt_tokens)
    assert len(output_tokens) == n
    columns: dict = {
        "request_id": list(range(n)),
        "arrival_s": [0.0] * n if arrival_s is None else [float(a) for a in arrival_s],
        "prompt_tokens": list(prompt_tokens),
        "output_tokens": list(output_tokens),
    }
    schema = {"request_id": pl.Int64, "arrival_s": pl.Float64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64}
    if hash_ids is not None:
        columns["hash_ids"] = [list(h) for h in hash_ids]
        schema["hash_ids"] = pl.List(pl.Int64)
    return pl.DataFrame(columns, schema=schema)


def make_trace(
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    arrival_s: Sequence[float] | None = None,
    hash_ids: Sequence[Sequence[int]] | None = None,
    hash_block_size: int | None = None,
) -> Trace:
    """A validated in-memory trace; request ids are the row numbers 0..n-1."""
    frame = trace_frame(prompt_tokens, output_tokens, arrival_s, hash_ids)
    return Trace.from_frame(frame, "hand-made test trace", hash_block_size)


def write_trace(path: Path, *args, hash_block_size: int | None = None, **kwargs) -> Path:
    """Like make_trace, written as a parquet trace with ``save_trace``."""
    save_trace(trace_frame(*args, **kwargs), path, hash_block_size=hash_block_size)
    return path


def run_cli(
    args: Sequence[object], env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m sim.replay ARGS`` in a child process at the repository root."""
    full_env = dict(os.environ)
    full_env.pop("PYTHONHASHSEED", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sim.replay", *map(str, args)],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_outputs(out_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    requests = pl.read_parquet(out_dir / "requests.parquet")
    steps = pl.read_parquet(out_dir / "steps.parquet")
    summary = json.loads((out_dir / "summary.json").read_text())
    return requests, steps, summary


def result_tables(result) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A SimResult's requests (with the latency columns, in arrival order) and steps, as the CLI writes them."""
    from analysis.metrics import add_latency_columns

    requests = add_latency_columns(pl.from_arrow(result.requests_table()))
    requests = requests.sort("arrival_s", "request_id", maintain_order=True)
    return requests, pl.from_arrow(result.steps_table())


def without_wall_clock(value):
    """``value`` (a summary) with every wall-clock field (a key containing ``wall``) removed, recursively."""
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if "wall" not in k}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def assert_frames_equal(left: pl.DataFrame, right: pl.DataFrame, what: str) -> None:
    assert left.columns == right.columns, f"{what}: columns differ: {left.columns} vs {right.columns}"
    assert left.schema == right.schema, f"{what}: dtypes differ"
    assert left.height == right.height, f"{what}: {left.height} vs {right.height} rows"
    if not left.equals(right, null_equal=True):
        for column in left.columns:
            if not left[column].equals(right[column], null_equal=True):
                diff = (left[column] != right[column]).fill_null(True).arg_true()
                row = int(diff[0]) if len(diff) else None
                raise AssertionError(
                    f"{what}: column {column!r} differs, first at row {row}: "
                    f"{left[column][row] if row is not None else '?'} vs "
                    f"{right[column][row] if row is not None else '?'}"
                )
        raise AssertionError(f"{what}: frames differ")


def assert_conserved(requests: pl.DataFrame, request_ids: Sequence[object]) -> None:
    """Every request of the trace appears exactly once and ended served (stopped, at its length, or cut by a
    limit) or rejected."""
    ids = requests["request_id"].to_list()
    assert len(ids) == len(set(ids)), "a request id appears more than once"
    assert sorted(ids) == sorted(str(i) for i in request_ids), "requests missing or unexpected"
    reasons = requests["finish_reason"]
    assert reasons.null_count() == 0, "a request has no finish_reason"
    allowed = {"stop", "length", "max_model_len", "kv_capacity", "token_budget", "rejected"}
    assert set(reasons.unique().to_list()) <= allowed, reasons.value_counts()
    rejected = requests.filter(pl.col("finish_reason") == "rejected")
    assert rejected["reject_reason"].null_count() == 0, "a rejected request has no reject_reason"
    assert (rejected["output_tokens"] == 0).all(), "a rejected request produced tokens"
    served = requests.filter(pl.col("finish_reason") != "rejected")
    assert served["reject_reason"].null_count() == served.height, "a served request has a reject_reason"
    # Served requests have every timestamp, in order, and as many token times as output tokens.
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        assert served[column].null_count() == 0, f"a served request has no {column}"
    assert (served["first_scheduled_s"] >= served["arrival_s"]).all()
    assert (served["first_token_s"] > served["first_scheduled_s"]).all()
    assert (served["finish_s"] >= served["first_token_s"]).all()
    assert (served["token_times_s"].list.len() == served["output_tokens"]).all()
    assert (served["output_tokens"] >= 1).all()


def assert_steps_within_limits(
    steps: pl.DataFrame, *, max_num_seqs: int, max_num_batched_tokens: int, num_gpu_blocks: int
) -> None:
    """Every step respects the batch limits and the cache size, and a replica's steps never overlap in time."""
    assert steps.height > 0
    worst = steps.select(
        pl.col("num_seqs").max(),
        pl.col("num_batched_tokens").max(),
        pl.col("num_kv_blocks_used").max(),
    ).row(0, named=True)
    assert worst["num_seqs"] <= max_num_seqs, f"a step ran {worst['num_seqs']} > max_num_seqs={max_num_seqs} sequences"
    assert worst["num_batched_tokens"] <= max_num_batched_tokens, (
        f"a step computed {worst['num_batched_tokens']} > max_num_batched_tokens={max_num_batched_tokens} tokens"
    )
    assert worst["num_kv_blocks_used"] <= num_gpu_blocks
    assert (steps["num_seqs"] >= 1).all(), "an empty step was recorded"
    assert (steps["num_seqs"] == steps["num_prefill_seqs"] + steps["num_decode_seqs"]).all()
    assert (steps["num_batched_tokens"] == steps["num_prefill_tokens"] + steps["num_decode_seqs"]).all()
    assert (steps["duration_s"] > 0).all()
    assert (steps["kv_usage"] <= 1.0).all()
    for replica, group in steps.group_by("replica"):
        group = group.sort("step")
        assert group["step"].to_list() == list(range(group.height)), f"replica {replica}: step numbers not 0..n-1"
        ends = (group["start_s"] + group["duration_s"]).head(group.height - 1)
        starts = group["start_s"].tail(group.height - 1)
        assert (starts >= ends - 1e-9).all(), f"replica {replica}: steps overlap in time"


def save_tiny_qwen3(folder: Path, max_position_embeddings: int) -> Path:
    """A tiny random Qwen3 saved under ``folder`` (seeded), for sim.profile on the CPU; skips without torch."""
    import pytest

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
    )
    transformers.Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


# A cost model and a watch for figures worked out by hand (tests/sim/test_probe_session27_s.py, ..._28_y.py).
QUARTER_STEP_S = 0.25


class QuarterSecondSteps:
    """Every step takes QUARTER_STEP_S (binary-exact sums): a replica's step k ends at (k + 1) * QUARTER_STEP_S from
    its first arrival at 0."""

    name = "quarter-second steps"

    def step_time_s(self, batch, host_slowdown=None) -> float:
        return QUARTER_STEP_S


class FixedClock:
    """A clock stopped at ``now_s`` (the cost model reads the host's speed at the step's start from it)."""

    def __init__(self, now_s: float) -> None:
        self._now_s = now_s

    def now(self) -> float:
        return self._now_s


def decode_only_batch(num_seqs: int, context: int, longest: int) -> ScheduledBatch:
    """A decode-only batch of ``num_seqs`` rows holding ``context`` tokens in all, the longest ``longest``."""
    batch = ScheduledBatch(seqs=[None] * num_seqs, num_new_tokens=[1] * num_seqs, num_decode_seqs=num_seqs)
    batch.decode_context_tokens, batch.max_decode_context_tokens = context, longest
    return batch


class StopAt:
    """A RunWatch that stops the simulation at ``stop_s`` (as analysis.capacity's certain miss stops a point)."""

    def __init__(self, stop_s: float) -> None:
        self.stop_s = stop_s

    def arrived(self, index, seq) -> None:
        pass

    def next_check_s(self) -> float:
        return self.stop_s

    def check(self, now_s: float) -> bool:
        return True


def record_waiting_windows(patch) -> list[int]:
    """Make sim.simulator's planner (through ``patch``, a monkeypatch or its context) note the steps of every window it
    plans while requests wait (engine.core.quiet_window.admits_none); returns the list it fills."""
    import sim.simulator as simulator

    plan = simulator.plan_quiet_window
    waited: list[int] = []

    def plan_and_note(engine, *args, **kwargs):
        planned = plan(engine, *args, **kwargs)
        if planned is not None and planned[0].admits_none:
            waited.append(planned[0].num_steps)
        return planned

    patch.setattr(simulator, "plan_quiet_window", plan_and_note)
    return waited


class RecordingPrefixRouter(routers.PrefixAffinityRouter):
    """The prefix router, noting what it reads of every replica at each arrival (its queues, the prompt's cached
    prefix blocks, the blocks in use): a fast-forwarded run must show the router the step loop's replicas."""

    def __init__(self, views: list) -> None:
        super().__init__()
        self.views = views

    def route(self, prompt_token_ids, engines) -> int:
        hashes = routers.prefix_block_hashes(prompt_token_ids, engines[0].config.block_size)
        self.views.append([(len(e.scheduler.waiting), len(e.scheduler.running),
                            e.scheduler.block_manager.num_cached_prefix_blocks(hashes),
                            e.scheduler.block_manager.num_used_blocks) for e in engines])
        return super().route(prompt_token_ids, engines)
