"""Compare a real (GPU) replay with a simulated one: ``python -m analysis.compare REAL_DIR SIM_DIR``.

Both folders hold requests.parquet, steps.parquet and (optionally) summary.json
as written by `engine.replay` / `sim.replay`. Prints a per-metric table of
signed relative errors (sim - real) / real and writes compare.json, compare.md,
compare.parquet (per-request pairs) and report.html to --out. With --schedule
it also says whether the two runs scheduled the same batches step by step.
Exit codes: 0 done, 1 schedules differ under --require-identical-schedule,
2 unusable input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.compare.comparison import check_same_requests, compare_runs, name_positional_requests, write_outputs
from analysis.compare.inputs import CompareInputError, RunData, load_run
from analysis.compare.request_join import PER_REQUEST_METRICS, RequestJoin
from analysis.compare.tables import format_error_table, format_fixed_width, format_rel_error
from analysis.console import print_out
from analysis.formatting import LATENCY_LABELS, format_percent
from analysis.outdir import OutDirError, default_out_dir, folder_complete, out_folder, staged_out_dir
from engine.core.config_args import OneLineErrorParser
from engine.core.interrupt import exit_130_on_interrupt, outputs_in_place
from engine.core.messages import escape_controls
from traces.files import is_link_loop

EXIT_OK, EXIT_SCHEDULE_DIFFERS, EXIT_BAD_INPUT = 0, 1, 2


def format_request_summary(join: RequestJoin) -> str:
    """Match counts and per-request error percentiles as text lines."""
    header = (
        f"requests matched on request_id: {join.num_matched} of {join.num_real} real "
        f"({format_percent(join.matched_share_real)}), {join.num_matched} of {join.num_sim} sim "
        f"({format_percent(join.matched_share_sim)}){join.left_out_note}"
    )
    cells = [("per-request rel. error", "p10", "p50", "p90", "mean |err|", "pairs")]
    stats = join.error_stats()
    for key in PER_REQUEST_METRICS:
        entry = stats[key]
        cells.append((f"  {LATENCY_LABELS[key]}", *(format_rel_error(entry[name]) for name in ("p10", "p50", "p90")),
                      format_percent(entry["mean_abs"], ".2f", missing="n/a"), str(entry["num_pairs"])))
    return header + "\n" + format_fixed_width(cells)


def format_config_differences(differences: dict[str, dict]) -> str:
    """One line listing differing config keys, or "" when the configs agree."""
    if not differences:
        return ""
    items = ", ".join(f"{escape_controls(key)} real={values['real']!r} sim={values['sim']!r}"
                      for key, values in differences.items())
    return f"config differences: {items}"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m analysis.compare",
        description="Compare a real replay with a simulated one: per-metric signed relative errors "
        "(sim - real) / real, per-request pairs, an overlay HTML report and an optional "
        "step-by-step schedule check.",
        epilog="exit codes: 0 done; 1 schedules differ (with --require-identical-schedule); 2 unusable input",
    )
    parser.add_argument("real_dir", metavar="REAL_DIR", help="folder of the real (GPU) replay: requests.parquet, "
                        "steps.parquet and, for context only, summary.json; or a `vllm bench serve --save-result "
                        "--save-detailed` result .json")
    parser.add_argument("sim_dir", metavar="SIM_DIR", help="folder of the simulated replay (same layout)")
    parser.add_argument("--out", type=out_folder, metavar="DIR", default=None,
                        help="output folder for compare.json/.md/.parquet and report.html "
                        "(default: a new folder under runs/)")
    parser.add_argument("--schedule", action="store_true",
                        help="print whether both runs scheduled the same batches step by step "
                        "(or the first differing step)")
    parser.add_argument("--require-identical-schedule", action="store_true",
                        help="like --schedule, and exit with code 1 if the schedules differ")
    parser.add_argument("--allow-different-requests", action="store_true",
                        help="compare runs whose requests differ (other traces, or other --limit); per request "
                        "only the ids they share with the same prompt length (the others are other requests)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists and is not empty")
    parser.add_argument("--no-report", action="store_true", help="skip report.html")
    return parser


def check_order(real: RunData, sim: RunData) -> None:
    """Refuse a simulated REAL_DIR beside a measured SIM_DIR: swapped, every error had the wrong sign and the wrong
    denominator, and the comparison exited 0. Two simulations, two measured runs, or a run whose summary.json
    does not say what it is (a hand-made folder) stay allowed."""
    if real.simulated is True and sim.simulated is False:
        raise CompareInputError(f"{real.path} is a simulated run (cost model {real.cost_model!r}) and {sim.path} a "
                                f"measured one ({sim.cost_model!r}); the order is REAL_DIR then SIM_DIR: "
                                f"python -m analysis.compare {sim.path} {real.path}")


def load_and_compare(args: argparse.Namespace, inputs: list[Path]):
    """The two runs read, checked and compared: (comparison, real, sim); CompareInputError names what is wrong."""
    if inputs[0].resolve() == inputs[1].resolve():  # every error 0 %: a comparison that says nothing
        raise CompareInputError(f"REAL_DIR and SIM_DIR are the same run ({args.real_dir}); compare two runs")
    real = load_run(args.real_dir, "real")
    sim = load_run(args.sim_dir, "sim")
    check_order(real, sim)
    real, sim = name_positional_requests(real, sim)
    if not args.allow_different_requests:
        check_same_requests(real, sim)
    comparison = compare_runs(real, sim)
    if args.require_identical_schedule and comparison.schedule.unavailable:
        raise CompareInputError(f"--require-identical-schedule: {comparison.schedule.describe()}")
    return comparison, real, sim


def print_comparison(comparison, real, sim, check_schedule: bool) -> None:
    """The comparison as text on stdout (print_out: a reader that leaves early stops nothing)."""
    cost_model = f" (cost model: {escape_controls(sim.cost_model)})" if sim.cost_model else ""
    print_out(f"sim {escape_controls(sim.path)}{cost_model} vs real {escape_controls(real.path)}; "
              "rel. error = (sim - real) / real")
    differences = format_config_differences(comparison.config_differences)
    if differences:
        print_out(differences)
    for note in comparison.engine_notes:
        print_out(f"note: {note}")
    print_out(format_error_table(comparison.rows))
    judged = [row for row in comparison.rows if row.in_band is not None]
    if judged:
        num_inside = sum(row.in_band for row in judged)
        print_out(f"real inside the simulation's p5-p95 band: {num_inside} of {len(judged)} metrics")
    for warning in sim.metadata.get("warnings") or []:  # the simulation's own limits (sim.limits)
        print_out(escape_controls(f"sim warning [{warning.get('code')}]: {warning.get('message')}"))
    print_out(format_request_summary(comparison.join))
    if check_schedule or comparison.schedule.unavailable:
        print_out(comparison.schedule.describe())


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for given in (args.real_dir, args.sim_dir, args.out):  # Path.resolve raised a RuntimeError traceback on a loop
        if given is not None and is_link_loop(given):
            parser.exit(EXIT_BAD_INPUT, f"error: {escape_controls(given)}: a symbolic link loop; expected a folder\n")
    both_names = f"{Path(args.real_dir).resolve().name}-vs-{Path(args.sim_dir).resolve().name}"
    out_dir = Path(args.out) if args.out else default_out_dir("compare", both_names)
    inputs = [Path(args.real_dir), Path(args.sim_dir)]
    try:
        # Staged before any work: an --out that cannot be written (/proc/x) failed only after the whole table was
        # printed, as if the comparison had been saved. A bad input below removes the staging folder again.
        with staged_out_dir(out_dir, overwrite=args.overwrite, inputs=inputs) as stage:
            try:
                comparison, real, sim = load_and_compare(args, inputs)
            except CompareInputError as exc:
                parser.exit(EXIT_BAD_INPUT, f"error: {exc}\n")
            write_outputs(comparison, stage, report=not args.no_report)
    except OutDirError as exc:
        parser.exit(EXIT_BAD_INPUT, f"error: {exc}\n")
    except OSError as exc:
        parser.exit(EXIT_BAD_INPUT, f"error: cannot write to {out_dir}: {exc.strerror or exc}\n")
    # Printed once the outputs are in place: a reader that stops early (| head) can no longer cost them.
    with outputs_in_place(folder_complete(out_dir)):  # a Ctrl-C now says they are whole
        print_comparison(comparison, real, sim, check_schedule=args.schedule or args.require_identical_schedule)
        print_out(f"outputs in {escape_controls(out_dir)}/")  # a newline in --out: one line
    if args.require_identical_schedule and not comparison.schedule.identical:
        return EXIT_SCHEDULE_DIFFERS
    return EXIT_OK
