"""How much slower than on the profiling grid the serving host runs, over simulated time.

An eager step is bound by Python launching every kernel of every layer, so its time scales with the
host CPU's speed; a CUDA-graph decode step's fixed part does too, in part. On the H200 machines
used here that speed is not constant: ``engine.replay --step-timings`` shows episodes of seconds in
which all host code (input preparation and kernel launches alike) runs up to 1.8x slower while
the GPU clock stays put (validation/README.md). A ``HostSpeed`` gives the slowdown at a time;
the cost models scale their host-bound parts by it.

``--host-slowdown`` takes:
- ``calibrated`` (default): the profile's average serving slowdown (``python -m sim.calibrate``), 1 if none;
- a number: that slowdown throughout (1 = the profiling grid's conditions);
- ``episodes:NORMAL,SLOW,FRACTION,MEAN_S[,SEED]``: a seeded random two-state process: slowed by SLOW for
  about FRACTION of the time, in episodes of MEAN_S seconds on average, and by NORMAL otherwise (drawn from
  --seed plus SEED plus the replica's index);
- a CSV path with columns ``start_s,slowdown``: a measured timeline (``python -m sim.host_speed``
  extracts one from a GPU replay), from start_s 0, each value holding until the next row.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine.core.config_args import OneLineErrorParser, nonempty
from engine.core.interrupt import exit_130_on_interrupt, exit_when_done, outputs_in_place
from engine.core.messages import escape_controls

MAX_WINDOWS = 1_000_000  # rows of an extracted timeline
SLOW_WINDOW = 1.3  # a window this much slower than the grid counts as slow in the summary line


class HostSpeed(Protocol):
    name: str

    def slowdown_at(self, t_s: float) -> float: ...

    def forget_before(self, now_s: float) -> None:
        """The simulation's clock is at ``now_s``: no step starts before it again (so no query comes before it)."""

    def piece_at(self, t_s: float) -> tuple[float, float]:
        """(``slowdown_at(t_s)``, the time it holds until): every query from ``t_s`` up to (not at) that time gives
        the same slowdown, so a run of steps starting then is priced with one (sim.runner's array passes)."""


# A host this many times faster or slower than the profiling grid is no serving host; beyond it step times
# overflow or underflow the run's sums (1e308 gave infinite latencies and numpy overflow warnings).
MIN_SLOWDOWN, MAX_SLOWDOWN = 1e-3, 1e3
# Steps last milliseconds: shorter episodes change nothing measurable, and 1e-300 s ones never ended drawing.
MIN_EPISODE_S = 1e-3
# A profile's recorded slow share (serving.host_episodes.slow_share_range) is 0 or at least this: a smaller one is
# none, and its normal periods' mean (MEAN_S / share) overflowed a float.
MIN_SLOW_SHARE = 1e-9
# A gap between queries of this many mean episode cycles is drawn no further (it could take forever, e.g. up
# to an arrival at 1e300 s): the state after it is independent of the one before (their correlation is below
# exp(-4 * cycles)), so the process restarts. A million cycles drew 2e6 periods per idle gap: 20 requests 2,000 s
# apart at MEAN_S 0.001 took 10 s and 640 MB, the 2,000 of sharegpt.parquet would have taken hours.
MAX_CYCLES_DRAWN = 100
# Periods that ended before the simulation's clock are dropped once this many have: a long run of short episodes
# kept every period it drew, one float per millisecond of simulated time at MEAN_S 0.001.
FORGET_PERIODS = 4096


def _is_slowdown(value: float) -> bool:
    return MIN_SLOWDOWN <= value <= MAX_SLOWDOWN  # NaN fails both comparisons


def _slowdown_error(what: str, value: object) -> ValueError:
    return ValueError(f"{what} must be a finite number from {MIN_SLOWDOWN:g} to {MAX_SLOWDOWN:g}, got {value}")


@dataclass(frozen=True)
class ConstantHostSpeed:
    slowdown: float

    def __post_init__(self) -> None:
        if not _is_slowdown(self.slowdown):
            raise _slowdown_error("a host slowdown", self.slowdown)

    @property
    def name(self) -> str:
        return f"{self.slowdown:g}"

    def slowdown_at(self, t_s: float) -> float:
        return self.slowdown

    def forget_before(self, now_s: float) -> None:
        """Nothing drawn, nothing to forget."""

    def piece_at(self, t_s: float) -> tuple[float, float]:
        return self.slowdown, math.inf


class HostSpeedTimeline:
    """Piecewise constant: ``slowdowns[i]`` from ``starts_s[i]`` until the next start."""

    def __init__(self, starts_s: list[float], slowdowns: list[float], name: str = "timeline") -> None:
        if not starts_s or len(starts_s) != len(slowdowns):
            raise ValueError("a host-speed timeline needs at least one (start_s, slowdown) row")
        if not all(math.isfinite(t) for t in starts_s) or any(b <= a for a, b in zip(starts_s, starts_s[1:])):
            raise ValueError("host-speed timeline: start_s must be finite and increase from row to row")
        if not all(_is_slowdown(s) for s in slowdowns):
            raise _slowdown_error("host-speed timeline: every slowdown",
                                 next(s for s in slowdowns if not _is_slowdown(s)))
        self.starts_s = list(starts_s)
        self.slowdowns = list(slowdowns)
        self.name = name

    def slowdown_at(self, t_s: float) -> float:
        return self.slowdowns[max(0, bisect.bisect_right(self.starts_s, t_s) - 1)]

    def piece_at(self, t_s: float) -> tuple[float, float]:
        row = bisect.bisect_right(self.starts_s, t_s)  # the rows that start by t_s; the next one ends its value
        return self.slowdowns[max(0, row - 1)], self.starts_s[row] if row < len(self.starts_s) else math.inf

    def forget_before(self, now_s: float) -> None:
        """The timeline is the user's file, bounded by it: kept whole."""

    @classmethod
    def load_csv(cls, path: Path) -> HostSpeedTimeline:
        try:
            starts, values = _read_timeline_rows(path)
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not UTF-8 text; expected a CSV file with the columns start_s,slowdown") \
                from None
        except csv.Error as exc:
            raise ValueError(f"{path}: not a readable CSV file ({exc}); expected the columns start_s,slowdown") \
                from None
        try:
            return cls(starts, values, name=f"timeline:{Path(path).name}")
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def write_csv(self, path: Path) -> None:
        """Written whole or not at all (beside ``path``, then renamed into place)."""
        from io import StringIO

        from sim.files import write_text_atomic

        text = StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(["start_s", "slowdown"])
        # Starts to 12 significant digits, not 3 decimals: windows under 1 ms got equal starts (a file load_csv
        # refuses) and shifted by up to 0.5 ms. Twelve tell apart the MAX_WINDOWS starts of any window length and
        # keep w * window_s readable (0.3, not 0.30000000000000004).
        writer.writerows((float(f"{t:.12g}"), round(s, 4)) for t, s in zip(self.starts_s, self.slowdowns))
        write_text_atomic(Path(path), text.getvalue())


def _read_timeline_rows(path: Path) -> tuple[list[float], list[float]]:
    """The (start_s, slowdown) rows of a timeline CSV, each checked with its line: a timeline starts at the run's
    start (0 s), like those sim.host_speed writes; a row with more or fewer fields, a quote never closed or a column
    besides the two is a damaged file (an open quote on the last line was read as the rest of the file, and a third
    column was dropped unsaid)."""
    starts, values = [], []
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's export starts with a BOM
        reader = csv.DictReader(f, strict=True)
        try:
            names = reader.fieldnames
        except csv.Error as exc:
            raise ValueError(f"{path}, line 1: {_csv_problem(exc)}; expected the header start_s,slowdown") from None
        if names is None:  # was "got None"
            raise ValueError(f"{path}: the file is empty; expected a CSV file with the header start_s,slowdown")
        if len(names) != 2 or set(names) != {"start_s", "slowdown"}:
            raise ValueError(f"{path}: expected the columns start_s,slowdown (and no others), got {names}")
        rows = iter(reader)
        while True:
            start_line = reader.line_num + 1  # where the next record starts (a quoted field may span lines)
            try:
                row = next(rows, None)
            except csv.Error as exc:
                raise ValueError(f"{path}, line {start_line}: {_csv_problem(exc)}; expected a CSV record of 2 "
                                 "fields") from None
            if row is None:
                break
            line = reader.line_num
            if None in row or None in row.values():
                fields = len(reader.fieldnames) + len(row.get(None) or ()) - sum(v is None for v in row.values())
                raise ValueError(f"{path}, line {line}: {fields} fields; expected {len(reader.fieldnames)}, as in "
                                 "the header")
            try:
                start, value = finite_float(row["start_s"]), finite_float(row["slowdown"])
            except ValueError:
                raise ValueError(f"{path}, line {line}: start_s and slowdown must be finite numbers, got "
                                 f"{row}") from None
            if not starts and start != 0:
                raise ValueError(f"{path}, line {line}: the first start_s is {start:g}; expected 0 (the timeline "
                                 "starts with the run)")
            if starts and start <= starts[-1]:
                raise ValueError(f"{path}, line {line}: start_s {start:g} after {starts[-1]:g}; expected start_s to "
                                 "increase from row to row")
            starts.append(start)
            values.append(value)
    return starts, values


def _csv_problem(exc: csv.Error) -> str:
    """The csv module's complaint, said as traces.formats.tabular says it."""
    return "a quoted field is never closed" if "end of data" in str(exc) else str(exc)


class HostSpeedEpisodes:
    """Alternating normal and slow periods with exponential lengths (means chosen so the slow share is
    ``fraction``), drawn from ``seed`` as simulated time advances."""

    def __init__(self, normal: float, slow: float, fraction: float, mean_episode_s: float, seed: int = 0) -> None:
        if not (_is_slowdown(normal) and _is_slowdown(slow) and 0.0 <= fraction < 1.0
                and MIN_EPISODE_S <= mean_episode_s < math.inf):
            raise ValueError(
                f"episodes need NORMAL and SLOW from {MIN_SLOWDOWN:g} to {MAX_SLOWDOWN:g}, 0 <= FRACTION < 1 and "
                f"a finite MEAN_S >= {MIN_EPISODE_S:g} s; got {normal}, {slow}, {fraction}, {mean_episode_s}"
            )
        if slow < normal:  # the slow periods would be the fast ones: the arguments are swapped
            raise ValueError(f"episodes need SLOW >= NORMAL (SLOW is the slowdown of the slow periods); got NORMAL "
                             f"{normal:g}, SLOW {slow:g}")
        mean_normal_s = mean_episode_s * (1.0 - fraction) / fraction if fraction > 0 else float("inf")
        # The normal periods' mean must be a float: MEAN_S 1e308 at FRACTION 0.1 (or any MEAN_S at FRACTION 1e-320)
        # overflowed it to inf, and the first draw, expovariate(1 / inf), was a ZeroDivisionError traceback mid-run.
        if fraction > 0 and not math.isfinite(mean_normal_s):
            raise ValueError(f"FRACTION {fraction:g} and MEAN_S {mean_episode_s:g} s make the normal "
                             "periods' mean, MEAN_S * (1 - FRACTION) / FRACTION, overflow; expected a larger FRACTION "
                             "(or 0, for no slow periods) or a smaller MEAN_S")
        self.normal, self.slow, self.fraction, self.mean_episode_s = normal, slow, fraction, mean_episode_s
        self.name = f"episodes:{normal:g},{slow:g},{fraction:g},{mean_episode_s:g}"
        self._rng = random.Random(seed)
        self._mean_normal_s = mean_normal_s
        self._ends_s: list[float] = []  # end of each period; even index: normal, odd: slow
        self._horizon_s = 0.0
        # Start as a host already running is found: slow with probability `fraction` (exponential periods are
        # memoryless, so what is left of a period under way has the period's own law). Always starting normal left
        # runs shorter than a normal period (12 s at the bands' default 25 %) almost without slow time: a 2-s run
        # at episodes:1,3,0.5,4 averaged 1.39x, not 2x. Drawn from a stream of its own: the periods' draws stay.
        if fraction > 0 and random.Random(f"start:{seed}").random() < fraction:
            self._ends_s.append(0.0)  # an empty normal period: the first one drawn is slow

    def slowdown_at(self, t_s: float) -> float:
        if self.fraction == 0:
            return self.normal
        if t_s - self._horizon_s > MAX_CYCLES_DRAWN * (self._mean_normal_s + self.mean_episode_s):
            if len(self._ends_s) % 2:  # the next period would be slow: close it empty, so a normal one follows
                self._ends_s.append(self._horizon_s)
            self._horizon_s = t_s  # normal over the whole gap, drawn afresh from t_s
            self._ends_s.append(t_s)  # the next period drawn is slow...
            # ...with probability `fraction` only, as at the start: the restart was always slow, so a trace of Unix
            # timestamps (first arrival ~1.7e9 s, one such gap) always began in a slow episode.
            if self._rng.random() >= self.fraction:
                self._ends_s.append(t_s)  # an empty slow period: a normal one is drawn from t_s
        while self._horizon_s <= t_s:
            mean = self._mean_normal_s if len(self._ends_s) % 2 == 0 else self.mean_episode_s
            # At least one float step: far out in time (1e300 s) an episode is shorter than the clock's resolution.
            self._horizon_s = max(self._horizon_s + self._rng.expovariate(1.0 / mean),
                                  math.nextafter(self._horizon_s, math.inf))
            self._ends_s.append(self._horizon_s)
        period = bisect.bisect_right(self._ends_s, t_s)
        return self.slow if period % 2 else self.normal

    def piece_at(self, t_s: float) -> tuple[float, float]:
        """The period ``t_s`` falls in and its end. A later query before that end draws nothing (the periods are
        drawn past it already, and a restart needs a gap of MAX_CYCLES_DRAWN cycles from them), so it gives the same
        slowdown whether asked or not."""
        slowdown = self.slowdown_at(t_s)
        if self.fraction == 0:
            return slowdown, math.inf
        return slowdown, self._ends_s[bisect.bisect_right(self._ends_s, t_s)]

    def forget_before(self, now_s: float) -> None:
        """Drop the periods that ended by ``now_s``, in an even number: a period's parity (normal or slow) is its
        index's, and every later query's index moves by the number dropped. Called every step: fewer periods than
        FORGET_PERIODS are kept as they are, without a search."""
        if len(self._ends_s) < FORGET_PERIODS:
            return
        ended = bisect.bisect_right(self._ends_s, now_s) & ~1
        if ended >= FORGET_PERIODS:
            del self._ends_s[:ended]


def finite_float(text: str) -> float:
    """``float(text)``, refusing nan and infinities (ValueError)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not finite")
    return value


def parse_host_slowdown(spec: str, seed: int = 0) -> HostSpeed | None:
    """``--host-slowdown``: None for ``calibrated`` (the cost model's own average)."""
    spec = spec.strip()
    if spec == "calibrated":
        return None
    if spec.startswith("episodes:"):
        parts = spec.removeprefix("episodes:").split(",")
        try:
            if len(parts) == 5:  # an own seed: other slow periods for the same synthesized prompts (sim.bands)
                extra = int(parts.pop())
                if not 0 <= extra < 2**62:
                    raise ValueError
                seed += extra
            normal, slow, fraction, mean_s = (finite_float(p) for p in parts)
        except ValueError:
            # The SEED's bound is the one checked above: "an integer >= 0" refused 2**62 without saying why.
            raise ValueError(
                f"--host-slowdown {spec!r}: expected episodes:NORMAL,SLOW,FRACTION,MEAN_S (four finite numbers) "
                "and optionally ,SEED (an integer from 0 to 2**62 - 1)"
            ) from None
        try:
            return HostSpeedEpisodes(normal, slow, fraction, mean_s, seed)
        except ValueError as exc:
            raise ValueError(f"--host-slowdown {spec!r}: {exc}") from None
    try:
        value = float(spec)
    except ValueError:
        value = None
    if value is None:
        from traces.files import existing_path

        path = existing_path(spec)  # None also for a text too long to be a file name
        if spec.lower().endswith(".csv") and not (path is not None and path.is_file()):
            what = "does not exist" if path is None else "is a directory" if path.is_dir() else \
                "is not a regular file"
            raise ValueError(f"--host-slowdown {spec!r}: the file {what}; expected a CSV file (start_s,slowdown)")
        if path is None or not path.is_file():
            raise ValueError(
                f"--host-slowdown {spec!r}: expected 'calibrated', a number, episodes:NORMAL,SLOW,FRACTION,MEAN_S "
                "or a CSV file (start_s,slowdown)"
            ) from None
        return HostSpeedTimeline.load_csv(path)
    if value <= 0:
        raise ValueError(f"--host-slowdown must be > 0, got {value}")
    if not _is_slowdown(value):
        raise _slowdown_error("--host-slowdown", spec)
    return ConstantHostSpeed(value)


def timeline_from_run(
    run_dir: Path, profile_path: Path, window_s: float = 2.0, min_steps: int = 100, min_steps_per_window: int = 3
) -> HostSpeedTimeline:
    """The host slowdown of a GPU replay over time: per window, the median over its host-bound eager steps of their
    host part (real time less the profile's calibrated device part, ProfiledCostModel.host_time) over the grid's;
    a window with fewer than ``min_steps_per_window`` of them keeps the last value. Too few such steps in all: an
    error. A step's real time is its period where the engine went straight on, as ``sim.calibrate`` reads it: the
    timeline replaces the host factor fitted so, and the loop's work between steps is time the back-to-back simulator
    counts in its steps (read as durations, 0.1 ms of loop work a step gave 1.00x where sim.calibrate gave 1.03x, and
    a replay with the timeline came out 2.5 % faster than the calibrated one)."""

    from sim.batch_features import read_steps
    from sim.host_episodes import run_windows  # it imports this module
    from sim.profiled_cost_model import ProfiledCostModel, _is_graph_step

    model = ProfiledCostModel.load(Path(profile_path))  # eager_parts is at the grid's speed, calibrated or not
    host_bound = []
    for f, real, start in read_steps(run_dir, periods=True):  # periods: see the docstring
        if _is_graph_step(f, model.max_graph_bs):
            continue
        host = model.host_time(f, real)
        if host is not None:  # host-bound on the grid
            host_bound.append((*host, start))
    if len(host_bound) < min_steps:
        raise ValueError(f"{run_dir}: {len(host_bound)} host-bound eager steps, too few (< {min_steps}) to read the "
                         f"host's speed from")
    steps = Path(run_dir) / "steps.parquet"
    reach_s = max(h[-1] for h in host_bound)
    # One row per window up to the last: bound them, or a tiny window never finishes. Before the steps are put in
    # windows: a window so short that a start over it overflows a float (--window-s 1e-320) was an OverflowError
    # traceback there.
    if reach_s / window_s >= MAX_WINDOWS:
        raise ValueError(f"{steps}: column 'start_s' reaches {reach_s:.4g} s, which --window-s {window_s:g} cuts into "
                         f"more than {MAX_WINDOWS:,} windows, the most a timeline holds (use a longer window)")
    by_window = run_windows(host_bound, window_s, min_steps_per_window)
    if not by_window:
        raise ValueError(f"{run_dir}: no {window_s:g}-s window has {min_steps_per_window} host-bound eager steps")
    last = max(by_window)
    times, values, value = [], [], by_window[min(by_window)]
    for w in range(last + 1):
        value = by_window.get(w, value)  # a window without enough steps keeps the last value
        if not _is_slowdown(value):  # step times no host gives: a damaged table, named, not a bare timeline error
            raise ValueError(f"{steps}: column 'duration_s': the host-bound steps from {w * window_s:g} s ran "
                             f"{value:.4g}x their grid time; expected {MIN_SLOWDOWN:g} to {MAX_SLOWDOWN:g}")
        times.append(w * window_s)
        values.append(value)
    return HostSpeedTimeline(times, values, name=f"timeline:{Path(run_dir).name}")


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="python -m sim.host_speed",
        description="Extract a host-slowdown timeline from a GPU replay, for sim.replay --host-slowdown FILE.csv.",
    )
    parser.add_argument("run", help="engine.replay output folder (its steps.parquet)")
    # nonempty: "" was Path(""), the current folder: "cost model .: not a readable profile (IsADirectoryError ...)"
    parser.add_argument("--profile", required=True, type=nonempty,
                        help="the measured profile JSON of that model and GPU")
    parser.add_argument("--window-s", type=float, default=2.0, help="window length in seconds (default: %(default)s)")
    parser.add_argument("--out", required=True, help="CSV to write (start_s,slowdown)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    if not 0 < args.window_s < math.inf:
        parser.exit(2, f"error: --window-s must be a finite number of seconds > 0, got {args.window_s}\n")
    from sim.calibrate import _other_deployment, _sampled_with
    from sim.files import RUN_FILES, check_output_path, read_json_input
    from sim.run_kind import gpu_run_problem

    # A simulation's step times are a cost model's: the timeline would be the model's, not the host's. A simulated
    # run whose summary.json was removed gave a timeline of the cost model's own host slowdown at exit 0.
    not_gpu = gpu_run_problem(Path(args.run), "extract a timeline from an engine.replay run")
    if not_gpu:
        parser.exit(2, f"error: {not_gpu}\n")
    sampled = _sampled_with(Path(args.run))
    if sampled:  # its steps took what the sampler adds too, which the grid's greedy ones did not: read as slowness
        parser.exit(2, f"error: run folder {args.run} sampled its requests ({sampled}); extract a timeline from a "
                       "greedy engine.replay run (no --temperature)\n")
    try:
        profile = json.loads(read_json_input(Path(args.profile)))
    except (OSError, ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        profile = None  # timeline_from_run names what is wrong with it
    other = _other_deployment(Path(args.run), profile) if isinstance(profile, dict) else None
    if other:  # another model's steps over this profile's grid: a timeline of the model gap, not the host's speed
        parser.exit(2, f"error: run folder {args.run} was recorded with {other} ({args.profile}); give the profile "
                       "of the run's deployment\n")
    # The run folder's files count as inputs: its summary.json is read too, and was replaced by the CSV.
    run_files = [Path(args.run) / name for name in sorted(RUN_FILES)]
    problem = check_output_path(args.out, "--out", [Path(args.profile), *run_files],  # as typed: keeps a trailing '/'
                                overwrite=args.overwrite)
    if problem:  # found before the run is read, and never an input overwritten
        parser.exit(2, f"error: {problem}\n")
    try:
        timeline = timeline_from_run(Path(args.run), Path(args.profile), args.window_s)
    except (OSError, ValueError, KeyError) as exc:
        parser.exit(2, f"error: {exc}\n")
    try:
        timeline.write_csv(Path(args.out))
    except OSError as exc:
        parser.exit(2, f"error: --out {args.out}: {exc.strerror or exc}\n")
    values = timeline.slowdowns
    slow = sum(v > SLOW_WINDOW for v in values) / len(values)
    with outputs_in_place(f"{escape_controls(args.out)} is complete"):  # a Ctrl-C now says it is whole
        print(f"{escape_controls(args.out)}: {len(values)} windows of {args.window_s:g} s; slowdown min "
              f"{min(values):.2f}, median {sorted(values)[len(values) // 2]:.2f}, max {max(values):.2f}; "
              f"{slow:.0%} of windows over {SLOW_WINDOW}x")
    return 0


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
