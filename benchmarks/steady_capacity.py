"""Steady-state capacity of the default trace: ``python benchmarks/steady_capacity.py --json OUT``.

Answers three questions about ``python -m analysis.capacity traces/sharegpt.parquet
--slo ttft_p90=2s,tpot_p90=100ms --replicas 1,2`` (qwen3-0.6b on an H200, round-robin):

1. ``default``: what the default options answer (max QPS per replica count, the 2/1-replica ratio,
   the kind of each answer, simulations, CPU seconds), over ``--seeds`` independent streams.
2. ``durations``: the same search with ``--min-duration-s T --min-requests 0`` for each T of
   ``--durations`` (``--duration-seeds`` streams): how the answer moves with the simulated duration.
3. ``reference``: the converged long-stream value: a search bracketed at +-``--reference-span`` around
   the default answer on streams of ``--reference-duration`` seconds, to ``--reference-tolerance``.

Targets (issue 15): the default answer within 5 % of the reference, and the 2/1-replica ratio in
[1.8, 2.1]. Prints one line per run and writes every figure to ``--json``.
CPU seconds include the worker processes (they are children of this one); on a shared machine
compare CPU seconds, not wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from engine.core.json_errors import json_type_name  # noqa: E402
from engine.core.messages import shown  # noqa: E402

TRACE = str(REPO / "traces" / "sharegpt.parquet")
TRACE_NAME = "traces/sharegpt.parquet"  # as the figures name it
SLO = "ttft_p90=2s,tpot_p90=100ms"
TARGET_ERROR = 0.05
TARGET_RATIO = (1.8, 2.1)


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_capacity_argv(argv: list[str]) -> dict:
    """Run one capacity sweep in-process; its answers and costs."""
    from analysis.capacity.cli import build_parser
    from analysis.capacity.plan import run_capacity

    parser = build_parser()
    cpu_before, wall_before = _cpu_s(), time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        run = run_capacity(parser.parse_args([TRACE, "--slo", SLO, "--quiet", "--out", out] + argv), parser)
    figures = {
        "argv": argv,
        "cpu_s": round(_cpu_s() - cpu_before, 1),
        "wall_s": round(time.perf_counter() - wall_before, 1),
        "num_jobs": run.num_jobs,
        "configs": {},
    }
    for result in run.results:
        point = result.point_at_max
        figures["configs"][str(result.config.num_replicas)] = {
            "max_qps": result.max_qps,
            "kind": result.kind,
            "max_qps_by_seed": result.max_qps_by_seed,
            "spread": result.spread,
            "num_simulations": result.num_simulations,
            "notes": list(result.all_notes),
            "slo_values_ms": point.slo_values_ms if point else None,
            "stability": point.stability if point else None,
            "searches": {s.seed: {"verdicts": [list(v) for v in s.outcome.points],
                                  "duration_checks": [[c.qps, c.feasible, c.slo_values_ms] for c in s.checks]}
                         for s in result.searches},
        }
    one, two = (figures["configs"].get(k, {}).get("max_qps") for k in ("1", "2"))
    figures["ratio_2_to_1"] = round(two / one, 3) if one and two else None
    return figures


def _line(name: str, figures: dict) -> str:
    answers = ", ".join(f"{replicas} replica(s): {c['max_qps']} ({c['kind']}, seeds {c['spread'] or '-'}, "
                        f"{c['num_simulations']} sims)" for replicas, c in figures["configs"].items())
    return (f"{name}: {answers}; ratio {figures['ratio_2_to_1']}; {figures['cpu_s']} CPU s, {figures['wall_s']} s "
            f"wall on {figures['num_jobs']} process(es)")


def _centres(text: str, span: float) -> dict[str, float]:
    """--reference-centres REPLICAS=QPS,...: each bracket's centre by replica count (ValueError naming the item);
    the bracket's ends, as the reference search is given them, must be rates the sweep accepts."""
    from analysis.capacity.cli import positive_int, rate

    centres: dict[str, float] = {}
    for item in text.split(","):
        replicas, _, qps = item.partition("=")
        try:
            count, centre = positive_int(replicas.strip()), rate(qps.strip())
            for end in _reference_bracket(centre, span):
                rate(end)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"{item.strip()!r}: {exc}; expected REPLICAS=QPS, a replica count >= 1 and a rate whose "
                             "bracket is a finite number of requests/s > 0") from None
        if str(count) in centres:
            raise ValueError(f"{item.strip()!r}: {count} replica(s) given twice")
        centres[str(count)] = centre
    return centres


def _reference_bracket(centre: float, span: float) -> tuple[str, str]:
    """--qps-min and --qps-max of the reference search around ``centre``, as passed to the sweep."""
    return f"{centre * (1 - span):.4g}", f"{centre * (1 + span):.4g}"


def _load_figures(parser: argparse.ArgumentParser, path: str) -> dict:
    """The figures an earlier run wrote to --json, to keep and reuse; exit 2 naming the file if they are not that."""
    from sim.files import read_json_input

    try:
        figures = json.loads(read_json_input(Path(path)))
    except OSError as exc:
        parser.exit(2, f"error: --json {path}: cannot read it ({exc.strerror or exc}); expected this script's "
                       "figures\n")
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        parser.exit(2, f"error: --json {path}: not valid JSON ({exc}); expected this script's figures or a new "
                       "file\n")
    if not isinstance(figures, dict):
        parser.exit(2, f"error: --json {path}: top level is a JSON {json_type_name(figures)}; expected an object\n")
    for part in ("default", "durations", "reference"):
        if part in figures and not isinstance(figures[part], dict):
            parser.exit(2, f"error: --json {path}: {part!r} is a JSON {json_type_name(figures[part])}; expected an "
                           "object, as this script writes\n")
    configs = figures.get("default", {}).get("configs", {})
    if not isinstance(configs, dict) or not all(isinstance(c, dict) for c in configs.values()):
        parser.exit(2, f"error: --json {path}: 'default.configs' is not an object of objects; expected this script's "
                       "figures\n")
    # Every file this script writes names its trace and SLO: another script's figures (capacity_speed's, sim_speed's)
    # were kept, this script's parts merged among them and the file rewritten so, at exit 0.
    if figures and (figures.get("trace"), figures.get("slo")) != (TRACE_NAME, SLO):
        parser.exit(2, f"error: --json {path}: holds no \"trace\": \"{TRACE_NAME}\" and \"slo\": \"{SLO}\" (its keys: "
                       f"{shown(', '.join(figures), 60)}); expected this script's figures or a new file\n")
    return figures


def main(argv: list[str] | None = None) -> int:
    from analysis.capacity.bisection import MIN_TOLERANCE
    from analysis.capacity.cli import non_negative_float, non_negative_int, positive_int, seed_count
    from sim.files import check_output_path, write_text_atomic

    # Every option is checked here, before the first search: each used to be refused (or to fail) only when its
    # part ran, after minutes of simulation, by the sweep's own parser or as a traceback.
    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=seed_count, default=3, help="streams per configuration (default: %(default)s)")
    parser.add_argument("--seed-offset", type=non_negative_int, default=0, help="the first seed (default: %(default)s)")
    parser.add_argument("--jobs", type=positive_int, default=None, help="local processes (default: the cores)")
    parser.add_argument("--durations", default="60,120,240",
                        help="comma list of --min-duration-s for the duration study ('' skips it)")
    parser.add_argument("--reference-duration", type=non_negative_float, default=1200.0,
                        help="seconds of stream for the reference search (0 skips it) (default: %(default)s)")
    parser.add_argument("--reference-span", type=float, default=0.08,
                        help="the reference bracket: the default answer +- this share (default: %(default)s)")
    parser.add_argument("--reference-tolerance", type=float, default=0.01, help="(default: %(default)s)")
    parser.add_argument("--reference-centres", default=None,
                        help="REPLICAS=QPS,... to bracket the reference around instead of the default answers "
                        "(e.g. 1=34.4,2=68.8, to run the reference beside the default part)")
    parser.add_argument("--duration-seeds", type=seed_count, default=1,
                        help="streams per configuration in the duration study (default: %(default)s)")
    parser.add_argument("--json", default=None, metavar="OUT",
                        help="write every figure to this JSON file (figures already in it are kept and reused: "
                        "rerunning with --parts reference after a crash or on another day reuses 'default')")
    parser.add_argument("--parts", default="default,durations,reference",
                        help="comma list of default, durations, reference (default: %(default)s)")
    args = parser.parse_args(argv)
    parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    # Checked before the first search: a typo used to run nothing (exit 0) or fail after minutes of simulation.
    if not parts or parts - {"default", "durations", "reference"}:
        parser.exit(2, f"error: --parts {args.parts!r}: expected a comma list of default, durations, reference\n")
    try:
        durations = [float(d) for d in args.durations.split(",") if d.strip()]
    except ValueError:
        durations = []
    if (not durations and args.durations.strip()) or not all(0 < d < float("inf") for d in durations):
        parser.exit(2, f"error: --durations {args.durations!r}: expected a comma list of seconds > 0\n")
    # The bracket's ends are written with 4 significant digits: a narrower span than 0.001 could round them together.
    if not 0.001 <= args.reference_span < 1:
        parser.exit(2, f"error: --reference-span must be a share from 0.001 to below 1, got {args.reference_span}\n")
    if not MIN_TOLERANCE <= args.reference_tolerance < 1:  # nan fails this too
        parser.exit(2, f"error: --reference-tolerance must be from {MIN_TOLERANCE} to below 1, got "
                       f"{args.reference_tolerance}\n")
    centres = None
    if args.reference_centres is not None:
        try:
            centres = _centres(args.reference_centres, args.reference_span)
        except ValueError as exc:
            parser.exit(2, f"error: --reference-centres {exc}\n")
    problem = args.json is not None and check_output_path(args.json, "--json", [Path(TRACE)])
    if problem:
        parser.exit(2, f"error: {problem}\n")
    figures: dict = {}
    if args.json is not None and Path(args.json).exists():
        figures = _load_figures(parser, args.json)
    run_reference = "reference" in parts and args.reference_duration > 0
    if run_reference and centres is None and "default" not in parts and not figures.get("default", {}).get("configs"):
        parser.exit(2, "error: --parts reference without default has nothing to bracket: add default to --parts, "
                       "give --reference-centres, or a --json holding a 'default' part\n")
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    common = ["--replicas", "1,2"] + jobs
    figures.update({"trace": TRACE_NAME, "slo": SLO, "python": platform.python_version(),
                    "cpu_count": os.cpu_count()})

    def save() -> None:
        if args.json is not None:  # whole or not at all (the figures of the parts before kept), its folder made
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(args.json), json.dumps(figures, indent=2) + "\n")

    if "default" in parts:
        figures["default"] = run_capacity_argv(common + ["--seeds", str(args.seeds), "--seed-offset",
                                                         str(args.seed_offset)])
        print(_line("default options", figures["default"]), flush=True)
        save()
    if "durations" in parts and durations:  # --durations '' skips the study
        figures.setdefault("durations", {})
        for duration in [d for d in args.durations.split(",") if d.strip()]:
            run = run_capacity_argv(common + ["--seeds", str(args.duration_seeds), "--min-duration-s", duration,
                                              "--min-requests", "0"])
            figures["durations"][duration] = run
            print(_line(f"--min-duration-s {duration} --min-requests 0", run), flush=True)
            save()
    if run_reference:
        figures["reference"] = {}
        if centres is None:
            defaults = figures.get("default", {}).get("configs", {})
            centres = {replicas: answer.get("max_qps") for replicas, answer in defaults.items()}
        for replicas, centre in centres.items():
            if not isinstance(centre, int | float) or not centre > 0:  # no rate met the SLO: nothing to bracket
                print(f"reference for {replicas} replica(s) skipped: the default answer is {centre}", flush=True)
                continue
            qps_min, qps_max = _reference_bracket(centre, args.reference_span)
            run = run_capacity_argv([
                "--replicas", replicas, "--seeds", "1", "--min-duration-s", str(args.reference_duration),
                "--qps-min", qps_min, "--qps-max", qps_max,
                "--tolerance", str(args.reference_tolerance), "--no-duration-check",
                # The reference is the long-stream value: never shortened by the default --max-requests (100,000,
                # which 1,200 s streams pass above ~83 req/s).
                "--max-requests", "10000000",
            ] + jobs)
            figures["reference"][replicas] = run
            print(_line(f"reference ({args.reference_duration:g} s streams)", run), flush=True)
            save()
    if "default" in figures and "reference" in figures:
        errors = {}
        for replicas, answer in figures["default"]["configs"].items():
            reference = figures["reference"].get(replicas, {}).get("configs", {}).get(replicas, {}).get("max_qps")
            errors[replicas] = round(answer["max_qps"] / reference - 1, 4) if reference and answer["max_qps"] else None
        figures["error_vs_reference"] = errors
        within = all(e is not None and abs(e) <= TARGET_ERROR for e in errors.values())
        print(f"default vs reference: {errors} (target within {TARGET_ERROR:.0%}: {'PASS' if within else 'FAIL'})")
    ratio = figures.get("default", {}).get("ratio_2_to_1")
    in_range = ratio is not None and TARGET_RATIO[0] <= ratio <= TARGET_RATIO[1]
    print(f"2/1-replica ratio {ratio} (target {TARGET_RATIO[0]}-{TARGET_RATIO[1]}: {'PASS' if in_range else 'FAIL'})")
    save()
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    raise SystemExit(one_line_script_errors(main)())
