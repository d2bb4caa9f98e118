"""One real (GPU) replay against one simulated replay: the metrics of both through the same code,
the per-request join and the schedule diff, and the files they are written to.

Outputs: compare.json (everything), compare.md (the error table), compare.parquet (per-request
pairs) and report.html (the overlay charts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from analysis.band_stats import flat_bands
from analysis.compare.error_table import MetricRow, error_table, prefix_caching_note, run_metrics
from analysis.compare.inputs import CompareInputError, RunData
from analysis.compare.report import write_compare_report
from analysis.compare.request_join import RequestJoin, join_requests
from analysis.compare.step_diff import ScheduleDiff, compare_schedules
from analysis.compare.tables import error_table_markdown
from analysis.formatting import markdown_code
from analysis.metrics import caches_prefixes, has_step_log
from engine.core.messages import counted, escape_controls
from sim.files import write_parquet_frame

# Config keys that differ between any two runs and say nothing about the setup.
_VOLATILE_CONFIG_KEYS = ("simulator_wall_s",)
# What a simulation records about its profile's engine, not an option of either run: said as engine notes instead.
_PROFILE_FEATURES_KEY = "profile_engine_features"
# How far apart a request's arrival may lie in the two runs (from each run's first): both record the trace's own time,
# so only a float's rounding, far below this, and far below any gap between arrivals that changes a load.
ARRIVAL_TOLERANCE_S = 1e-3
# The replay options that set the arrivals (summary.json's config): runs that differ in one are compared as asked.
_ARRIVAL_OPTIONS = ("qps", "time_scale", "offline")


@dataclass(frozen=True)
class Comparison:
    """Everything computed from one real and one simulated run, before anything is written."""

    real: RunData
    sim: RunData
    real_summary: dict
    sim_summary: dict
    rows: list[MetricRow]
    join: RequestJoin
    schedule: ScheduleDiff
    config_differences: dict[str, dict]
    engine_notes: list[str] = field(default_factory=list)  # engine_notes(): where the real engine did otherwise

    def to_dict(self) -> dict:
        """The JSON document written to compare.json."""

        def run_entry(run: RunData, summary: dict) -> dict:
            return {"dir": str(run.path), "cost_model": run.cost_model, "trace": run.metadata.get("trace"),
                    "config": run.config, "summary": summary}

        return {
            "real": run_entry(self.real, self.real_summary),
            "sim": run_entry(self.sim, self.sim_summary),
            "relative_error": "(sim - real) / |real|, null when real is 0 or missing",
            "metrics": [row.to_dict() for row in self.rows],
            "requests": self.join.to_dict(),
            "schedule": self.schedule.to_dict(),
            "config_differences": self.config_differences,
            "engine_notes": self.engine_notes,
        }


def config_differences(real: dict, sim: dict) -> dict[str, dict]:
    """Config keys whose values differ ({key: {"real": ..., "sim": ...}}, None where absent).

    Shown next to the error table because a differing knob (e.g. max_num_seqs)
    explains an error better than any chart.
    """
    return {
        key: {"real": real.get(key), "sim": sim.get(key)}
        for key in sorted(set(real) | set(sim))
        if key not in _VOLATILE_CONFIG_KEYS and key != _PROFILE_FEATURES_KEY and real.get(key) != sim.get(key)
    }


def engine_notes(real: dict, sim: dict) -> list[str]:
    """Where the real run's engine (its config) ran otherwise than the engine the simulation's profile measured
    (``profile_engine_features`` in the simulation's config): its step times price steps that engine ran differently,
    and the errors are those of another engine, not of the simulator. None said where either is not recorded."""
    features = sim.get(_PROFILE_FEATURES_KEY)
    if not isinstance(features, dict):
        return []
    notes = []
    overlap, profiled_overlap = real.get("overlap_decode_attention"), features.get("overlaps_decode_attention", False)
    if isinstance(overlap, bool) and isinstance(profiled_overlap, bool) and overlap != profiled_overlap:
        notes.append(f"the real engine ran {'with' if overlap else 'without'} overlap_decode_attention and the "
                     f"profile's engine {'with' if profiled_overlap else 'without'}: its mixed steps (decode rows "
                     f"beside prefill chunks) are priced {'long' if overlap else 'short'} (on an H100 an engine with "
                     "it served 4-9 % more than a profile without it put its knee at)")
    ahead, profiled_ahead = real.get("run_ahead"), features.get("runs_decode_ahead")
    if isinstance(ahead, bool) and isinstance(profiled_ahead, bool) and ahead != profiled_ahead:
        notes.append(f"the real engine ran {'with' if ahead else 'without'} run-ahead and the profile's engine "
                     f"{'with' if profiled_ahead else 'without'}: its decode steps that repeat their batch are priced "
                     f"{'long' if ahead else 'short'}")
    return notes


def check_same_requests(real: RunData, sim: RunData) -> None:
    """Refuse runs of different traces (or slices of one): the same request ids with the same prompt lengths
    on both sides, or the comparison would measure the workloads, not the simulator. Output lengths may
    differ: a simulation can finish a request differently."""
    columns = ["request_id", "prompt_tokens"]
    a, b = real.requests.select(columns), sim.requests.select(columns)
    joined = a.join(b, on="request_id", how="inner", suffix="_sim")
    differing = joined.filter(pl.col("prompt_tokens") != pl.col("prompt_tokens_sim")).height
    if joined.height != a.height or joined.height != b.height or differing:
        raise CompareInputError(
            f"{real.path} and {sim.path} are runs of different requests ({a.height} real, {b.height} sim, "
            f"{joined.height} request ids in common, {differing} of those with other prompt lengths); compare "
            "replays of the same trace with the same --limit, or pass --allow-different-requests")
    check_same_arrivals(real, sim)


def check_same_arrivals(real: RunData, sim: RunData) -> None:
    """Refuse runs of the same requests sent at other times that neither run's config explains: two traces of the same
    ids and prompts converted or synthesized at other rates were compared at exit 0 without a word, every error the
    load's and not the simulator's (the same trace 4x faster read as TPOT +10 %). A run replayed with another --qps,
    --time-scale or --offline says so in its config, printed as a config difference. sim.replay and engine.replay
    record each request's arrival from the trace, so the two agree, counted from each run's first arrival (a run's
    clock may start elsewhere); a run timed by a client records its sends, late by its own clock and concurrency."""
    if real.timed_by_client or sim.timed_by_client:
        return
    if any(real.config.get(key) != sim.config.get(key) for key in _ARRIVAL_OPTIONS):
        return

    def from_first(run: RunData) -> pl.DataFrame:
        return run.requests.select("request_id", pl.col("arrival_s") - pl.col("arrival_s").min())

    joined = from_first(real).join(from_first(sim), on="request_id", how="inner", suffix="_sim")
    apart = joined.filter((pl.col("arrival_s") - pl.col("arrival_s_sim")).abs() > ARRIVAL_TOLERANCE_S)
    if apart.height:
        request_id, real_s, sim_s = apart.sort("arrival_s", maintain_order=True).row(0)
        raise CompareInputError(
            f"{real.path} and {sim.path} are runs of requests that arrive at other times: {apart.height} of the "
            f"{joined.height} they share arrive more than {ARRIVAL_TOLERANCE_S * 1e3:g} ms apart, counted from each "
            f"run's first arrival (the first, {request_id!r}, at {real_s:.6g} s real and {sim_s:.6g} s sim), with the "
            "same --qps, --time-scale and --offline (traces made at other rates?); compare replays of the same trace, "
            "or pass --allow-different-requests")


def name_positional_requests(real: RunData, sim: RunData) -> tuple[RunData, RunData]:
    """A run whose request ids are positions (an imported vLLM result) takes the other run's ids, in the
    other run's arrival order: the benchmark sent the trace's requests in that order. A mismatch (other
    counts, other prompt lengths) is left for `check_same_requests` to refuse."""
    if real.positional_ids == sim.positional_ids:
        return real, sim
    positional, named = (real, sim) if real.positional_ids else (sim, real)
    if positional.requests.height != named.requests.height:
        return real, sim
    order = positional.requests.with_columns(pl.col("request_id").cast(pl.Int64).alias("__position"))
    ids = _ids_in_send_order(named)
    renamed = order.sort("__position").with_columns(ids.alias("request_id")).drop("__position")
    positional = replace(positional, requests=renamed)
    return (positional, named) if real.positional_ids else (named, positional)


def _ids_in_send_order(run: RunData) -> pl.Series:
    """The run's request ids (utf8) in the order the benchmark sent them: the order of the rows of the trace the run
    replayed, where summary.json names a readable trace holding them all (the benchmark sends the trace's rows in
    order, and --qps or --time-scale keep it). Otherwise by arrival, ties in the order of the ids as numbers when
    every id is one (the trace's rows, as its converters and synthesizer number them). A run's table breaks ties by
    the id as text, so in an offline replay (every request at t = 0, as `vllm bench serve --request-rate inf` sends
    them) "10" came before "2": the benchmark's third request took the trace's eleventh's id, and with prompts of one
    length (vLLM's random dataset) every per-request pair was silently another request's. Text ids ("b", "a" at one
    time) were paired the same way, by the table's text order: refused when no trace says their order."""
    requests = run.requests
    ids = requests["request_id"].cast(pl.Utf8)
    in_trace = _ids_in_trace_order(run.metadata.get("trace"), ids)
    if in_trace is not None:
        return in_trace
    numbers = ids.cast(pl.Int64, strict=False)
    if numbers.null_count():  # ids that are not all numbers: only their arrival times order them
        tied = int(requests["arrival_s"].is_duplicated().sum())
        if tied:
            raise CompareInputError(
                f"{run.path}: {tied} of its requests arrive at the same time as another and their ids are not "
                "numbers, so nothing says which of them the benchmark sent first (its file names requests by "
                "position only), and its summary.json names no readable trace that holds them; import the result "
                "with its trace first: python -m analysis.vllm_import RESULT.json --trace TRACE --out DIR")
        return requests.sort("arrival_s", maintain_order=True)["request_id"].cast(pl.Utf8)
    keyed = requests.with_columns(numbers.alias("__id_number"))
    return keyed.sort("arrival_s", "__id_number", maintain_order=True)["request_id"].cast(pl.Utf8)


def _ids_in_trace_order(trace_path, ids: pl.Series) -> pl.Series | None:
    """``ids`` in the row order of the trace at ``trace_path`` (as summary.json names it); None where that is no
    readable trace or does not hold every id (another file there now)."""
    from traces.schema import load_trace

    if not isinstance(trace_path, str) or not Path(trace_path).is_file():
        return None
    try:
        trace_ids = load_trace(trace_path).requests["request_id"].cast(pl.Utf8)
    except (ValueError, OSError):  # TraceError is a ValueError: a file there that is no trace (now)
        return None
    rows = pl.DataFrame({"request_id": trace_ids, "__row": pl.int_range(0, trace_ids.len(), eager=True)})
    found = pl.DataFrame({"request_id": ids}).join(rows, on="request_id", how="left")
    if found["__row"].null_count():
        return None
    return found.sort("__row")["request_id"]


def compare_runs(real: RunData, sim: RunData) -> Comparison:
    """Metrics of both runs through the same code, the per-request join and the schedule diff.

    Raises `CompareInputError` (naming the folders) when the runs cannot be
    paired, e.g. no request ids in common.
    """
    real_caches, sim_caches = caches_prefixes(real.config), caches_prefixes(sim.config)
    real_summary, real_metrics = run_metrics(real.requests, real.steps, real.recorded_duration_s, real.timed_by_client,
                                             real_caches)
    sim_summary, sim_metrics = run_metrics(sim.requests, sim.steps, sim.recorded_duration_s, sim.timed_by_client,
                                           sim_caches)
    join = join_requests(real.requests, sim.requests, real_name=str(real.path), sim_name=str(sim.path))
    without_log = [run for run in (real, sim) if run.timed_by_client or not has_step_log(run.requests, run.steps)]
    if without_log:
        names = " and ".join(f"{run.label} ({escape_controls(run.path)})" for run in without_log)  # printed
        schedule = ScheduleDiff(steps=None, unavailable=f"{names} logged no engine steps: a run served over "
                                "HTTP or imported from another tool")
    else:
        try:
            schedule = compare_schedules(real.steps, sim.steps, real.requests, sim.requests)
        except ValueError as exc:
            raise CompareInputError(f"{real.path} vs {sim.path}: {exc}") from exc
    return Comparison(real=real, sim=sim, real_summary=real_summary, sim_summary=sim_summary,
                      rows=error_table(real_metrics, sim_metrics, flat_bands(sim.metadata),
                                       prefix_caching_note(real_caches, sim_caches)), join=join,
                      schedule=schedule,
                      config_differences=config_differences(real.config, sim.config),
                      engine_notes=engine_notes(real.config, sim.config))


def markdown_document(comparison: Comparison) -> str:
    """compare.md: one context line and the error table, ready to paste into a README."""
    real, sim = comparison.real, comparison.sim
    cost_model = f" (cost model: {markdown_code(sim.cost_model)})" if sim.cost_model else ""
    intro = (  # names quoted as code spans: a newline, a backtick or a control character in one stays inside
        f"Simulation {markdown_code(sim.name)}{cost_model} vs real {markdown_code(real.name)}; "
        f"relative error = (sim - real) / real; {counted(comparison.join.num_matched, 'request')} matched.\n\n"
    )
    return intro + error_table_markdown(comparison.rows, real.name, sim.name)


def write_outputs(comparison: Comparison, out_dir: Path, report: bool = True) -> list[Path]:
    """Write compare.json, compare.md, compare.parquet and (unless `report` is False) report.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "compare.json", out_dir / "compare.md", out_dir / "compare.parquet"]
    # allow_nan=False: strict JSON (both runs' config is checked on read, see analysis.runs.check_meta).
    written[0].write_text(json.dumps(comparison.to_dict(), indent=2, default=str, allow_nan=False) + "\n",
                          encoding="utf-8")
    # A run folder named with a byte that is not UTF-8 is quoted as its \udcff escape, as report.html does.
    written[1].write_text(markdown_document(comparison), encoding="utf-8", errors="backslashreplace")
    write_parquet_frame(comparison.join.frame, written[2])
    if report:
        written.append(write_compare_report(comparison, out_dir / "report.html"))
    return written
