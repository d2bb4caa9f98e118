"""validation/step_errors.py --split-finishing: same-batch decode steps in which a row finishes (the GPU runner
launched nothing ahead during them) counted apart, by the step log's num_finished."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.core.records import STEP_COLUMNS

STEP_INT_COLUMNS = [c.name for c in STEP_COLUMNS if c.dtype == "int64"]


def _write_run(path, finished: list[int], continues: list[int], order: list[int] | None = None) -> None:
    rows, t = [], 0.0
    for step, (num_finished, cont) in enumerate(zip(finished, continues)):
        f = {"num_seqs": 40, "num_decode_seqs": 40, "decode_context_tokens": 40 * 1000,
             "max_decode_context_tokens": 1000, "continues_batch": cont, "num_running": 40,
             "num_finished": num_finished}
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "replica": 0, "step": step, "start_s": t,
                     "duration_s": 0.004 if num_finished else 0.005})
        t += rows[-1]["duration_s"]
    if order is not None:
        rows = [rows[i] for i in order]
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "steps.parquet")
    (path / "summary.json").write_text('{"cost_model": "measured"}\n')  # as engine.replay's: a GPU run


def test_split_finishing_counts_finishing_steps_apart(tmp_path, capsys):
    from sim.profiled_cost_model import ProfiledCostModel, find_profile
    from validation.step_errors import main, step_errors

    # steps 0 and 3 change the batch; 2 and 5 repeat it and finish a row; 1 and 4 repeat it and finish none
    _write_run(tmp_path / "run", finished=[0, 0, 1, 0, 0, 2], continues=[0, 1, 1, 0, 1, 1])
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    plain = {r["steps"]: r for r in step_errors(tmp_path / "run", model)}
    split = {r["steps"]: r for r in step_errors(tmp_path / "run", model, split_finishing=True)}
    assert {k: r["count"] for k, r in plain.items()} == {"decode, new batch": 2, "decode, same batch": 4, "all": 6}
    assert {k: r["count"] for k, r in split.items()} == {"decode, new batch": 2, "decode, same batch": 2,
                                                          "decode, same batch, a row finishes": 2, "all": 6}
    assert split["decode, same batch, a row finishes"]["real_ms"] == pytest.approx(4.0)
    assert split["decode, same batch"]["real_ms"] == pytest.approx(5.0)
    assert split["all"] == plain["all"]
    assert main(["--split-finishing", "--profile", str(find_profile("qwen3-0.6b", "h200")), str(tmp_path / "run")]) == 0
    assert "a row finishes" in capsys.readouterr().out


def test_split_finishing_refuses_a_log_out_of_step_order(tmp_path, capsys):
    """A log whose rows are not in (replica, step) order could pair a step with another's num_finished: one line
    naming the file, exit 2."""
    from validation.step_errors import main

    _write_run(tmp_path / "run", finished=[0, 1, 0], continues=[0, 1, 1], order=[0, 2, 1])
    with pytest.raises(SystemExit) as exit_info:
        main(["--split-finishing", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "steps.parquet" in err and "--split-finishing" in err
