"""Loading the two replay folders of a sim-vs-real comparison.

Both sides come from folders written by `sim.replay`, `engine.replay` or `traces.bench`, or from a
`vllm bench serve --save-detailed` result file read in place (`analysis.vllm_import`). A
wrong path or a half-written folder must end in one line naming the file, not
in a traceback from deep inside polars, so every read here turns its failure
into a `CompareInputError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analysis.metrics import CLIENT_TIMING, has_step_log, is_timed_by_client
from analysis.runs import META_KEYS, check_meta
from analysis.schema import check_requests, check_steps, conform_requests, conform_steps
from engine.core.json_errors import json_problem
from sim.files import read_json_input, read_parquet_frame
from sim.run_id import mixed_run_problem
from sim.run_kind import MEASURED as MEASURED_COST_MODEL
from sim.run_kind import SIMULATED_COST_MODELS

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "summary.json"


class CompareInputError(Exception):
    """An input that cannot be compared; the message names the offending path."""


@dataclass(frozen=True)
class RunData:
    """One replay folder: its two tables (conformed to `analysis.schema`) and summary.json.

    `metadata` is summary.json as written by the replay (config, cost model,
    trace); it is only used for context, the metrics are recomputed from the
    tables so both sides go through the same code.
    """

    label: str
    path: Path
    requests: pl.DataFrame
    steps: pl.DataFrame
    metadata: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The folder name, short enough for titles and legends."""
        return self.path.resolve().name or str(self.path)

    @property
    def cost_model(self) -> str | None:
        """The simulator's cost model, or None (a GPU replay has none)."""
        value = self.metadata.get("cost_model")
        return str(value) if value is not None else None

    @property
    def simulated(self) -> bool | None:
        """True for a sim.replay run, False for a measured one (engine.replay, traces.bench, an imported vllm bench
        serve result), None when summary.json does not say (a hand-made folder). A profile's name says "measured"
        too ("profile:h200/... (measured 2026-12-02)"): only the start of the name tells a simulation."""
        cost_model = self.cost_model
        if cost_model is None:
            return None
        if cost_model.startswith(SIMULATED_COST_MODELS):
            return True
        if cost_model == MEASURED_COST_MODEL or CLIENT_TIMING in cost_model:
            return False
        return None

    @property
    def recorded_duration_s(self) -> float | None:
        """The duration the run recorded (an imported vLLM result), used instead of its makespan."""
        value = self.metadata.get("recorded_duration_s")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def timed_by_client(self) -> bool:
        """Measured from outside the engine (traces.bench, an imported vllm bench serve result), as its summary's
        cost model says: it has no step log however its requests ended. Its tables alone cannot say so when no
        request got a token (every one failed), and such a run was compared as a log of 0 engine steps."""
        return is_timed_by_client(self.metadata)

    @property
    def positional_ids(self) -> bool:
        """Its request ids are positions (an imported vLLM result names no request)."""
        return self.metadata.get("request_ids") == "position"

    @property
    def config(self) -> dict:
        """The engine/deployment config recorded in summary.json ({} if absent)."""
        config = self.metadata.get("config")
        return dict(config) if isinstance(config, dict) else {}


def _read_parquet(path: Path) -> pl.DataFrame:
    if path.is_dir():  # was "no such file", beside a folder of that name
        raise CompareInputError(f"{path}: is a directory; expected a parquet file")
    if path.exists() and not path.is_file():
        raise CompareInputError(f"{path}: not a regular file; expected a parquet file")
    if not path.is_file():
        raise CompareInputError(f"{path}: no such file")
    try:
        return read_parquet_frame(path)
    except Exception as exc:  # polars and pyarrow raise many kinds; all mean "cannot read this file"
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompareInputError(f"{path}: not a readable parquet file ({detail})") from exc


def _read_summary(path: Path) -> dict:
    """summary.json as a dict; {} when absent, since hand-made or older folders may lack it."""
    if not path.exists():
        return {}
    try:
        data = json.loads(read_json_input(path))  # a FIFO named summary.json blocked the read forever
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = getattr(exc, "strerror", None) or exc
        raise CompareInputError(f"{path}: not a readable JSON file ({detail})") from exc
    except RecursionError:  # arrays nested thousands deep were a RecursionError traceback
        raise CompareInputError(f"{path}: JSON nested too deeply to read; expected the JSON a run writes") from None
    except ValueError as exc:  # an integer of 5000 digits was a ValueError traceback that named no file
        raise CompareInputError(f"{path}: not a readable JSON file ({json_problem(exc)})") from None
    if not isinstance(data, dict):
        raise CompareInputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:  # the keys read here (warnings, bands, config, ...): a hand-edited one was a traceback mid-comparison
        check_meta({key: data[key] for key in META_KEYS if key in data}, path)
    except ValueError as exc:
        raise CompareInputError(str(exc)) from None
    return data


def load_run(path: str | Path, label: str) -> RunData:
    """Read and check one replay folder; `label` ("real" or "sim") names it in tables and legends."""
    path = Path(path)
    # SGLang's bench_serving names its result file .jsonl (one JSON line per run): it was "not a directory".
    if path.is_file() and path.suffix in (".json", ".jsonl"):
        return _load_vllm_result(path, label)
    if not path.exists():
        raise CompareInputError(f"{path}: no such directory")
    if not path.is_dir():
        raise CompareInputError(f"{path}: not a directory (expected a replay output folder or a vllm bench serve "
                                "result .json)")
    requests_path, steps_path = path / REQUESTS_FILE, path / STEPS_FILE
    mixed = mixed_run_problem(path)
    if mixed:  # one run's requests beside another's steps or summary: compared as one run
        raise CompareInputError(mixed)
    requests = _read_parquet(requests_path)
    steps = _read_parquet(steps_path)
    try:
        requests = conform_requests(requests)
        check_requests(requests)
    except (ValueError, pl.exceptions.PolarsError) as exc:
        raise CompareInputError(f"{requests_path}: {exc}") from exc
    try:
        steps = conform_steps(steps)
        check_steps(steps)
    except (ValueError, pl.exceptions.PolarsError) as exc:
        raise CompareInputError(f"{steps_path}: {exc}") from exc
    run = RunData(label=label, path=path, requests=requests, steps=steps, metadata=_read_summary(path / SUMMARY_FILE))
    # A simulated run, or one engine.replay measured, logs every step it ran: an emptied step log beside requests that
    # got tokens was compared as a run served over HTTP ("engine steps n/a", "schedule diff: n/a (... a run served
    # over HTTP or imported from another tool)"), which summary.json says it is not.
    logs_steps = run.simulated or run.cost_model == MEASURED_COST_MODEL
    if logs_steps and not run.timed_by_client and not has_step_log(requests, steps):
        served = requests.height - requests["first_token_s"].null_count()
        what = "a simulated run" if run.simulated else "a run engine.replay measured"
        raise CompareInputError(f"{steps_path}: holds no steps, yet {served} request(s) got tokens; expected the "
                                f"step log of {what}, as its summary.json says it is")
    return run


def _load_vllm_result(path: Path, label: str) -> RunData:
    from analysis.vllm_import import read_vllm_result

    try:
        run = read_vllm_result(path)
    except ValueError as exc:
        raise CompareInputError(str(exc)) from None
    return RunData(label=label, path=path, requests=conform_requests(run.requests), steps=run.steps,
                   metadata=run.meta)
