"""How far the shipped profile's predictions are from the GPU, over every committed GPU run:
``python validation/fidelity_summary.py RESULTS_DIR/bands/bands.json [...] [--out FILE.md]``.

Reads the ``bands.json`` that ``validation/band_check.py`` writes beside ``bands.md`` (one per folder of GPU runs,
each folder a machine session), and sums up, per load class (light, ~70 %, ~95 %, KV pressure) and headline figure,
the signed error of the simulation against each GPU run, (sim - GPU) / GPU: its median, its largest size, how many
runs are within 3 % and within 10 %, and how many GPU figures fall inside the simulator's p5-p95 band. A serving
engineer reads it as: on a machine of this kind, a prediction of this figure at this load is usually this close.
A second table gives the same per trace shape (and model) and load, over the latency figures together.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.formatting import markdown_cell, markdown_code  # noqa: E402
from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import read_json_input  # noqa: E402
from validation.compare_all import HEADLINE  # noqa: E402  the figures, in the order every validation table has them

CLASSES = (("light", ("-light",)), ("~70 %", ("-p70", "c-mooncake")), ("~95 %", ("-p95",)),
           ("KV pressure", ("-kv",)), ("offline", ("a-bench",)))


# The trace (and model) of a planned run, by its name's prefix (validation/compare_all.py's PLAN): loads of one shape
# are read together, since the error depends on the shape (decode-heavy is priced long where the others are not).
SHAPES = (("qwen3-8b, Azure conversation", ("g-azure-8b",)), ("conversation (Azure)", ("b-azure", "d-azure")),
          ("long context, prefix reuse (Mooncake)", ("c-mooncake", "d-mooncake")),
          ("prefill-heavy", ("e-prefill",)), ("decode-heavy, bursty", ("f-decode",)), ("offline batch", ("a-bench",)))
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
    shapes, loads = [n for n, _ in SHAPES] + ["other"], [n for n, _ in CLASSES] + ["other"]
    return [{"shape": shape, "load": load, "num_figures": len(errors), **_error_stats(errors)}
            for (shape, load), errors in sorted(groups.items(),
                                                key=lambda g: (shapes.index(g[0][0]), loads.index(g[0][1])))]


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


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("bands", nargs="+", help="bands.json files written by validation/band_check.py")
    parser.add_argument("--out", default=None, help="also write the table here (and the figures as JSON beside it)")
    args = parser.parse_args(argv)
    from sim.files import check_output_path, write_text_atomic

    # Before anything is read or printed: --out bands.md beside the bands.json it read replaced that input with the
    # summary's JSON, --out FILE.json was overwritten by the JSON written beside itself, and a folder was a traceback.
    figures = args.out and Path(args.out).with_suffix(".json")
    inputs = [Path(path) for path in args.bands]
    problem = args.out is not None and (
        check_output_path(args.out, "--out", inputs)
        or (f"--out {args.out}: the figures go beside it as {figures}; expected a name not ending in .json (FILE.md)"
            if figures == Path(args.out) else check_output_path(figures, f"--out {args.out}: its JSON", inputs)))
    if problem:
        parser.exit(2, f"error: {problem}\n")
    seen: dict[Path, str] = {}
    for path in args.bands:  # its GPU runs would count twice in every figure
        if Path(path).resolve() in seen:
            parser.exit(2, f"error: {path} is given twice (also as {seen[Path(path).resolve()]}); give each once\n")
        seen[Path(path).resolve()] = path
    rows = []
    for path in args.bands:
        try:
            rows += _checked_rows(json.loads(read_json_input(Path(path)))["rows"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            parser.exit(2, f"error: {path}: not a bands.json of validation/band_check.py ({exc})\n")
    summary, shapes = summarize(rows), summarize_shapes(rows)
    text = to_markdown(summary, args.bands) + shapes_markdown(shapes)
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)
        write_text_atomic(figures, json.dumps({"by_load": summary, "by_shape": shapes}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
