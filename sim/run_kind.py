"""Whether a replay folder was measured on a GPU or simulated, from its summary.json's ``cost_model``.

engine.replay writes "measured"; sim.replay writes the cost model that priced its steps (a profile's name or the
roofline's, maybe followed by the host slowdown it was given). Tools that read a run's step times as the GPU's
(sim.calibrate, sim.host_speed, the validation scripts) must refuse a simulation: its step times are the cost
model's own, so fitting or judging the model on them only finds the model again (pred/real 1.000 at exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.files import read_json_input
from sim.run_id import mixed_run_problem

# How a simulated run's cost_model starts (sim.simulator.cost_model_description may add the host slowdown after it).
SIMULATED_COST_MODELS = ("profile:", "roofline-estimate")
# How the summary.json of a run measured from outside the engine (traces.bench, analysis.vllm_import) names its
# timing: such a run has an empty step log.
CLIENT_TIMING = "client-side timing"
# What engine.replay writes as its cost_model: the step times are the GPU's own.
MEASURED = "measured"
# What a tool that judges the cost model against the GPU asks for instead.
GPU_RUNS_ONLY = "give engine.replay (GPU) runs, whose steps.parquet holds the GPU's step times"


def read_summary(run_dir: Path) -> dict:
    """A run folder's summary.json as an object; {} when it is missing, unreadable or not an object."""
    try:
        summary = json.loads(read_json_input(run_dir / "summary.json"))
    except (OSError, ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return {}
    return summary if isinstance(summary, dict) else {}


def _simulated(summary: dict) -> str | None:
    cost_model = str(summary.get("cost_model"))
    return cost_model if cost_model.startswith(SIMULATED_COST_MODELS) else None


def simulated_by(run_dir: Path) -> str | None:
    """The cost model a sim.replay folder names in its summary.json (a measured profile or the roofline); None
    for a GPU run (engine.replay's says "measured") or a folder without a readable summary."""
    return _simulated(read_summary(run_dir))


def gpu_run_problem(run_dir: Path, remedy: str = GPU_RUNS_ONLY) -> str | None:
    """Why ``run_dir`` cannot be read as a GPU run, as one line naming it and ending in ``remedy`` ("calibrate on
    engine.replay runs"), or naming its files of different runs (``sim.run_id``); None for a GPU run, or a folder
    without steps.parquet (whose reader names that)."""
    mixed = mixed_run_problem(run_dir)
    if mixed:  # one run's steps judged by another's summary, or beside another's requests
        return mixed
    summary = read_summary(run_dir)  # read once for the three checks
    simulated = _simulated(summary)
    if simulated:
        return f"run folder {run_dir} is a simulation (cost model {simulated}); {remedy}"
    timed_by = str(summary.get("cost_model") or "")
    if CLIENT_TIMING in timed_by:  # its steps.parquet is empty: refused as "recorded by an older engine?", or an
        # empty table at exit 0
        return f"run folder {run_dir} was timed by a client ({timed_by}) and logged no engine steps; {remedy}"
    if not summary and run_dir.is_dir() and (run_dir / "steps.parquet").is_file():
        # Without it a simulated run (its summary.json removed) was read as if a GPU had run it.
        return (f"run folder {run_dir} has no readable summary.json; expected an engine.replay output folder (its "
                "summary.json tells a GPU run from a simulation)")
    if summary and summary.get("cost_model") != MEASURED:
        # Any other summary.json (another tool's, or one edited by hand) was read as a GPU run's: its steps judged
        # the cost model at exit 0. engine.replay has written "measured" since its first version.
        return (f"run folder {run_dir}: its summary.json names cost model {summary.get('cost_model')!r}, not "
                f"engine.replay's {MEASURED!r}; {remedy}")
    return None
