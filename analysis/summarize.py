"""Re-summarize replay folders: summary.json (and optionally report.html) from their tables.

``python -m analysis.summarize DIR...`` reads requests.parquet and steps.parquet, never rewrites them,
and keeps what summary.json (or an older GPU run's run.json) recorded about the run: its config,
cost model and trace, and any key it does not write itself (a newer version's, or a user's note). A folder whose files
are of different runs (``sim.run_id``) is refused.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analysis.console import print_out
from analysis.report.summary_table import format_summary_table
from analysis.runs import (
    read_meta,
    read_metric_percentiles,
    read_other_keys,
    read_slos,
    with_latency_columns,
    write_summary,
)
from analysis.schema import check_requests, check_steps, conform_requests, conform_steps
from engine.core.config_args import OneLineErrorParser
from engine.core.interrupt import EACH_FILE_WHOLE, exit_130_on_interrupt, exit_when_done
from engine.core.messages import escape_controls
from sim.files import RUN_FILES, read_parquet_frame
from sim.run_id import mixed_run_problem
from traces.files import is_link_loop


def check_is_folder(run_dir: Path) -> None:
    """Raise FileNotFoundError unless ``run_dir`` is an existing folder. main checks every argument so before it
    rewrites any folder: a mistyped last argument left the folders before it rewritten."""
    if run_dir.exists() and not run_dir.is_dir():  # was "RESULT.json/requests.parquet does not exist"
        hint = ""
        if run_dir.name in RUN_FILES:
            hint = f" (the folder holding it: {run_dir.parent})"
        elif run_dir.suffix == ".json":
            hint = " (for a vllm bench serve result, python -m analysis.vllm_import RESULT.json --out DIR makes one)"
        raise FileNotFoundError(f"{run_dir} is a file, not a folder; expected a replay output folder{hint}")
    if not run_dir.exists():
        what = "is a symbolic link loop" if is_link_loop(run_dir) else "does not exist"
        raise FileNotFoundError(f"{run_dir} {what}; expected a replay output folder")


def check_run_dir(run_dir: Path) -> None:
    """Raise FileNotFoundError unless ``run_dir`` is a folder holding both tables."""
    check_is_folder(run_dir)
    for name in ("requests.parquet", "steps.parquet"):
        if not (run_dir / name).is_file():
            what = "is not a regular file" if (run_dir / name).exists() else "does not exist"
            raise FileNotFoundError(f"{run_dir / name} {what}")


def summarize_run_dir(run_dir: Path, report: bool = False) -> dict:
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    html = run_dir / "report.html"
    if report and (html.is_dir() or (html.exists() and not html.is_file())):  # before summary.json is rewritten
        raise OSError(21 if html.is_dir() else 17, "is a folder or not a regular file; expected report.html (a link "
                      "to a file is replaced, not followed)", str(html))
    mixed = mixed_run_problem(run_dir)
    if mixed:  # its summary would be written of one run's requests and another's steps
        raise ValueError(mixed)
    meta = read_meta(run_dir)
    slos = read_slos(run_dir)  # its errors name summary.json already
    metric_percentiles = read_metric_percentiles(run_dir)
    carried = read_other_keys(run_dir)  # a newer version's keys, or a user's: not dropped
    config = meta.get("config") or {}
    requests = _read_checked(run_dir / "requests.parquet", conform_requests, check_requests)
    steps = _read_checked(run_dir / "steps.parquet", conform_steps, check_steps)
    try:
        requests = with_latency_columns(requests)
        return write_summary(
            run_dir, requests, steps, meta,
            report_title=f"Replay of {Path(str(meta.get('trace', run_dir.name))).name}" if report else None,
            report_subtitle=f"{config.get('model', '')} on {config.get('device', config.get('gpu', ''))}; "
            f"cost model: {meta.get('cost_model', '')}",
            slos=slos,
            metric_percentiles=metric_percentiles,
            carried=carried,
        )
    except (ValueError, pl.exceptions.PolarsError) as exc:  # polars' messages span lines: the first says what
        raise ValueError(f"{run_dir}: {str(exc).strip().splitlines()[0]}") from None


def _read_checked(path: Path, conform, check) -> pl.DataFrame:
    """The table at ``path``, refused with its file, column and row if no run could have written it: metrics of
    a negative token count or a finish before the arrival would be written as if they were measured."""
    try:
        frame = read_parquet_frame(path)
        check(conform(frame))
    except (ValueError, pl.exceptions.PolarsError) as exc:  # polars' messages span lines: the first says what
        raise ValueError(f"{path}: {str(exc).strip().splitlines()[0]}") from None
    return frame


def check_before_rewriting(run_dir: Path) -> None:
    """What ``summarize_run_dir`` reads of a folder besides its tables (the folder, whether its files are of one run,
    and summary.json), checked for every folder before any is rewritten: a garbled summary.json in the last folder
    named left the folders before it rewritten, at exit 2."""
    check_is_folder(run_dir)
    mixed = mixed_run_problem(run_dir)  # as cheap (the tables' footers)
    if mixed:
        raise ValueError(mixed)
    read_meta(run_dir)
    read_slos(run_dir)
    read_metric_percentiles(run_dir)
    read_other_keys(run_dir)


def _error_line(exc: OSError) -> str:
    """A summary.json that is a FIFO or a device: its path and why, not "[Errno 17] ..."."""
    return f"error: {exc.filename}: {exc.strerror}\n" if exc.filename and exc.strerror else f"error: {exc}\n"


@exit_130_on_interrupt(EACH_FILE_WHOLE)
def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m analysis.summarize", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="+", help="replay output folder(s)")
    parser.add_argument("--report", action="store_true", help="also write report.html")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        for run_dir in args.run_dir:
            check_before_rewriting(Path(run_dir))
    except OSError as exc:
        parser.exit(2, _error_line(exc))
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    for run_dir in args.run_dir:
        try:
            summary = summarize_run_dir(Path(run_dir), report=args.report)
        except OSError as exc:
            parser.exit(2, _error_line(exc))
        except (ValueError, pl.exceptions.PolarsError) as exc:
            parser.exit(2, f"error: {exc}\n")
        if not args.quiet:
            print_out(f"{escape_controls(run_dir)}:\n{format_summary_table(summary)}")
    return 0


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
