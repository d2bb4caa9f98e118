"""Do the GPU runs fall inside the simulator's prediction bands? CPU only, from the committed GPU summaries.

    python validation/band_check.py [--bands 20] [--gpu h200] [--results DIR] [--out validation/results/bands]

Each run of ``validation/compare_all.py``'s plan whose GPU summary is committed
(``validation/results/<run>/real_summary.json``) is simulated with the same options, the GPU's KV block count,
``--gpu`` (the profile of the GPU the runs were made on, as compare_all takes it) and ``--bands N``; the table
gives, per headline figure, the GPU's value, the unperturbed simulation's, the band (p5 / median / p95 over the N
seeded replays) and whether the GPU's value lies inside it, for the run and for each of its repeats
(``<run>-b/real_summary.json``, ...) against the same band.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.config_args import OneLineErrorParser, nonempty  # noqa: E402
from engine.core.messages import shown  # noqa: E402
from sim.files import read_json_input  # noqa: E402
from validation.compare_all import HEADLINE, PLAN, TRACES  # noqa: E402


def _value(summary: dict, key: str) -> float | None:
    metric, _, stat = key.partition(".")
    value = summary.get(metric)
    return value.get(stat) if stat and isinstance(value, dict) else value


def _gpu_runs(results: Path, name: str) -> list[str]:
    """The folders of ``results`` holding a GPU summary of planned run ``name``: the run, then its repeats
    (``<name>-b``, ...; not the ``-vs-`` folders that compare two of them)."""
    runs = [name] if (results / name / "real_summary.json").is_file() else []
    # Any RUN_TAG, as compare_all reads them (no planned name extends another with a "-").
    repeats = sorted(p.name for p in results.glob(f"{name}-*")
                     if "-vs-" not in p.name and (p / "real_summary.json").is_file())
    return runs + repeats


def _read_summary(path: Path) -> dict:
    """A committed GPU summary with what the table reads of it; ValueError naming the file otherwise (a damaged one
    was a JSONDecodeError, KeyError or TypeError traceback, after the simulations of the runs before it)."""
    try:
        summary = json.loads(read_json_input(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable summary.json ({exc})") from None
    config = summary.get("config") if isinstance(summary, dict) else None
    blocks = config.get("num_gpu_blocks") if isinstance(config, dict) else None
    if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 1:
        raise ValueError(f"{path}: config.num_gpu_blocks is {blocks!r}; expected an integer >= 1 (a GPU run's "
                         "summary.json, as compare_all copies it)")
    for key in HEADLINE:
        value = _value(summary, key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{path}: {key} is {shown(value, 40)}; expected a number (a GPU run's summary.json)")
        if not math.isfinite(value):  # json reads NaN: bands.json then held NaN (not JSON) and "nan" rows, at exit 0
            raise ValueError(f"{path}: {key} is {value}; expected a finite number (a GPU run's summary.json)")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bands", default="20", help="seeded replays per run (default: %(default)s)")
    # nonempty: "" was Path(""), the current folder, where bands.md and bands.json were written.
    parser.add_argument("--out", type=nonempty, default=str(ROOT / "validation" / "results" / "bands"),
                        help="where bands.md and bands.json go")
    parser.add_argument("--results", type=nonempty, default=str(ROOT / "validation" / "results"),
                        help="folder of the runs' committed GPU summaries (<run>/real_summary.json)")
    from sim.hardware import GPUS

    parser.add_argument("--gpu", default="h200", choices=sorted(GPUS), type=str.lower,
                        help="the GPU the runs were made on, passed to sim.replay (default: %(default)s)")
    args = parser.parse_args(argv)
    from analysis.band_stats import flat_bands, inside
    from cli.sim_replay import main as sim_replay
    from sim.files import check_output_path, write_text_atomic

    if not any(_gpu_runs(Path(args.results), name) for name in PLAN):
        # Nothing to check: going on replaced the committed bands.md with an empty table at exit 0.
        parser.exit(2, f"error: --results {args.results}: no <run>/real_summary.json of the plan; nothing written\n")
    # Every GPU summary read, and the outputs' place checked, before the first simulation: a damaged summary or an
    # --out that is a file was a traceback after the simulations before it.
    paths = [Path(args.results) / run / "real_summary.json" for name in PLAN for run in _gpu_runs(Path(args.results),
                                                                                                 name)]
    try:
        summaries = {path.parent.name: _read_summary(path) for path in paths}
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    problem = next(filter(None, (check_output_path(Path(args.out) / name, "--out", paths)
                                 for name in ("bands.md", "bands.json"))), None)
    if problem:
        parser.exit(2, f"error: {problem}\n")
    lines = ["| run | figure | GPU | sim | band p5 | band median | band p95 | GPU inside |",
             "|:---|:---|---:|---:|---:|---:|---:|:---:|"]
    totals = []
    rows = []  # the table's figures, for bands.json (validation/fidelity_summary.py reads them)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (description, trace, options) in PLAN.items():
            runs = _gpu_runs(Path(args.results), name)
            if not runs:
                continue
            first = summaries[runs[0]]
            out = Path(tmp) / name
            # One band per configuration: every GPU run of it (the repeats too) is checked against the same band.
            sim_replay([str(TRACES / trace), *options, "--num-gpu-blocks", str(first["config"]["num_gpu_blocks"]),
                        "--gpu", args.gpu, "--bands", args.bands, "--out", str(out), "--quiet", "--no-report"])
            sim = json.loads((out / "summary.json").read_text())
            bands = flat_bands(sim)
            codes = ", ".join(w["code"] for w in sim["warnings"]) or "none"
            for run in runs:
                real = summaries[run]
                label = description + (f", repeat {run[len(name) + 1:]}" if run != name else "")
                num_inside = 0
                for key in HEADLINE:
                    band, gpu = bands[key], _value(real, key)
                    ok = inside(band, gpu)
                    num_inside += bool(ok)
                    lines.append(f"| {label} | {key} | {gpu:.4g} | {_value(sim, key):.4g} | {band['p5']:.4g} | "
                                 f"{band['median']:.4g} | {band['p95']:.4g} | {'yes' if ok else 'no'} |")
                    rows.append({"config": name, "run": run, "figure": key, "gpu": gpu, "sim": _value(sim, key),
                                 "p5": band["p5"], "median": band["median"], "p95": band["p95"], "inside": ok})
                totals.append(f"- {label}: {num_inside} of {len(HEADLINE)} GPU figures inside; warnings: {codes}")
                print(totals[-1], flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = (f"GPU figures against the simulator's p5-p95 bands ({args.bands} seeded replays each; "
            f"`python validation/band_check.py --bands {args.bands}"
            + (f" --gpu {args.gpu}" if args.gpu != "h200" else "")
            + (f" --results {args.results}" if Path(args.results) != ROOT / "validation" / "results" else "")
            + "`).\n\n" + "\n".join(totals) + "\n\n"
            + "\n".join(lines) + "\n")
    write_text_atomic(out_dir / "bands.md", text)
    write_text_atomic(out_dir / "bands.json", json.dumps({"bands": args.bands, "gpu": args.gpu,
                                                    "results": str(args.results), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
