"""Bad input to ``python -m sim.replay``: a non-zero exit and one line naming the file or option and what
was expected, never a traceback, and nothing written."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import polars as pl
import pytest

from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT, run_cli

TRACE = str(SHAREGPT)


def _error_line(stderr: str) -> str:
    """The single error line; argparse may print its usage lines before it, nothing else may."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    assert "Traceback" not in stderr, stderr
    error_lines = [line for line in lines if "error" in line.lower()]
    assert len(error_lines) == 1, f"expected one error line, got:\n{stderr}"
    assert lines[-1] == error_lines[0], f"the error is not the last line:\n{stderr}"
    usage = lines[:-1]
    assert not usage or usage[0].startswith("usage:"), f"unexpected output before the error:\n{stderr}"
    return lines[-1]


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "missing": tmp_path / "no_such_trace.parquet",
        "text": tmp_path / "trace.csv",
        "empty": tmp_path / "empty.parquet",
        "directory": tmp_path / "a_directory",
        "missing_column": tmp_path / "no_output_tokens.parquet",
        "bad_value": tmp_path / "zero_prompt.parquet",
        "beyond_vocab": tmp_path / "big_ids.parquet",
    }
    files["text"].write_text("request_id,arrival_s,prompt_tokens,output_tokens\n0,0.0,10,10\n")
    files["empty"].write_bytes(b"")
    files["directory"].mkdir()
    pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [10, 20]}).write_parquet(
        files["missing_column"]
    )
    pl.DataFrame(
        {"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [10, 0], "output_tokens": [5, 5]}
    ).write_parquet(files["bad_value"])
    pl.DataFrame(
        {"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [2, 2], "output_tokens": [5, 5],
         "prompt_token_ids": [[1, 2], [3, 10**9]]}
    ).write_parquet(files["beyond_vocab"])
    return files


PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles" / "h200"
# The shipped calibration's host factor, as its error message quotes it (it moves when sessions are added).
SHIPPED_HOST_FACTOR = json.loads((PROFILES / "qwen3-0.6b.json").read_text())["serving"]["host_factor"]
CONFIGS = Path(__file__).resolve().parents[2] / "engine" / "configs"

# (trace: a key of _bad_files or None for the default trace, extra args, regexes the error line must match)
CASES: dict[str, tuple[str | None, list[str], list[str]]] = {
    "nonexistent trace": ("missing", [], ["{trace}", "no such file"]),
    "csv, not parquet": ("text", [], ["{trace}", "parquet"]),
    "empty file": ("empty", [], ["{trace}", "empty"]),
    "directory": ("directory", [], ["{trace}", "directory"]),
    "missing column": ("missing_column", [], ["{trace}", "output_tokens", "missing"]),
    "zero prompt tokens": ("bad_value", [], ["{trace}", "prompt_tokens", ">= 1"]),
    # Was a traceback when the row arrived, mid-run.
    "token id beyond the vocabulary": (
        "beyond_vocab", [], ["{trace}", "row 1", "token id 1000000000 at position 1", "vocabulary \\[0, 151936\\)"]
    ),
    "qps 0": (None, ["--qps", "0"], ["--qps", "> 0"]),
    "qps negative": (None, ["--qps", "-2"], ["--qps", "> 0"]),
    "qps not a number": (None, ["--qps", "fast"], ["--qps", "float"]),
    "qps with time-scale": (None, ["--qps", "2", "--time-scale", "2"], ["--qps", "--time-scale", "not allowed"]),
    "qps on simultaneous arrivals": (None, ["--limit", "1", "--qps", "1"], ["qps", "at once"]),
    "time-scale 0": (None, ["--time-scale", "0"], ["--time-scale", "> 0"]),
    # NaN passed the CLI's '<= 0' check, and the trace's own refusal named no option.
    "qps nan": (None, ["--qps", "nan"], ["^error: --qps must be > 0 and finite, got nan$"]),
    "time-scale nan": (None, ["--time-scale", "nan"], ["^error: --time-scale must be > 0 and finite, got nan$"]),
    "time-scale inf": (None, ["--time-scale", "inf"], ["^error: --time-scale must be > 0 and finite, got inf$"]),
    # Finite but past the trace bound: replayed the whole trace, then a traceback writing requests.parquet.
    "time-scale 1e300": (None, ["--time-scale", "1e300"], ["sharegpt.parquet", "expected at most 1e\\+12 s"]),
    "qps 1e-300": (None, ["--qps", "1e-300"], ["sharegpt.parquet", "expected at most 1e\\+12 s", "larger qps"]),
    "limit 0": (None, ["--limit", "0"], ["--limit", ">= 1"]),
    "replicas 0": (None, ["--replicas", "0"], ["--replicas", ">= 1"]),
    "replicas 2**70": (None, ["--replicas", str(2**70)], ["--replicas", "at most 10,000"]),  # hung building them
    "unknown model": (None, ["--model", "no-such-model"], ["model", "no-such-model", "qwen3-0.6b"]),
    "unknown gpu": (None, ["--gpu", "tpu9"], ["--gpu", "tpu9", "h200"]),
    "unknown policy": (None, ["--policy", "bogus"], ["--policy", "bogus", "mixed"]),
    "unknown router": (None, ["--router", "bogus"], ["--router", "bogus", "rr"]),
    "block size 3": (None, ["--block-size", "3"], ["block[-_]size", "power of two", "3"]),
    "max-num-seqs 0": (None, ["--max-num-seqs", "0"], ["max[-_]num[-_]seqs", ">= 1"]),
    "max-num-batched-tokens 0": (
        None, ["--max-num-batched-tokens", "0"], ["max[-_]num[-_]batched[-_]tokens", ">= 1"]
    ),
    "num-gpu-blocks 0": (None, ["--num-gpu-blocks", "0"], ["num[-_]gpu[-_]blocks", ">= 1"]),
    "num-gpu-blocks 2**31": (None, ["--num-gpu-blocks", str(2**31)], ["--num-gpu-blocks", "below 2\\*\\*31"]),
    "max-model-len negative": (None, ["--max-model-len", "-1"], ["max[-_]model[-_]len", ">= 1"]),
    "tensor-parallel-size 0": (None, ["--tensor-parallel-size", "0"], ["tensor[-_]parallel[-_]size", ">= 1"]),
    "gpu-memory-utilization 1.5": (
        None, ["--gpu-memory-utilization", "1.5"], ["gpu[-_]memory[-_]utilization", r"\(0, 1\]"]
    ),
    "model does not fit": (
        None, ["--model", "qwen3-8b", "--gpu-memory-utilization", "0.05"], ["qwen3-8b", "does not fit"]
    ),
    # The activations alone filled the memory, and the message named only the weights (1.1 of 126.4 GiB usable).
    "token budget does not fit": (
        None, ["--max-num-batched-tokens", str(10**10)],
        ["does not fit", "activations at max_num_batched_tokens=10000000000 267030.3 GiB"]
    ),
    "cost model file missing": (None, ["--cost-model", "{tmp}/no_profile.json"], ["cost model", "no_profile.json"]),
    "host slowdown 0": (None, ["--host-slowdown", "0"], ["--host-slowdown", "> 0"]),
    "host slowdown word": (None, ["--host-slowdown", "fast"], ["--host-slowdown", "fast", "calibrated", "episodes"]),
    "host slowdown episodes": (None, ["--host-slowdown", "episodes:1,2"], ["--host-slowdown", "four finite numbers"]),
    "host slowdown episodes fraction": (None, ["--host-slowdown", "episodes:1,2,1.5,3"], ["FRACTION", "1.5"]),
    "host slowdown csv columns": (None, ["--host-slowdown", "{tmp}/host.csv"], ["host.csv", "start_s,slowdown"]),
    # Not a number in disguise: NaN and infinities are refused wherever a number is read.
    "host slowdown nan": (None, ["--host-slowdown", "nan"], ["--host-slowdown", "finite", "nan"]),
    "host slowdown inf": (None, ["--host-slowdown", "inf"], ["--host-slowdown", "finite", "inf"]),
    "host slowdown episodes nan": (None, ["--host-slowdown", "episodes:1,nan,0.5,1"], ["four finite numbers"]),
    "host slowdown csv nan": (None, ["--host-slowdown", "{tmp}/host_nan.csv"], ["host_nan.csv", "line 3", "finite"]),
    # Each was accepted, or an error naming no file.
    "host slowdown csv not utf-8": (None, ["--host-slowdown", "{tmp}/host_bin.csv"], ["host_bin.csv", "not UTF-8"]),
    "host slowdown csv extra field": (
        None, ["--host-slowdown", "{tmp}/host_extra.csv"], ["host_extra.csv, line 3: 3 fields; expected 2"]
    ),
    # Both were accepted: the open quote read as the rest of the file (slowdown 2), the third column dropped.
    "host slowdown csv quote never closed": (
        None, ["--host-slowdown", "{tmp}/host_quote.csv"],
        ["^error: {tmp}/host_quote.csv, line 3: a quoted field is never closed; expected a CSV record of 2 fields$"]
    ),
    "host slowdown csv third column": (
        None, ["--host-slowdown", "{tmp}/host_note.csv"],
        ["^error: {tmp}/host_note.csv: expected the columns start_s,slowdown \\(and no others\\), got "
         "\\['start_s', 'slowdown', 'note'\\]$"]
    ),
    "host slowdown csv starts late": (
        None, ["--host-slowdown", "{tmp}/host_late.csv"], ["host_late.csv, line 2: the first start_s is 3; expected 0"]
    ),
    "host slowdown csv starts early": (
        None, ["--host-slowdown", "{tmp}/host_early.csv"], ["host_early.csv", "first start_s is -5"]
    ),
    "host slowdown csv start repeated": (  # named no line
        None, ["--host-slowdown", "{tmp}/host_repeat.csv"],
        ["host_repeat.csv, line 4: start_s 5 after 5; expected start_s to increase from row to row"]
    ),
    "host slowdown csv missing": (
        None, ["--host-slowdown", "{tmp}/no_host.csv"], ["no_host.csv", "the file does not exist"]
    ),
    "host slowdown episodes swapped": (
        None, ["--host-slowdown", "episodes:2,1,0.5,1"], ["--host-slowdown", "SLOW >= NORMAL", "NORMAL 2, SLOW 1"]
    ),
    "gpu memory utilization nan": (None, ["--gpu-memory-utilization", "nan"], ["gpu_memory_utilization", "nan"]),
    # A profile measured for another deployment would give silently wrong step times.
    "another model's profile": (
        None, ["--cost-model", str(PROFILES / "qwen3-8b.json")], ["qwen3-8b.json", "model qwen3-8b, not qwen3-0.6b"]
    ),
    "another GPU's profile": (
        None, ["--gpu", "h100", "--cost-model", str(PROFILES / "qwen3-0.6b.json")], ["GPU h200, not h100"]
    ),
    "profile not json": (None, ["--cost-model", "{tmp}/host.csv"], ["host.csv", "not a readable profile"]),
    "block size 0": (None, ["--block-size", "0"], ["block[-_]size"]),
    # The engine's own limits, refused by the one validator both share.
    "block size 8": (None, ["--block-size", "8"], ["--block-size", "16 to 256", "got 8"]),
    "max-model-len above the model's": (
        None, ["--max-model-len", "100000"], ["max_model_len=100000", "max_position_embeddings=40960"]
    ),
    "tensor-parallel-size the model cannot split": (
        None, ["--tensor-parallel-size", "3"], ["qwen3-0.6b", "not divisible by tensor_parallel_size \\(3\\)"]
    ),
    "block size negative": (None, ["--block-size", "-16"], ["block[-_]size"]),
    "max-model-len 0": (None, ["--max-model-len", "0"], ["max[-_]model[-_]len"]),
    "out is a file": (None, ["--out", "{tmp}/a_file"], ["{tmp}/a_file"]),
    "out empty": (None, ["--out", ""], ["--out", "is empty"]),  # wrote a folder under runs/ instead
    "slo without a unit": (None, ["--slo", "ttft_p90=2"], ["--slo", "ttft_p90=2", "unit"]),
    "slo unknown metric": (None, ["--slo", "speed_p90=2s"], ["--slo", "speed", "ttft"]),
    # A model config.json with sizes no model has: each surfaced late, as a traceback or a nonsense KV cache.
    "config a list": (None, ["--model", "{tmp}/m_list"], ["m_list/config.json", "top level is a JSON array"]),
    "config zero hidden size": (None, ["--model", "{tmp}/m_zero"], ["m_zero/config.json", "'hidden_size' is 0"]),
    "config fractional size": (None, ["--model", "{tmp}/m_frac"], ["'hidden_size' is 1024.5", "integer >= 1"]),
    "config zero vocabulary": (None, ["--model", "{tmp}/m_vocab"], ["m_vocab/config.json", "'vocab_size' is 0"]),
    "config heads not grouped": (
        None, ["--model", "{tmp}/m_heads"], ["num_attention_heads \\(16\\) is not a multiple of num_key_value_heads"]
    ),
    # Fits with --num-gpu-blocks, but its steps take ~1e9 s: the run ended in a traceback writing requests.parquet.
    "config whose steps no GPU runs": (
        None, ["--model", "{tmp}/m_deep", "--num-gpu-blocks", "100"],
        ["the simulated run cannot be written: requests table: column 'first_scheduled_s'",
         "times must be within 2e\\+12 seconds", "check --model, --num-gpu-blocks and --cost-model"]
    ),
    "config not utf-8": (None, ["--model", "{tmp}/m_binary"], ["m_binary/config.json", "not valid JSON"]),
    # A profile whose fitted cost model is unusable: NaN coefficients ran to exit 0 with NaN latencies.
    "profile NaN coefficient": (
        None, ["--cost-model", "{tmp}/p_nan.json"], ["p_nan.json", "'fit.eager.gpu_coef'", "finite numbers >= 0"]
    ),
    "profile negative planning surcharge": (
        None, ["--cost-model", "{tmp}/p_unprepared.json"],
        ["p_unprepared.json", "'fit.graph_decode.unprepared_s'", "a list of 2 finite numbers >= 0"]
    ),
    "profile negative host factor": (
        None, ["--cost-model", "{tmp}/p_host.json"], ["p_host.json", "'serving.host_factor' is -1"]
    ),
    "profile fit not an object": (None, ["--cost-model", "{tmp}/p_fit.json"], ["p_fit.json", "'fit' is missing"]),
    # The factors the model prices with sit under 'fit': NaN there was a traceback at the end, -3 wrong figures.
    "profile NaN fitted host factor": (
        None, ["--cost-model", "{tmp}/p_fhost.json"], ["p_fhost.json", "'fit.serving.host_factor' is nan"]
    ),
    "profile negative fitted decode factor": (
        None, ["--cost-model", "{tmp}/p_fdecode.json"], ["p_fdecode.json", "'fit.serving.decode_factor' is -3"]
    ),
    "profile absurd intercept": (  # finite, so it passed, and overflowed the run's times
        None, ["--cost-model", "{tmp}/p_huge.json"], ["p_huge.json", "'fit.graph_decode.intercept_s'", "at most 1000 s"]
    ),
    "profile empty object": (None, ["--cost-model", "{tmp}/p_empty.json"], ["p_empty.json", "'model' is missing"]),
    "profile a list": (None, ["--cost-model", "{tmp}/p_list.json"], ["p_list.json", "top level is a JSON array"]),
    "profile text tensor-parallel size": (
        None, ["--cost-model", "{tmp}/p_tp.json"], ["p_tp.json", "'tensor_parallel_size' is '1'", "integer >= 1"]
    ),
    # Read only by the band replays: each was a traceback from every one of them (--bands).
    "profile repeat time text": (
        None, ["--cost-model", "{tmp}/p_times.json", "--bands", "2"], ["p_times.json", "points\\[0\\]: 'times_s' is"]
    ),
    "profile episodes share beyond 1": (
        None, ["--cost-model", "{tmp}/p_share.json", "--bands", "2"],
        ["p_share.json", "'serving.host_episodes.slow_share_range' is \\[0.9, 2.0\\]"]
    ),
    "profile engine option text": (
        None, ["--cost-model", "{tmp}/p_block.json"], ["p_block.json", "'engine_options.block_size' is 'x'"]
    ),
    # Each was a traceback: the piecewise sizes in the cost model, the rest after the whole replay had run.
    "profile piecewise sizes text": (
        None, ["--cost-model", "{tmp}/p_pieces.json"],
        ["p_pieces.json", "'fit.eager.piecewise_graph_sizes' is x; expected an increasing list of sizes >= 1"]
    ),
    "profile longest decode context null": (
        None, ["--cost-model", "{tmp}/p_longest.json"],
        ["p_longest.json", "points\\[0\\]: feature 'max_decode_context_tokens' is None; expected an integer"]
    ),
    # Arrays nested thousands deep: a RecursionError traceback from the JSON reader.
    "profile nested too deeply": (
        None, ["--cost-model", "{tmp}/p_deep.json"],
        ["^error: cost model {tmp}/p_deep.json: not a readable profile \\(JSON nested too deeply to read\\)$"]
    ),
    # Refused when empty, but accepted when deleted: the beyond-grid warnings and the --bands noise went unsaid.
    "profile without points": (
        None, ["--cost-model", "{tmp}/p_nopoints.json"],
        ["p_nopoints.json", "field 'points' is missing, empty or not a list; expected the measured grid points"]
    ),
    # The name quoted the top-level calibration ("host x0.83") while steps were priced with the one under 'fit'.
    "profile calibrations that differ": (
        None, ["--cost-model", "{tmp}/p_twofactors.json"],
        ["p_twofactors.json", f"field 'serving.host_factor' is {SHIPPED_HOST_FACTOR:g} but field "
         "'fit.serving.host_factor' is 5.0; expected one calibration in both"]
    ),
    "profile calibrated without the fit's copy": (
        None, ["--cost-model", "{tmp}/p_fitnoserving.json"],
        ["p_fitnoserving.json", "field 'serving' holds a calibration and field 'fit.serving' none"]
    ),
    # Coefficients fitted on one form's features priced on another's: accepted, at changed prices.
    "profile form of other bases": (
        None, ["--cost-model", "{tmp}/p_formmax.json"],
        ["p_formmax.json", "field 'fit.eager.floor_basis' is \\['one', 'num_seqs', 'extra_prefill_seqs', "
         "'has_decode_rows'\\]; expected \\['one', 'num_seqs', 'num_prefill_seqs', 'has_decode_rows'\\], the "
         "features of form 'max'"]
    ),
    "profile unknown basis": (
        None, ["--cost-model", "{tmp}/p_bogus.json"],
        ["p_bogus.json", "field 'fit.eager.gpu_basis' is \\['bogus', ", "the features of form 'sum'"]
    ),
    "profile calibration without host factor": (
        None, ["--cost-model", "{tmp}/p_nohost.json"],
        ["p_nohost.json", "field 'serving.host_factor' is missing; expected a finite number > 0\\)$"]
    ),
}


def _write_model(tmp_path: Path, name: str, change) -> None:
    config = json.loads((CONFIGS / "qwen3-0.6b" / "config.json").read_text())
    (tmp_path / name).mkdir()
    content = change(config)
    path = tmp_path / name / "config.json"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(json.dumps(content))


def _write_profile(tmp_path: Path, name: str, change) -> None:
    profile = json.loads((PROFILES / "qwen3-0.6b.json").read_text())
    change(profile)
    (tmp_path / name).write_text(json.dumps(profile))


def _hostile_configs(tmp_path: Path) -> None:
    _write_model(tmp_path, "m_list", lambda c: [])
    _write_model(tmp_path, "m_zero", lambda c: {**c, "hidden_size": 0})
    _write_model(tmp_path, "m_frac", lambda c: {**c, "hidden_size": 1024.5})
    _write_model(tmp_path, "m_vocab", lambda c: {**c, "vocab_size": 0})
    _write_model(tmp_path, "m_heads", lambda c: {**c, "num_key_value_heads": 3})
    _write_model(tmp_path, "m_binary", lambda c: b"\xff\xfe{")
    _write_model(tmp_path, "m_deep", lambda c: {**c, "num_hidden_layers": 2**39, "hidden_size": 2**20,
                                                "intermediate_size": 2**39})
    _write_profile(tmp_path, "p_nan.json", lambda p: p["fit"]["eager"]["gpu_coef"].__setitem__(0, math.nan))
    _write_profile(tmp_path, "p_host.json", lambda p: p["serving"].update(host_factor=-1))
    _write_profile(tmp_path, "p_unprepared.json", lambda p: p["fit"]["graph_decode"].update(unprepared_s=[-0.001, 0]))
    _write_profile(tmp_path, "p_fit.json", lambda p: p.update(fit="x"))
    _write_profile(tmp_path, "p_fhost.json", lambda p: p["fit"]["serving"].update(host_factor=math.nan))
    _write_profile(tmp_path, "p_fdecode.json", lambda p: p["fit"]["serving"].update(decode_factor=-3))
    _write_profile(tmp_path, "p_huge.json", lambda p: p["fit"]["graph_decode"]["intercept_s"].__setitem__(0, 1e308))
    _write_profile(tmp_path, "p_tp.json", lambda p: p.update(tensor_parallel_size="1"))
    (tmp_path / "p_empty.json").write_text("{}")
    (tmp_path / "p_list.json").write_text("[]")
    (tmp_path / "p_deep.json").write_text("[" * 100_000 + "]" * 100_000)
    _write_profile(tmp_path, "p_nopoints.json", lambda p: p.pop("points"))
    _write_profile(tmp_path, "p_twofactors.json", lambda p: p["fit"]["serving"].update(host_factor=5.0))
    _write_profile(tmp_path, "p_fitnoserving.json", lambda p: p["fit"].pop("serving"))
    _write_profile(tmp_path, "p_formmax.json", lambda p: p["fit"]["eager"].update(form="max"))
    _write_profile(tmp_path, "p_bogus.json", lambda p: p["fit"]["eager"]["gpu_basis"].__setitem__(0, "bogus"))
    _write_profile(tmp_path, "p_block.json", lambda p: p["engine_options"].update(block_size="x"))
    _write_profile(tmp_path, "p_times.json", lambda p: p["points"][0].update(times_s=["x"]))
    _write_profile(tmp_path, "p_pieces.json", lambda p: p["fit"]["eager"].update(piecewise_graph_sizes="x"))
    _write_profile(tmp_path, "p_longest.json",
                   lambda p: p["points"][0]["features"].update(max_decode_context_tokens=None))
    _write_profile(tmp_path, "p_nohost.json", lambda p: p["serving"].pop("host_factor"))
    _write_profile(tmp_path, "p_share.json",
                   lambda p: p["serving"]["host_episodes"].update(slow_share_range=[0.9, 2.0]))

def _args(tmp_path: Path, trace_key: str | None, extra: list[str]) -> list[str]:
    trace = TRACE if trace_key is None else str(_bad_files(tmp_path)[trace_key])
    (tmp_path / "host.csv").write_text("time,factor\n0,1.5\n")
    (tmp_path / "host_nan.csv").write_text("start_s,slowdown\n0,1.5\n5,nan\n")
    (tmp_path / "host_bin.csv").write_bytes(b"start_s,slowdown\n0,\xff\xfe\n")
    (tmp_path / "host_extra.csv").write_text("start_s,slowdown\n0,1.2\n5,1.3,7\n")
    (tmp_path / "host_late.csv").write_text("start_s,slowdown\n3,1.5\n")
    (tmp_path / "host_quote.csv").write_text('start_s,slowdown\n0,1\n1,"2\n')
    (tmp_path / "host_note.csv").write_text("start_s,slowdown,note\n0,1,x\n")
    (tmp_path / "host_early.csv").write_text("start_s,slowdown\n-5,1.2\n0,1.3\n")
    (tmp_path / "host_repeat.csv").write_text("start_s,slowdown\n0,1.2\n5,1.4\n5,1.5\n")
    _hostile_configs(tmp_path)
    args = [trace, "--quiet", "--no-report"]
    if "--limit" not in extra:
        args += ["--limit", "20"]
    if "--out" not in extra:
        args += ["--out", str(tmp_path / "out")]
    return args + [a.replace("{tmp}", str(tmp_path)) for a in extra]


def _check(tmp_path: Path, trace: str, stderr: str, patterns: list[str]) -> None:
    line = _error_line(stderr)
    for pattern in patterns:
        pattern = pattern.replace("{trace}", re.escape(trace)).replace("{tmp}", re.escape(str(tmp_path)))
        assert re.search(pattern, line), f"{pattern!r} not in {line!r}"
    assert not (tmp_path / "out").exists(), "a failed run wrote outputs"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clean_line(tmp_path, capsys, case) -> None:
    trace_key, extra, patterns = CASES[case]
    (tmp_path / "a_file").write_text("not a folder\n")
    args = _args(tmp_path, trace_key, extra)
    with pytest.raises(SystemExit) as exited:  # any other exception would be a traceback at the shell
        replay_main(args)
    assert exited.value.code not in (0, None)
    _check(tmp_path, args[0], capsys.readouterr().err, patterns)


@pytest.mark.parametrize(
    ("extra", "patterns"),
    [
        (["/nonexistent/trace.parquet"], ["/nonexistent/trace.parquet", "no such file"]),
        ([TRACE, "--qps", "3", "--time-scale", "2"], ["--time-scale", "--qps"]),
        ([TRACE, "--model", "no-such-model"], ["no-such-model"]),
    ],
    ids=["nonexistent trace", "qps with time-scale", "unknown model"],
)
def test_bad_input_in_a_child_process(tmp_path, extra, patterns) -> None:
    """The same through ``python -m``: exit status 2 and no traceback at the process level."""
    proc = run_cli([*extra, "--quiet", "--out", tmp_path / "out"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    line = _error_line(proc.stderr)
    for pattern in patterns:
        assert re.search(re.escape(pattern), line), (pattern, line)
    assert not (tmp_path / "out").exists()


def test_out_never_replaces_a_folder_holding_an_input(tmp_path, capsys) -> None:
    """A trace named like a run file inside --out: --overwrite replaced the folder, the trace with it."""
    folder = tmp_path / "run"
    folder.mkdir()
    trace = folder / "requests.parquet"
    trace.write_bytes(SHAREGPT.read_bytes())
    line = _error_line_of(replay_main, [str(trace), "--limit", "5", "--quiet", "--out", str(folder), "--overwrite"],
                          capsys)
    assert line == f"error: --out {folder} is or holds the input {trace}; write the output elsewhere"
    assert trace.read_bytes() == SHAREGPT.read_bytes()


def test_a_trace_reaching_the_arrival_bound_replays_and_is_written(tmp_path, capsys) -> None:
    """A trace may hold arrivals up to 1e12 s. A run's tables held times within the same 1e12 s, so the last request
    of such a trace finished past the bound and the replay failed after all its work; a run's times may now reach
    twice that (the last arrival plus the run's length)."""
    from traces.schema import load_trace, save_trace

    trace = load_trace(SHAREGPT).head(2)
    trace = trace._replace_requests(trace.requests.with_columns(
        pl.Series("arrival_s", [0.0, 1e12], dtype=pl.Float64)))
    path = tmp_path / "far.parquet"
    save_trace(trace, path)
    out = tmp_path / "out"
    assert replay_main([str(path), "--quiet", "--no-report", "--out", str(out)]) == 0
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests["finish_reason"].to_list() == ["length", "length"] and requests["finish_s"].max() > 1e12


def _error_line_of(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return _error_line(capsys.readouterr().err)


def test_sigterm_mid_replay_leaves_no_staging_folder(tmp_path) -> None:
    """timeout's SIGTERM killed the replay at once and left its hidden .out.partial-PID folder behind."""
    import signal
    import subprocess
    import sys
    import time

    from traces.synth import main as synth_main

    trace = tmp_path / "big.parquet"
    assert synth_main(["-o", str(trace), "--num-requests", "200000", "--qps", "50"]) == 0
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "sim.replay", str(trace), "--quiet", "--out", str(out)],
                            cwd=PROFILES.parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Signalled once its staging folder exists, so mid-replay: a fixed sleep of 5 s came, on a loaded machine,
        # before the replay had read its trace ("nothing written", no folder named). 200,000 requests take far longer.
        deadline_s = time.monotonic() + 120
        while len(list(tmp_path.iterdir())) < 2 and proc.poll() is None and time.monotonic() < deadline_s:
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143 and stderr == f"interrupted: nothing written to {out}\n", stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.parquet"]
