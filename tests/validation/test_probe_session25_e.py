"""Hostile-input probe (session 25, E): the Markdown tables of validation/fidelity_summary.py, fed a bands.json whose
strings hold a table's pipe, a newline and an ANSI escape."""

from __future__ import annotations

import json

from validation.fidelity_summary import main as fidelity_main


def test_a_figure_name_stays_in_its_cell(tmp_path, capsys) -> None:
    """A figure named "ttft|p90<newline>..." split its row in two and added a cell; the ANSI escape went to the
    terminal and the file raw. The bands.json name, quoted as code, could hold a backtick."""
    bands = tmp_path / "b`ands.json"
    bands.write_text(json.dumps({"rows": [{"config": "b-azure-p70", "figure": "ttft|p90\n\x1b[31mX", "gpu": 1.0,
                                           "sim": 1.1, "inside": True}]}))
    assert fidelity_main([str(bands)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"over ``{tmp_path}/b`ands.json`` (`python validation/fidelity_summary.py`).")
    assert lines[4] == "| ~70 % | ttft\\|p90\\n\\x1b[31mX | 1 | +10.0% | +10.0% | 0 of 1 | 0 of 1 | 1 of 1 |"
    assert lines[5] == ""
