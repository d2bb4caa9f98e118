"""Hostile-input probe (session 25, E): untrusted text (run folder names, summary.json strings, --model folders) in
what analysis.compare, analysis.summarize and analysis.capacity print and write."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis.capacity.cli import main as capacity_main
from analysis.compare.cli import main as compare_main
from analysis.compare.error_table import METRIC_SPECS
from analysis.formatting import markdown_cell, markdown_code
from analysis.summarize import main as summarize_main
from tests.analysis.test_compare import real_requests, real_steps, sim_requests, sim_steps, write_run
from tests.sim.helpers import REPO, write_trace

# Markup, a table's pipe, an ANSI colour, a carriage return, a newline and a code span's backtick (no "/": it names
# folders too).
HOSTILE = "<img src=x onerror=alert(1)>|\x1b[31mRED\x1b[0m\r\n`x`"
ESCAPED = "<img src=x onerror=alert(1)>|\\x1b[31mRED\\x1b[0m\\r\\n`x`"  # as escape_controls writes it
ESCAPED_HTML = ESCAPED.replace("<", "&lt;").replace(">", "&gt;")
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # every control character but tab and newline


def _hostile_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A real and a sim folder whose names and summary.json strings hold ``HOSTILE``."""
    real = write_run(tmp_path / f"real {HOSTILE}", real_requests(), real_steps(),
                     {"config": {"max_num_seqs": 256, "model": "m", HOSTILE: "a"}})
    sim = write_run(tmp_path / f"sim {HOSTILE}", sim_requests(), sim_steps(),
                    {"cost_model": f"profile:{HOSTILE}", "config": {"max_num_seqs": 8, "model": "m", HOSTILE: "b"},
                     "warnings": [{"code": f"c{HOSTILE}", "message": f"m{HOSTILE}"}]})
    return real, sim


def test_markdown_helpers_keep_a_cell_and_a_code_span_whole() -> None:
    assert markdown_cell("a|b\nc\x1b") == "a\\|b\\nc\\x1b"
    assert markdown_code("plain") == "`plain`"
    assert markdown_code("x``y") == "```x``y```"
    assert markdown_code("`a") == "`` `a ``"
    assert markdown_code("a\nb") == "`a\\nb`"


def test_compare_md_stays_one_table_row_per_metric(tmp_path, capsys) -> None:
    """A run folder named with a newline ended compare.md's header row mid-cell (the table lost its header), and its
    ANSI escape and carriage return, and the cost model's, went into the file raw."""
    real, sim = _hostile_pair(tmp_path)
    out = tmp_path / "out"
    assert compare_main([str(real), str(sim), "--out", str(out), "--no-report"]) == 0
    capsys.readouterr()
    text = (out / "compare.md").read_text()
    assert not CONTROLS.search(text)
    intro, table = text.split("\n\n")
    # code spans: a fence longer than the backticks inside, padded as the name ends in one
    assert intro == (f"Simulation `` sim {ESCAPED} `` (cost model: `` profile:{ESCAPED} ``) vs real "
                     f"`` real {ESCAPED} ``; relative error = (sim - real) / real; 3 requests matched.")
    lines = table.splitlines()
    cell = ESCAPED.replace("|", "\\|")
    assert lines[0] == f"| metric | real (real {cell}) | sim (sim {cell}) | diff (sim - real) | rel. error |"
    assert lines[1] == "|:---|---:|---:|---:|---:|"
    assert len(lines) == 2 + len(METRIC_SPECS)
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines[2:])
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 6 for line in lines)  # five cells each, no more


def test_compare_prints_no_raw_control_character(tmp_path, capsys) -> None:
    """summary.json's cost model, a config key and the sim's warnings were printed raw: an ANSI escape recoloured the
    terminal, a carriage return overwrote the line, a newline split it."""
    real, sim = _hostile_pair(tmp_path)
    assert compare_main([str(real), str(sim), "--out", str(tmp_path / "out"), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out)
    lines = out.splitlines()
    assert lines[0] == (f"sim {tmp_path}/sim {ESCAPED} (cost model: profile:{ESCAPED}) vs real {tmp_path}/real "
                        f"{ESCAPED}; rel. error = (sim - real) / real")
    assert lines[1] == f"config differences: {ESCAPED} real='a' sim='b', max_num_seqs real=256 sim=8"
    assert f"sim warning [c{ESCAPED}]: m{ESCAPED}" in lines


def test_compare_of_a_run_without_step_log_names_it_on_one_line(tmp_path, capsys) -> None:
    """The schedule verdict of a run with no step log (served over HTTP) quoted its folder raw: a newline in the name
    split the line."""
    real, sim = _hostile_pair(tmp_path)
    summary = json.loads((real / "summary.json").read_text())
    (real / "summary.json").write_text(json.dumps({**summary, "cost_model": "measured (client-side timing)"}))
    assert compare_main([str(real), str(sim), "--out", str(tmp_path / "out"), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out)
    assert (f"schedule diff: n/a (real ({tmp_path}/real {ESCAPED}) logged no engine steps: a run served over HTTP or "
            "imported from another tool)") in out.splitlines()


def _header(page: str) -> str:
    return page[page.index("<header>"):page.index("</header>")]


def test_compare_report_escapes_markup_and_control_characters(tmp_path, capsys) -> None:
    """The report escaped the markup but wrote the names' control characters into the page raw (ESC and CR: HTML
    allows neither; a parse error, drawn as a box or nothing)."""
    real, sim = _hostile_pair(tmp_path)
    out = tmp_path / "out"
    assert compare_main([str(real), str(sim), "--out", str(out)]) == 0
    capsys.readouterr()
    page = (out / "report.html").read_text()
    header = _header(page)
    assert "<img" not in header and "\x1b" not in header and "\r" not in header
    escaped = ESCAPED_HTML
    assert f"<h1>Simulation vs real: sim {escaped} vs real {escaped}</h1>" in header
    assert f"<td>profile:{escaped}</td>" in header
    title = re.search(r"<title>(.*?)</title>", page, re.S).group(1)
    assert title == f"Simulation vs real: sim {escaped} vs real {escaped}"


def test_summarize_report_escapes_summary_json_strings(tmp_path, capsys) -> None:
    """summary.json's trace, model, device and cost model, and a warning, reached report.html's title, subtitle and
    warnings table with their control characters raw."""
    folder = write_run(tmp_path / "run", real_requests(), real_steps(),
                       {"trace": f"/x/{HOSTILE}", "cost_model": f"profile:{HOSTILE}",
                        "config": {"model": f"M{HOSTILE}", "device": f"D{HOSTILE}"},
                        "warnings": [{"code": f"c{HOSTILE}", "message": f"m{HOSTILE}"}]})
    assert summarize_main([str(folder), "--report", "--quiet"]) == 0
    page = (folder / "report.html").read_text()
    header = _header(page)
    assert "<img" not in page and not CONTROLS.search(header)
    escaped = ESCAPED_HTML
    assert f"<h1>Replay of {escaped}</h1>" in header
    assert (f'<p class="subtitle">M{escaped} on D{escaped}; cost model: profile:{escaped}</p>') in header
    assert f"<tr><td>c{escaped}</td><td>m{escaped}</td></tr>" in header


def test_capacity_prints_a_model_folder_and_profile_name_on_their_lines(tmp_path, capsys) -> None:
    """A --model folder named with an ANSI escape and a newline was printed raw in the capacity table, its notes and
    the replicas needed (the table's row split in two); a --cost-model profile's file name and measured_at too."""
    model = tmp_path / "m\x1b[33m|<b>\nX"
    model.mkdir()
    (model / "config.json").write_bytes((REPO / "engine" / "configs" / "qwen3-0.6b" / "config.json").read_bytes())
    profile = json.loads((REPO / "sim" / "profiles" / "h200" / "qwen3-0.6b.json").read_text())
    profile["model"] = str(model)
    profile["measured_at"] = "2026\x1b[31m\rX"
    profile_path = tmp_path / "p\x1b[32m.json"
    profile_path.write_text(json.dumps(profile))
    trace = write_trace(tmp_path / "t.parquet", [100] * 10, [20] * 10, [0.1 * i for i in range(10)])
    assert capacity_main([str(trace), "--model", str(model), "--cost-model", str(profile_path), "--slo",
                          "ttft_p90=2s", "--out", str(tmp_path / "cap"), "--min-duration-s", "5", "--min-requests",
                          "50", "--max-iterations", "2"]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out)
    label = f"{tmp_path}/m\\x1b[33m|<b>\\nX"
    lines = out.splitlines()
    assert lines[1].startswith(f"{label} h200 x1 ")
    assert f"  {label} h200: 1 " in "\n".join(lines)
    assert lines[-1].startswith("cost model: profile:h200/p\\x1b[32m (measured 2026\\x1b[31m\\rX)")


@pytest.mark.parametrize("name", ["a b", "q'\"x", "h#1", "p%20", "w?x", "é\u202e😀"])
def test_compare_out_folder_names_reach_the_files(tmp_path, capsys, name) -> None:
    """--out names with spaces, quotes, #, %, ? and unicode: the outputs land in that folder and its name is printed
    as given (a bidirectional override escaped: it would reorder the line)."""
    real, sim = _hostile_pair(tmp_path)
    out = tmp_path / name
    assert compare_main([str(real), str(sim), "--out", str(out)]) == 0
    shown = str(out).replace("\u202e", "\\u202e")
    assert capsys.readouterr().out.splitlines()[-1] == f"outputs in {shown}/"
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.md", "compare.parquet", "report.html"]
    json.loads((out / "compare.json").read_text())
