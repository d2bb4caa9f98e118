"""The one writer of a replay folder, simulated or on a GPU, so both lay their folders out alike:

- ``requests.parquet``: one row per request (``engine.core.records``) plus latency columns, by arrival;
- ``steps.parquet``: one row per engine step, per replica;
- ``summary.json``: our metrics and vLLM's flat names (``mean_ttft_ms``, ...), goodput when SLOs are given, then
  ``cost_model``, ``trace`` and ``config`` of the run (and ``recorded_duration_s`` for a run whose duration was
  recorded rather than taken from its arrivals: an imported ``vllm bench serve`` result), and for a simulated run
  its ``warnings`` (``sim.limits``) and, when asked, its prediction ``bands``;
- ``report.html``: the self-contained Plotly report (unless not asked for).

Both tables and summary.json carry one run id (``sim.run_id``), so that a folder mixing two runs' files is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from analysis.band_stats import check_bands
from analysis.metrics import (
    SUMMARY_STEP_INPUTS,
    add_latency_columns,
    caches_prefixes,
    is_finished,
    is_timed_by_client,
    itl_values,
    summarize,
)
from analysis.report.panels import REPORT_STEP_INPUTS
from analysis.schema import MAX_TIME_S, conform_requests
from analysis.slo import SLO, limit_s_from_ms
from analysis.stats import finite_values
from analysis.vllm_metrics import DEFAULT_METRIC_PERCENTILES, check_metric_percentile
from engine.core.json_errors import json_problem, json_type_name
from engine.core.messages import shown
from sim.files import write_parquet_frame, write_text_atomic
from sim.run_id import RUN_ID_KEY, SUMMARY_RUN_ID_KEY, parquet_run_id

# The step log's codec and statistics, written by polars (which dictionary-encodes only the columns with few distinct
# values) with each page's null count but no min/max: those statistics only let a reader skip row groups by value, and
# computing them was a third of the write. The Azure trace's 1.78M steps: 0.22 CPU s instead of pyarrow's 0.32 (with
# its dictionary encoding on the few-valued columns), 36 MB instead of 42; pyarrow and polars read the same table.
STEP_PARQUET_OPTIONS = {"compression": "snappy",
                        "statistics": {"min": False, "max": False, "distinct_count": False, "null_count": True}}

# The request table's codec: polars' default zstd at level 1 instead of 3 wrote the Azure trace's 19k requests (4.1M
# token times) in 0.057 CPU s instead of 0.118, 12.5 MB instead of 12.3.
REQUEST_PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 1}

# What summary.json says about the run besides its metrics.
META_KEYS = ("cost_model", "trace", "config", "recorded_duration_s", "request_ids", "warnings", "bands")


def with_latency_columns(requests: pl.DataFrame) -> pl.DataFrame:
    """The request table as it is written: latency columns added, ordered by arrival."""
    if "ttft_s" not in requests.columns:
        requests = add_latency_columns(requests)
    return requests.sort("arrival_s", "request_id", maintain_order=True)


def write_run(
    out_dir: Path,
    requests: pa.Table,
    steps: pa.Table,
    meta: dict,
    *,
    report_title: str | None = None,
    report_subtitle: str = "",
    slos: tuple[SLO, ...] | None = None,
    metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES,
) -> dict:
    """Write the folder; ``meta`` (cost_model, trace, config) follows the metrics in summary.json.
    A report is written when ``report_title`` is given; goodput when ``slos`` are; the flat names' percentiles are
    ``metric_percentiles``. Returns the summary."""
    request_frame, step_frame = write_tables(out_dir, requests, steps)
    return write_summary(out_dir, request_frame, step_frame, meta, report_title=report_title,
                         report_subtitle=report_subtitle, slos=slos, metric_percentiles=metric_percentiles)


def write_tables(
    out_dir: Path,
    requests: pa.Table,
    steps: pa.Table,
    step_columns: tuple[str, ...] = SUMMARY_STEP_INPUTS + REPORT_STEP_INPUTS,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """requests.parquet and steps.parquet; returns the request table as written and the step log's
    ``step_columns`` that it has (by default those ``write_summary`` reads, report included).

    A caller that passes the tables without keeping them (sim.replay) has the rest freed on return, for the summary
    and report to reuse instead of having the kernel map and zero fresh pages (~0.8 CPU ms a MB): of the Azure
    trace's 1.78M steps, 8 of 21 columns (114 MB), and the requests as built before their sort (33 MB of token
    times). Its outputs then peaked ~90 MB lower, with ~22,000 fewer page faults."""
    out_dir.mkdir(parents=True, exist_ok=True)
    request_frame = with_latency_columns(pl.from_arrow(requests))
    step_frame = pl.from_arrow(steps)
    # Both tables say which run they are of (write_summary copies it into summary.json): sim.run_id.
    metadata = {RUN_ID_KEY: tables_run_id(request_frame, step_frame)}
    write_parquet_frame(request_frame, out_dir / "requests.parquet", metadata=metadata, **REQUEST_PARQUET_OPTIONS)
    write_parquet_frame(step_frame, out_dir / "steps.parquet", metadata=metadata, **STEP_PARQUET_OPTIONS)
    return request_frame, step_frame.select(list(dict.fromkeys(c for c in step_columns if c in step_frame.columns)))


def tables_run_id(requests: pl.DataFrame, steps: pl.DataFrame) -> str:
    """The run id of a run of these tables (``sim.run_id``): a digest of the requests' scalar columns (their times,
    tokens and outcomes: two runs of one trace differ there, and a GPU's runs always do) and of the step log's
    length. The requests' token times (33 MB on the Azure trace's hour) and the step log's columns (1.78M rows) are
    left out: they add nothing that tells two runs apart and would cost more than the rest of the digest."""
    scalar = [name for name, dtype in requests.schema.items() if not dtype.is_nested()]
    digest = hashlib.sha256(f"{requests.height} requests {steps.height} steps {','.join(scalar)}".encode())
    if scalar and requests.height:
        digest.update(requests.select(scalar).hash_rows(seed=0).to_numpy().tobytes())
    return digest.hexdigest()[:16]


def write_summary(
    out_dir: Path,
    requests: pl.DataFrame,
    steps: pl.DataFrame,
    meta: dict,
    *,
    report_title: str | None = None,
    report_subtitle: str = "",
    slos: tuple[SLO, ...] | None = None,
    metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES,
    carried: dict | None = None,
) -> dict:
    """summary.json (written whole: a temporary file renamed over the old one) and, if asked, report.html.
    ``carried``: an earlier summary.json's keys that this version does not write (``read_other_keys``), kept after
    its own where it writes none of that name."""
    # The finished requests' token gaps, pooled once for both the summary and the report (4.6M of them on the Azure
    # trace's hour: 0.03 CPU s each time), and sorted once: the report's CDF sorts them anyway, and the summary's
    # percentiles partition a sorted array in a third of the time. Sorted by numpy: from numpy 2 on its sort is
    # vectorised (x86-simd-sort), 4.1M gaps in 0.05 CPU s where polars' took 0.07 on one thread and 0.10 on two (one
    # core, as a pinned benchmark runs), the same array to the bit.
    itl_s = sorted_itl_s = None
    if report_title is not None:
        itl_s = itl_values(conform_requests(requests, ["finish_reason", "token_times_s"]).filter(is_finished()))
        sorted_itl_s = np.sort(finite_values(itl_s))
    summary = summarize(requests, steps, slos, duration_s=meta.get("recorded_duration_s"),
                        timed_by_client=is_timed_by_client(meta), itl_s=itl_s, sorted_itl_s=sorted_itl_s,
                        metric_percentiles=metric_percentiles, prefix_caching=caches_prefixes(meta.get("config")))
    # The tables' own, before what the run says of itself (meta): a re-summary of a folder written before run ids
    # records none.
    run_id = parquet_run_id(out_dir / "requests.parquet")
    if run_id is not None:
        summary[SUMMARY_RUN_ID_KEY] = run_id
    summary.update(meta)
    summary.update({key: value for key, value in (carried or {}).items() if key not in summary})
    # allow_nan=False: a NaN would be written as a bare NaN token that no JSON reader but Python's accepts.
    write_text_atomic(out_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    if report_title is not None:
        try:
            from analysis.report.replay_report import write_report
        except ModuleNotFoundError as exc:  # plotly is optional where runs are recorded (a bare GPU host)
            missing = (exc.name or "plotly").split(".")[0]
            # Not named by ``out_dir``: that is the staging folder (``.NAME.partial-PID``), renamed once written.
            print(f"note: no report.html: {missing} is not installed (pip install plotly, or pass "
                  "--no-report); the run's data is written", file=sys.stderr)
            return summary
        write_report(requests, steps, summary, out_dir / "report.html", title=report_title, subtitle=report_subtitle,
                     itl_s=sorted_itl_s)  # a CDF's values: their order does not matter
    return summary


def read_meta(run_dir: Path) -> dict:
    """What the folder's summary.json (or an older GPU run's run.json) says about the run."""
    for name in ("summary.json", "run.json"):
        path = run_dir / name
        if path.is_file():
            try:
                recorded = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: not valid JSON ({exc})") from None
            except UnicodeDecodeError as exc:  # the codec's message named no file
                raise ValueError(f"{path}: {json_problem(exc)}; expected the JSON a run writes") from None
            except RecursionError:  # arrays nested thousands deep were a traceback
                raise ValueError(f"{path}: JSON nested too deeply to read; expected the JSON a run writes") from None
            except ValueError as exc:  # an integer of 5000 digits: the message named no file
                raise ValueError(f"{path}: not valid JSON ({json_problem(exc)})") from None
            if not isinstance(recorded, dict):
                raise ValueError(f"{path}: the top level is a JSON {json_type_name(recorded)}; expected an object")
            meta = {key: recorded[key] for key in META_KEYS if key in recorded}
            check_meta(meta, path)
            return meta
    return {}


# What each kept key of summary.json must be: the summary and the report read into them (config.get(...),
# each warning's code and message), so a hand-edited file must fail here, by name, not there as a traceback.
_META_TYPES = {"cost_model": (str,), "trace": (str,), "config": (dict,), "recorded_duration_s": (int, float),
               "request_ids": (str,), "warnings": (list,), "bands": (dict,)}


def check_meta(meta: dict, path: Path) -> None:
    """Raise ValueError naming ``path`` and the first of summary.json's kept keys (META_KEYS) in ``meta`` that its
    readers cannot use (analysis.compare reads the same keys)."""
    for key, value in meta.items():
        if isinstance(value, bool) or (value is not None and not isinstance(value, _META_TYPES[key])):
            expected = " or ".join(t.__name__ for t in _META_TYPES[key])
            raise ValueError(f"{path}: {key!r} is {shown(value, 60)}; expected {expected}")
    duration_s = meta.get("recorded_duration_s")
    if duration_s is not None and not 0 < duration_s <= MAX_TIME_S:  # NaN too: summarize wrote it back, not JSON
        raise ValueError(f"{path}: 'recorded_duration_s' is {duration_s!r}; expected the run's duration, a number of "
                         f"seconds > 0 and at most {MAX_TIME_S:g}")
    where = non_finite_key(meta.get("config"), "config")
    if where is not None:  # NaN or Infinity: summarize and compare wrote it back, and JSON has no such number
        raise ValueError(f"{path}: {where!r} is NaN or Infinity; expected a finite number, a string or null")
    for i, warning in enumerate(meta.get("warnings") or []):
        if not isinstance(warning, dict) or not all(isinstance(warning.get(k), str) for k in ("code", "message")):
            raise ValueError(f"{path}: warnings[{i}] is {shown(warning, 60)}; expected an object with a 'code' and "
                             "a 'message'")
    if meta.get("bands") is not None:
        try:
            check_bands(meta["bands"])
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def non_finite_key(value, name: str) -> str | None:
    """The key (``config.qps``, ``config.sizes[2]``) of the first NaN or Infinity in ``value``, else None:
    Python's json reads and writes them, no other JSON reader does."""
    if isinstance(value, float) and not math.isfinite(value):
        return name
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite_key(item, f"{name}[{key}]" if isinstance(value, list) else f"{name}.{key}")
        if found is not None:
            return found
    return None


# What write_summary writes only where asked (SLOs) or from the tables (the run id): never carried over from an earlier
# summary.json as a key this version does not write.
_WRITTEN_WHEN_ASKED = ("goodput", "request_goodput", "slos_ms", SUMMARY_RUN_ID_KEY)


def read_other_keys(run_dir: Path) -> dict:
    """The keys of the folder's summary.json that this version neither computes nor keeps as the run's (META_KEYS):
    a newer version's, or a user's own note. A re-summary carries them over (``write_summary``'s ``carried``) rather
    than dropping what it cannot write again: the tables they were written of are the same."""
    path = run_dir / "summary.json"
    try:
        recorded = json.loads(path.read_text()) if path.is_file() else {}
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return {}  # read_meta names an unreadable file
    if not isinstance(recorded, dict):
        return {}
    other = {key: value for key, value in recorded.items() if key not in META_KEYS + _WRITTEN_WHEN_ASKED}
    where = non_finite_key(other, "summary")
    if where is not None:  # Python's json read it, and would not write it back
        raise ValueError(f"{path}: {where.removeprefix('summary.')!r} is NaN or Infinity; expected a finite number, "
                         "a string or null")
    return other


def read_slos(run_dir: Path) -> tuple[SLO, ...] | None:
    """The SLOs the folder's summary.json was judged by (its ``slos_ms``), so a re-summary keeps its goodput."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        limits = json.loads(path.read_text()).get("slos_ms")
    except (ValueError, RecursionError, AttributeError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None  # read_meta names an unreadable file
    if limits is None or limits == {}:
        return None
    if not isinstance(limits, dict):  # was taken for "no SLOs": the re-summary dropped the run's goodput silently
        raise ValueError(f"{path}: slos_ms is {shown(json.dumps(limits), 60)}; expected an object of "
                         "metric_statistic: limit in ms, such as {\"ttft_p90\": 2000}")
    slos = []
    for key, limit_ms in limits.items():
        metric, _, statistic = str(key).partition("_")
        if isinstance(limit_ms, bool) or not isinstance(limit_ms, (int, float)):  # null, "5", true: not a limit
            raise ValueError(f"{path}: slos_ms entry {key!r} is {shown(json.dumps(limit_ms), 60)}; expected a number "
                             "of ms")
        try:
            slos.append(SLO(metric, statistic, limit_s_from_ms(limit_ms)))  # as --slo parses LIMITms
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: slos_ms entry {key!r}: {exc}") from None
    return tuple(slos)


def read_metric_percentiles(run_dir: Path) -> tuple[float, ...]:
    """The percentiles of the folder's summary.json flat names (its ``metric_percentiles``), so a re-summary keeps
    them; vLLM's default for a folder written before they could be chosen."""
    path = run_dir / "summary.json"
    try:
        recorded = json.loads(path.read_text()).get("metric_percentiles") if path.is_file() else None
    except (ValueError, RecursionError, AttributeError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return DEFAULT_METRIC_PERCENTILES  # read_meta names an unreadable file
    if recorded is None:
        return DEFAULT_METRIC_PERCENTILES
    expected = "expected a list of percentiles, numbers from 0 to 100"
    if not isinstance(recorded, list):
        raise ValueError(f"{path}: metric_percentiles is {shown(json.dumps(recorded), 60)}; {expected}")
    percentiles = []
    for q in recorded:
        if isinstance(q, bool) or not isinstance(q, (int, float)):
            raise ValueError(f"{path}: metric_percentiles entry {shown(json.dumps(q), 60)}: {expected}")
        try:
            percentiles.append(check_metric_percentile(q, repr(q)))
        except ValueError as exc:
            raise ValueError(f"{path}: metric_percentiles: {exc}") from None
    return tuple(dict.fromkeys(percentiles))
