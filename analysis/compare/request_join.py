"""Per-request join of a real and a simulated replay on `request_id`.

Aggregate errors can cancel out (one request too fast, another too slow); the
join pairs each request with its simulated twin so scatter plots and
per-request error distributions show where the simulator is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analysis.compare.inputs import CompareInputError
from analysis.metrics import add_latency_columns
from analysis.schema import FINISHED_REASONS
from analysis.stats import finite_values, round_sig

# Latency metrics whose per-request relative errors are reported (ITL has no per-request value).
PER_REQUEST_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
JOINED_COLUMNS: tuple[str, ...] = (
    "replica", "arrival_s", "prompt_tokens", "output_tokens", "cached_tokens", "num_preemptions", "finish_reason",
    "ttft_s", "tpot_s", "e2e_s", "queue_s",
)
REAL_SUFFIX = "_real"
SIM_SUFFIX = "_sim"


class NoCommonRequestsError(CompareInputError):
    """The two runs share no request id: they replayed different traces."""


def finished_on_both_sides() -> pl.Expr:
    """Per joined row: the request finished ("stop", "length" or a cut) in both runs, never null. Only such a pair
    is timed, as the error table's latencies time finished requests only: an aborted or failed request's E2E is
    its last token's time (its partial output), so beside the other run's whole answer it read as a simulator
    error (a GPU run with 40 of 200 requests aborted after 3 tokens: per-request E2E p90 +2860 %, mean |err| 755 %,
    where the table's E2E excluded them)."""
    return pl.all_horizontal(pl.col("finish_reason" + suffix).is_in(FINISHED_REASONS).fill_null(False)
                             for suffix in (REAL_SUFFIX, SIM_SUFFIX))


@dataclass(frozen=True)
class RequestJoin:
    """Matched requests, one row each: `<column>_real`, `<column>_sim` and `<metric>_rel_error` (null unless the
    request finished in both runs, `finished_on_both_sides`).

    Counts of both inputs are kept so the share of requests matched can be
    reported; a low share means the runs did not replay the same trace slice.
    """

    frame: pl.DataFrame
    num_real: int
    num_sim: int
    num_other_prompts: int = 0  # ids on both sides left out: other prompt lengths, so other requests

    @property
    def left_out_note(self) -> str:
        """What the match counts leave out, as a clause to append ("" when nothing was)."""
        if not self.num_other_prompts:
            return ""
        return (f"; {self.num_other_prompts} request ids on both sides left out: other prompt lengths, so other "
                "requests")

    @property
    def num_matched(self) -> int:
        return self.frame.height

    @property
    def matched_share_real(self) -> float | None:
        """Share of the real run's requests found in the simulated run."""
        return round_sig(self.num_matched / self.num_real) if self.num_real else None

    @property
    def matched_share_sim(self) -> float | None:
        """Share of the simulated run's requests found in the real run."""
        return round_sig(self.num_matched / self.num_sim) if self.num_sim else None

    def error_stats(self) -> dict[str, dict[str, float | int | None]]:
        """Per metric: pairs compared and the signed relative error's mean, p10/p50/p90 and mean |error|."""
        return {key: relative_error_stats(self.frame[f"{key}_rel_error"]) for key in PER_REQUEST_METRICS}

    def to_dict(self) -> dict:
        return {"num_real": self.num_real, "num_sim": self.num_sim, "num_matched": self.num_matched,
                "num_left_out_other_prompt_lengths": self.num_other_prompts,
                "matched_share_real": self.matched_share_real, "matched_share_sim": self.matched_share_sim,
                "relative_errors": self.error_stats()}


def relative_error_stats(errors: pl.Series | np.ndarray) -> dict[str, float | int | None]:
    """Summary of per-request signed relative errors; nulls (undefined errors) are skipped."""
    values = finite_values(errors)
    if values.size == 0:
        return {"num_pairs": 0, **dict.fromkeys(("mean", "p10", "p50", "p90", "mean_abs"))}
    p10, p50, p90 = np.percentile(values, [10.0, 50.0, 90.0])
    stats = {"mean": values.mean(), "p10": p10, "p50": p50, "p90": p90, "mean_abs": np.abs(values).mean()}
    return {"num_pairs": int(values.size), **{name: round_sig(float(value)) for name, value in stats.items()}}


def _check_unique_ids(requests: pl.DataFrame, name: str) -> None:
    duplicated = requests.filter(pl.col("request_id").is_duplicated())["request_id"]
    if duplicated.len():
        raise CompareInputError(
            f"{name}: request_id is not unique ({duplicated.n_unique()} ids repeated, e.g. {duplicated[0]!r})"
        )


def _side(requests: pl.DataFrame, suffix: str) -> pl.DataFrame:
    frame = add_latency_columns(requests).with_columns(pl.col("request_id").cast(pl.Utf8))
    return frame.select("request_id", *(pl.col(column).alias(column + suffix) for column in JOINED_COLUMNS))


def _rel_error_expr(column: str) -> pl.Expr:
    real, sim = pl.col(column + REAL_SUFFIX), pl.col(column + SIM_SUFFIX)
    return pl.when(finished_on_both_sides() & (real != 0)).then((sim - real) / real.abs())


def join_requests(real_requests: pl.DataFrame, sim_requests: pl.DataFrame, real_name: str = "real",
                  sim_name: str = "sim") -> RequestJoin:
    """Inner-join two requests tables on `request_id` (as utf8), in the real run's order; ids whose prompt lengths
    differ are left out (counted in `num_other_prompts`).

    Raises `NoCommonRequestsError` naming both runs when no id matches, and
    `CompareInputError` when an id repeats within one run (the pairing would be
    ambiguous).
    """
    _check_unique_ids(real_requests, real_name)
    _check_unique_ids(sim_requests, sim_name)
    real, sim = _side(real_requests, REAL_SUFFIX), _side(sim_requests, SIM_SUFFIX)
    joined = real.join(sim, on="request_id", how="inner", maintain_order="left")
    if joined.height == 0:
        raise NoCommonRequestsError(
            f"no request ids in common between {real_name} ({real.height} requests) and {sim_name} "
            f"({sim.height} requests): were they replays of the same trace?"
        )
    # The same id with another prompt length is another request (runs of two traces both number theirs 0, 1, ...):
    # paired, --allow-different-requests reported per-request errors of unrelated requests (+507 % E2E). The flag
    # allows runs of other requests to be compared (their distributions, and per request the ones they share);
    # a serving engineer reads a per-request error as the same request's, so only those are paired.
    same = pl.col("prompt_tokens" + REAL_SUFFIX).eq_missing(pl.col("prompt_tokens" + SIM_SUFFIX))
    paired = joined.filter(same)
    paired = paired.with_columns(
        _rel_error_expr(f"{key}_s").alias(f"{key}_rel_error") for key in PER_REQUEST_METRICS
    )
    return RequestJoin(frame=paired, num_real=real.height, num_sim=sim.height,
                       num_other_prompts=joined.height - paired.height)
