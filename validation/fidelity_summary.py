"""How far the shipped profile's predictions are from the GPU, over every committed GPU run:
``python validation/fidelity_summary.py RESULTS_DIR/bands/bands.json [...] [--out FILE.md]``, or
``python validation/fidelity_summary.py --results RESULTS_DIR [--results ...] [--out FILE.md]``.

Reads the ``bands.json`` that ``validation/band_check.py`` writes beside ``bands.md`` (one per folder of GPU runs,
each folder a machine session), and sums up, per load class (light, ~70 %, ~90-95 %, KV pressure) and headline
figure, the signed error of the simulation against each GPU run, (sim - GPU) / GPU: its median, its largest size, how
many runs are within 3 % and within 10 %, and how many GPU figures fall inside the simulator's p5-p95 band. A serving
engineer reads it as: on a machine of this kind, a prediction of this figure at this load is usually this close.
A second table gives the same per trace shape (and model) and load, over the latency figures together.

``--results`` reads ``validation/compare_all.py --results`` folders instead (``RUN/compare.json`` per GPU run, a
repeat's ``RUN-vs-FIRST/compare.json`` against the configuration's first run): the first table is then per trace
shape, load, GPU and figure, and adds how many runs are within max(3 %, the GPU spread of that configuration's
repeats in that folder), issue 12's target below saturation (3 % where the configuration was run once).
"""

from __future__ import annotations

import json
import math
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.formatting import markdown_cell, markdown_code  # noqa: E402
from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import read_json_input  # noqa: E402
from validation.compare_all import HEADLINE, planned_run  # noqa: E402  HEADLINE: the figures, in every table's order

CLASSES = (("light", ("-light",)), ("~70 %", ("-p70", "c-mooncake")), ("~90-95 %", ("-p90", "-p95")),
           ("KV pressure", ("-kv",)), ("offline", ("a-bench",)),
           # A calibration slice replayed at its own rate (compare_all's cal-*): another machine start's, held out.
           ("calibration rate", ("cal-",)))


# The trace (and model) of a planned run, by its name's prefix (validation/compare_all.py's PLAN): loads of one shape
# are read together, since the error depends on the shape (decode-heavy is priced long where the others are not).
SHAPES = (("qwen3-8b, Azure conversation", ("g-azure-8b",)), ("conversation (Azure)", ("b-azure", "d-azure")),
          ("long context, prefix reuse (Mooncake)", ("c-mooncake", "d-mooncake")),
          ("prefill-heavy", ("e-prefill",)), ("decode-heavy, bursty", ("f-decode",)), ("offline batch", ("a-bench",)),
          ("long context, held out", ("h-longctx", "i-longctx")),
          ("long outputs, bursty, held out", ("h-longout", "i-longout")), ("ShareGPT", ("h-sharegpt",)),
          ("Azure calibration slice", ("cal-azure",)), ("Mooncake calibration slice", ("cal-mooncake",)))
# The latency figures of HEADLINE (throughput is within 1-2 % on every run: it would only dilute the median).
LATENCY_FIGURES = tuple(f for f in HEADLINE if f != "output_throughput")


def shape_class(config: str) -> str:
    for name, prefixes in SHAPES:
        if config.startswith(prefixes):
            return name
    return "other"


def _error(row: dict) -> float | None:
    """(sim - GPU) / GPU of one bands.json row; None where either side is missing or the GPU figure is 0."""
    return None if not row["gpu"] or row["sim"] is None else (row["sim"] - row["gpu"]) / row["gpu"]


def _error_stats(errors: list[float]) -> dict:
    return {"median_error": statistics.median(errors), "largest_error": max(errors, key=abs),
            "within_3pct": sum(abs(e) <= 0.03 for e in errors), "within_10pct": sum(abs(e) <= 0.10 for e in errors)}


def summarize_shapes(rows: list[dict]) -> list[dict]:
    """One entry per (trace shape, load class): over its GPU runs' latency figures, the median and largest signed
    error and how many are within 3 % and 10 %."""
    groups: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row["figure"] in LATENCY_FIGURES and (error := _error(row)) is not None:
            groups.setdefault((shape_class(row["config"]), load_class(row["config"])), []).append(error)
    return [{"shape": shape, "load": load, "num_figures": len(errors), **_error_stats(errors)}
            for (shape, load), errors in sorted(groups.items(), key=lambda g: _shape_load_rank(*g[0]))]


def _shape_load_rank(shape: str, load: str) -> tuple[int, int]:
    """Shapes as SHAPES lists them, loads as CLASSES does ("other" after each)."""
    shapes, loads = [n for n, _ in SHAPES] + ["other"], [n for n, _ in CLASSES] + ["other"]
    return shapes.index(shape), loads.index(load)


def load_class(config: str) -> str:
    for name, marks in CLASSES:
        if any(mark in config for mark in marks):
            return name
    return "other"


def _rank(load: str, figure: str, order: list[str]) -> tuple:
    """Loads as CLASSES lists them, figures as compare_all's HEADLINE does (any other after them)."""
    return order.index(load), HEADLINE.index(figure) if figure in HEADLINE else len(HEADLINE), figure


def summarize(rows: list[dict]) -> list[dict]:
    """One entry per (load class, figure): the errors of every GPU run of that class."""
    groups: dict[tuple[str, str], list[dict]] = {}
    order = [name for name, _ in CLASSES] + ["other"]
    for row in rows:
        if _error(row) is not None:
            groups.setdefault((load_class(row["config"]), row["figure"]), []).append(row)
    return [{"load": cls, "figure": figure, "num_runs": len(members), **_error_stats([_error(r) for r in members]),
             "inside_band": sum(bool(r["inside"]) for r in members)}
            for (cls, figure), members in sorted(groups.items(), key=lambda group: _rank(*group[0], order))]


def shapes_markdown(shapes: list[dict]) -> str:
    figures = ", ".join(LATENCY_FIGURES)
    lines = ["", f"By trace shape and load, over the latency figures ({figures}) of its GPU runs:",
             "", "| trace | load | figures | median error | largest error | within 3 % | within 10 % |",
             "|:---|:---|---:|---:|---:|---:|---:|"]
    for s in shapes:
        n = s["num_figures"]
        lines.append(f"| {s['shape']} | {s['load']} | {n} | {100 * s['median_error']:+.1f}% | "
                     f"{100 * s['largest_error']:+.1f}% | {s['within_3pct']} of {n} | {s['within_10pct']} of {n} |")
    return "\n".join(lines) + "\n"


def to_markdown(summary: list[dict], sources: list[str]) -> str:
    lines = ["Signed error of the simulation (shipped profile) against each GPU run, (sim - GPU) / GPU, per load and "
             "figure, over " + ", ".join(map(markdown_code, sources)) + " (`python validation/fidelity_summary.py`).",
             "",
             "| load | figure | GPU runs | median error | largest error | within 3 % | within 10 % | inside p5-p95 |",
             "|:---|:---|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        n = s["num_runs"]
        lines.append(f"| {s['load']} | {markdown_cell(s['figure'])} | {n} | {100 * s['median_error']:+.1f}% | "
                     f"{100 * s['largest_error']:+.1f}% | {s['within_3pct']} of {n} | {s['within_10pct']} of {n} | "
                     f"{s['inside_band']} of {n} |")
    inside, total = sum(s["inside_band"] for s in summary), sum(s["num_runs"] for s in summary)
    lines += ["", f"In all, {inside} of {total} GPU figures lie inside the simulator's p5-p95 band."]
    return "\n".join(lines) + "\n"


def _checked_rows(rows: list) -> list[dict]:
    """bands.json's rows, each with the fields the tables read (ValueError naming the first that lacks one): a row
    without its GPU figure, or with a string for it, was a KeyError or TypeError traceback, and a NaN or infinite
    one (json reads them) printed "+nan%" and a median over it at exit 0."""
    for i, row in enumerate(rows):
        ok = (isinstance(row, dict) and isinstance(row.get("config"), str) and isinstance(row.get("figure"), str)
              and all(isinstance(row.get(k, ""), (int, float, type(None))) and not isinstance(row.get(k), bool)
                      and math.isfinite(row[k] if row[k] is not None else 0) for k in ("gpu", "sim"))
              and isinstance(row.get("inside", ""), (bool, type(None))))
        if not ok:
            raise ValueError(f"rows[{i}] is {json.dumps(row)[:80]}; expected config and figure (text), gpu and sim "
                             "(finite numbers or null) and inside (true, false or null)")
    return rows


def _read_compare(path: Path) -> dict:
    """A compare.json of analysis.compare: {"metrics": by key, "device": the GPU run's, "cost_model": the simulation's};
    ValueError naming the file where it is not one or lacks a headline figure."""
    try:
        comparison = json.loads(read_json_input(path))
        metrics = {m["key"]: m for m in comparison["metrics"]}
        device, cost_model = comparison["real"]["config"].get("device"), comparison["sim"].get("cost_model")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a compare.json of analysis.compare ({type(exc).__name__}: {exc})") from None
    missing = [key for key in HEADLINE if key not in metrics]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)}; expected every headline figure of compare_all's")
    return {"metrics": metrics, "device": str(device or "unknown"), "cost_model": str(cost_model or "unknown")}


def _figure_rows(path: Path, run: str, config: str) -> tuple[list[dict], dict]:
    """One bands.json-like row per headline figure of a compare.json (the GPU's value, the simulation's, whether the
    GPU's lies inside the recorded p5-p95 band), checked as bands.json's rows are; and the file as read."""
    comparison = _read_compare(path)
    rows = [{"config": config, "run": run, "figure": key, "gpu": comparison["metrics"][key].get("real"),
             "sim": comparison["metrics"][key].get("sim"), "inside": comparison["metrics"][key].get("in_band")}
            for key in HEADLINE]
    try:
        return _checked_rows(rows), comparison
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _planned(path: Path, folder: str) -> str:
    """The planned run a compare_all folder is of (``RUN`` or ``RUN-vs-FIRST``, by FIRST); ValueError otherwise: its
    trace shape and load could not be told."""
    config = planned_run(folder.partition("-vs-")[2] or folder)
    if config is None:
        raise ValueError(f"{path}: {folder} is no run of validation/compare_all.py's PLAN (nor a repeat of one); "
                         "expected a compare_all --results folder")
    return config


def read_results(results: Path) -> tuple[list[dict], list[dict]]:
    """The rows of one compare_all --results folder's GPU runs, each with its GPU ``device`` and ``allowed``: max(3 %,
    the largest real-vs-real spread of its figure between the folder's GPU runs of its configuration, from the
    ``RUN-vs-FIRST`` comparisons); and the runs read, one entry each (with the simulation's cost model)."""
    spreads: dict[tuple[str, str], float] = {}
    rows, runs = [], []
    for path in sorted(results.glob("*/compare.json")):
        folder = path.parent.name
        config = _planned(path, folder)
        figures, comparison = _figure_rows(path, folder, config)
        if "-vs-" in folder:  # a repeat against the first run: GPU against GPU, the repeat as 'sim'
            for row in figures:  # a first run's figure of 0 has no relative spread: none is measured
                key = (config, row["figure"])
                spreads[key] = max(spreads.get(key, 0.0), abs(_error(row) or 0.0))
            continue
        runs.append({"folder": str(results), "run": folder, "device": comparison["device"],
                     "cost_model": comparison["cost_model"]})
        rows += [{**row, "device": comparison["device"]} for row in figures]
    for row in rows:
        row["allowed"] = max(0.03, spreads.get((row["config"], row["figure"]), 0.0))
    return rows, runs


def summarize_results(rows: list[dict]) -> list[dict]:
    """One entry per (trace shape, load, GPU, figure) over rows of read_results: the errors, how many are within
    their configuration's max(3 %, GPU spread), and how many GPU figures lie inside the band."""
    groups: dict[tuple[str, str, str, str], list[dict]] = {}
    for row in rows:
        if _error(row) is not None:
            key = (shape_class(row["config"]), load_class(row["config"]), row["device"], row["figure"])
            groups.setdefault(key, []).append(row)
    return [{"shape": shape, "load": load, "device": device, "figure": figure, "num_runs": len(members),
             **_error_stats([_error(r) for r in members]),
             "within_spread": sum(abs(_error(r)) <= r["allowed"] for r in members),
             "inside_band": sum(bool(r["inside"]) for r in members)}
            for (shape, load, device, figure), members in sorted(
                groups.items(), key=lambda g: (*_shape_load_rank(*g[0][:2]), g[0][2], HEADLINE.index(g[0][3])))]


def results_markdown(command: str, summary: list[dict], runs: list[dict]) -> str:
    """The table of summarize_results, under the command that makes it and the folders, GPUs and profiles it read."""
    counts: dict[tuple[str, str, str], int] = {}
    for run in runs:
        key = (run["folder"], run["device"], run["cost_model"])
        counts[key] = counts.get(key, 0) + 1
    lines = [markdown_code(command), "",
             "Signed error of the simulation against each GPU run, (sim - GPU) / GPU, per trace shape, load, GPU and "
             "headline figure, as each run's `validation/compare_all.py` comparison recorded it. *Within spread*: "
             "|error| <= max(3 %, the largest difference of that figure between the GPU runs of its configuration in "
             "the same folder), 3 % where it was run once; *inside p5-p95*: the GPU figure inside the simulator's "
             "band of seeded replays (`--bands`). GPU runs read:", ""]
    lines += [f"- {markdown_code(folder)}: {n} GPU runs on {markdown_cell(device)}, simulated with "
              f"{markdown_cell(model)}" for (folder, device, model), n in counts.items()]
    lines += ["", "| trace | load | GPU | figure | GPU runs | median error | largest error | within 3 % | "
              "within spread | within 10 % | inside p5-p95 |", "|:---" * 4 + "|---:" * 7 + "|"]
    for s in summary:
        n = s["num_runs"]
        lines.append(f"| {s['shape']} | {s['load']} | {markdown_cell(s['device'])} | {markdown_cell(s['figure'])} | "
                     f"{n} | {100 * s['median_error']:+.1f}% | {100 * s['largest_error']:+.1f}% | "
                     f"{s['within_3pct']} of {n} | {s['within_spread']} of {n} | {s['within_10pct']} of {n} | "
                     f"{s['inside_band']} of {n} |")
    total = sum(s["num_runs"] for s in summary)
    lines += ["", f"In all, of {total} GPU figures: {sum(s['within_3pct'] for s in summary)} within 3 %, "
                  f"{sum(s['within_spread'] for s in summary)} within spread, "
                  f"{sum(s['inside_band'] for s in summary)} inside the p5-p95 band."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("bands", nargs="*", help="bands.json files written by validation/band_check.py")
    parser.add_argument("--results", action="append", default=[], metavar="DIR",
                        help="a validation/compare_all.py --results folder, instead of bands.json files (repeatable)")
    parser.add_argument("--out", default=None, help="also write the table here (and the figures as JSON beside it)")
    args = parser.parse_args(argv)
    from sim.files import check_output_path, write_text_atomic

    if bool(args.bands) == bool(args.results):  # two tables of different groupings cannot be summed into one
        parser.exit(2, "error: expected bands.json files or --results folders, one of the two\n")
    problem = next(filter(None, (_folder_problem(Path(folder)) for folder in args.results)), None)
    if problem:
        parser.exit(2, f"error: {problem}\n")
    # Before anything is read or printed: --out bands.md beside the bands.json it read replaced that input with the
    # summary's JSON, --out FILE.json was overwritten by the JSON written beside itself, and a folder was a traceback.
    figures = args.out and Path(args.out).with_suffix(".json")
    inputs = [Path(path) for path in args.bands] + [p for folder in args.results
                                                    for p in Path(folder).glob("*/compare.json")]
    problem = args.out is not None and (
        check_output_path(args.out, "--out", inputs)
        or (f"--out {args.out}: the figures go beside it as {figures}; expected a name not ending in .json (FILE.md)"
            if figures == Path(args.out) else check_output_path(figures, f"--out {args.out}: its JSON", inputs)))
    if problem:
        parser.exit(2, f"error: {problem}\n")
    seen: dict[Path, str] = {}
    for path in args.bands + args.results:  # its GPU runs would count twice in every figure
        if Path(path).resolve() in seen:
            parser.exit(2, f"error: {path} is given twice (also as {seen[Path(path).resolve()]}); give each once\n")
        seen[Path(path).resolve()] = path
    try:
        text, written = _results_summary(args.results, args.out) if args.results else _bands_summary(args.bands)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)
        write_text_atomic(figures, json.dumps(written, indent=1) + "\n")
    return 0


def _folder_problem(folder: Path) -> str | None:
    """Why ``folder`` is no compare_all --results folder (a mistyped one was an empty summary at exit 0)."""
    if not folder.is_dir():
        return f"--results {folder}: not a folder; expected a validation/compare_all.py --results folder"
    if not any(folder.glob("*/compare.json")):
        return f"--results {folder}: no RUN/compare.json; expected a validation/compare_all.py --results folder"
    return None


def _bands_summary(paths: list[str]) -> tuple[str, dict]:
    """The tables and figures of bands.json files; ValueError naming a file that is not one."""
    rows = []
    for path in paths:
        try:
            rows += _checked_rows(json.loads(read_json_input(Path(path)))["rows"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a bands.json of validation/band_check.py ({exc})") from None
    summary, shapes = summarize(rows), summarize_shapes(rows)
    return to_markdown(summary, paths) + shapes_markdown(shapes), {"by_load": summary, "by_shape": shapes}


def _results_summary(folders: list[str], out: str | None) -> tuple[str, dict]:
    """The tables and figures of compare_all --results folders, headed by the command that makes them."""
    rows, runs = [], []
    for folder in folders:
        folder_rows, folder_runs = read_results(Path(folder))
        rows, runs = rows + folder_rows, runs + folder_runs
    command = shlex.join(["python", "validation/fidelity_summary.py",
                          *(arg for folder in folders for arg in ("--results", folder)),
                          *(["--out", out] if out else [])])
    summary, shapes = summarize_results(rows), summarize_shapes(rows)
    return (results_markdown(command, summary, runs) + shapes_markdown(shapes),
            {"command": command, "runs": runs, "by_figure": summary, "by_shape": shapes})


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
