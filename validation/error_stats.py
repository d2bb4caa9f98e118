"""One line per cost model: how far its simulations are from the GPU over many runs, from compare_all's results:
``python validation/error_stats.py LABEL=RESULTS_DIR[,RESULTS_DIR...] [...] [--exclude RUN[,RUN...]]``.

Each RESULTS_DIR is a ``validation/compare_all.py --results`` folder (one ``RUN/compare.json`` per GPU run, the
simulation against it); a label's folders are usually the same cost model against the runs of several machine
starts. Over the six latency figures (TTFT, TPOT and E2E p50 and p90) of every run, it prints the mean, median and
largest |sim - GPU| / GPU below saturation and at ~95 % load apart (issue 12 holds them to different targets), and
how many are within 3 % and within 10 %. Repeated GPU runs compared with each other (``*-vs-*``) are left out, as are
the runs ``--exclude`` names in a folder (``DIR:RUN``, or ``RUN`` for every folder): a calibration run the cost model
was fitted on is not a validation of it.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from engine.core.messages import shown  # noqa: E402
from sim.files import read_json_input  # noqa: E402
from validation.compare_all import NEAR_SATURATION, planned_run  # noqa: E402  the ~95 % runs of the plan
from validation.fidelity_summary import LATENCY_FIGURES as LATENCIES  # noqa: E402


def near_saturation(run: str) -> bool:
    """A planned ~95 % run or a repeat of one (its name plus a RUN_TAG suffix)."""
    return planned_run(run, NEAR_SATURATION) is not None


def run_errors(results: Path, excluded: set[str]) -> dict[str, list[float]]:
    """{run folder name: its latency figures' relative errors} of one compare_all results folder, less the runs
    ``excluded`` names (``RUN``, or ``RESOLVED_DIR:RUN``)."""
    out = {}
    for path in sorted(results.glob("*/compare.json")):
        run = path.parent.name
        if "-vs-" in run or run in excluded or f"{results.resolve()}:{run}" in excluded:
            continue
        # ValueError naming the file, for main to print as one line at exit 2: a damaged compare.json was a
        # traceback, and a missing figure an exit 1 (SystemExit with a message).
        try:
            metrics = {m["key"]: m.get("rel_error") for m in json.loads(read_json_input(path))["metrics"]}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not a compare.json of analysis.compare ({type(exc).__name__}: {exc})") from None
        missing = [k for k in LATENCIES if metrics.get(k) is None]
        if missing:
            raise ValueError(f"{path}: no relative error for {', '.join(missing)}")
        bad = [k for k in LATENCIES if not isinstance(metrics[k], (int, float)) or isinstance(metrics[k], bool)]
        if bad:
            raise ValueError(f"{path}: the relative error of {bad[0]} is {shown(metrics[bad[0]], 40)}; expected a "
                             "number")
        # json reads NaN and Infinity: the label's mean and largest error were "nan %" at exit 0.
        bad = [k for k in LATENCIES if not math.isfinite(metrics[k])]
        if bad:
            raise ValueError(f"{path}: the relative error of {bad[0]} is {metrics[bad[0]]}; expected a finite number")
        out[run] = [float(metrics[k]) for k in LATENCIES]
    return out


def stats(errors: list[float]) -> str:
    if not errors:
        return "no runs"
    sizes = [100 * abs(e) for e in errors]
    return (f"mean {statistics.mean(sizes):.1f} %, median {statistics.median(sizes):.1f} %, "
            f"largest {max(sizes):.1f} %, "
            f"within 3 %: {sum(s <= 3 for s in sizes)} of {len(sizes)}, within 10 %: {sum(s <= 10 for s in sizes)}")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="LABEL=RESULTS_DIR[,RESULTS_DIR...]")
    parser.add_argument("--exclude", default="", help="runs to leave out: RUN or RESULTS_DIR:RUN, comma-separated")
    args = parser.parse_args(argv)
    labels: list[tuple[str, list[Path]]] = []
    for spec in args.models:
        label, sep, dirs = spec.partition("=")
        if not sep or not dirs:
            parser.error(f"{spec!r}: expected LABEL=RESULTS_DIR[,RESULTS_DIR...]")
        if label in (given for given, _ in labels):  # two lines of one label: which cost model is which?
            parser.exit(2, f"error: {spec}: the label {label!r} is given twice; give each cost model its own\n")
        seen: set[Path] = set()
        for results in map(Path, dirs.split(",")):
            if results.resolve() in seen:  # its runs counted twice in the label's figures
                parser.exit(2, f"error: {spec}: {results} is given twice; give each folder once\n")
            seen.add(results.resolve())
            if not results.is_dir():
                parser.error(f"{results}: not a folder (expected a compare_all --results folder)")
            if not any(results.glob("*/compare.json")):  # a mistyped folder was "0 runs" at exit 0
                parser.error(f"{results}: no RUN/compare.json (expected a compare_all --results folder)")
        labels.append((label, list(map(Path, dirs.split(",")))))
    # Each --exclude names a run of a folder given, its RESULTS_DIR matched as a folder, not as text: a mistyped run,
    # or a folder spelled otherwise than in LABEL=RESULTS_DIR (with a trailing '/', or ./DIR), left the calibration
    # run in the figures without a word.
    given = {(folder.resolve(), path.parent.name) for _, folders in labels for folder in folders
             for path in folder.glob("*/compare.json")}
    excluded = set()
    for entry in filter(None, args.exclude.split(",")):
        where, sep, run = entry.rpartition(":")
        if sep and Path(where).resolve() not in {folder for folder, _ in given}:
            parser.exit(2, f"error: --exclude {entry}: {where} is none of the RESULTS_DIRs given; expected RUN or "
                           "RESULTS_DIR:RUN\n")
        if not any(name == run and (not sep or Path(where).resolve() == folder) for folder, name in given):
            parser.exit(2, f"error: --exclude {entry}: {where if sep else 'no RESULTS_DIR given'} holds no "
                           f"{run}/compare.json; expected a run to leave out\n")
        excluded.add(f"{Path(where).resolve()}:{run}" if sep else run)
    for label, folders in labels:
        below, near, runs = [], [], 0
        for results in folders:
            try:
                by_run = run_errors(results, excluded)
            except ValueError as exc:
                parser.exit(2, f"error: {exc}\n")
            for run, errors in by_run.items():
                runs += 1
                (near if near_saturation(run) else below).extend(errors)
        print(f"{label}: {runs} runs; below saturation {stats(below)}; ~95 % {stats(near)}")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
