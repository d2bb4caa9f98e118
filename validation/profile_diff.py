"""Two measured profiles of one deployment, grid point by grid point: ``python validation/profile_diff.py A.json B.json
[--family mixed]``.

For the grid points both profiles measured (same family, decode batch, prefill chunks and long context), prints the
median, smallest and largest ratio B / A of their median step times per family and batch class (below and from 32
decode rows, where the scheduler's large-batch path starts: engine.core.steady_decodes), and with ``--family`` every
point of that family with both times, their difference and the rows B's timed step checked one by one. Two profiles
measured minutes apart on one machine differ by a few % all over (the host's speed drifts); a ratio well apart from
the rest points at a change in what the grid times.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.config_args import OneLineErrorParser  # noqa: E402

LARGE_BATCH = 32  # engine.core.scheduler._MIN_STEADY_ROWS


def _key(point: dict) -> tuple:
    return (point["family"], tuple(point["decode"]), tuple(map(tuple, point["prefill"])),
            tuple(point.get("long_decode", (0, 0))))


def _points(path: Path) -> dict[tuple, dict]:
    """The profile's grid points by what they time; ValueError naming the file (and the point) otherwise."""
    from sim.profiled_cost_model import read_profile

    profile = read_profile(path)  # a regular file of JSON that sim.profile wrote: its errors name the file
    points = {}
    for i, point in enumerate(profile["points"]):
        try:
            key = _key(point)
            hash(key)
        except (KeyError, TypeError):
            raise ValueError(f"{path}: points[{i}]: expected 'decode' (a list), 'prefill' (a list of lists) and "
                             "'long_decode' (a list, if any) as sim.profile writes them") from None
        points[key] = point
    return points


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    # As typed, not Path: the parser refuses an empty one, where Path("") was ".: cannot read the profile".
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--family", help="also list every point of this family")
    args = parser.parse_args(argv)
    try:  # bad input is exit 2 and one line, as for every tool (SystemExit with a message was exit 1)
        a, b = _points(Path(args.a)), _points(Path(args.b))
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    common = [k for k in a if k in b]
    if not common:
        parser.exit(2, f"error: {args.a} and {args.b} share no grid point; expected two profiles of one grid\n")
    families = sorted({k[0] for k in common})
    if args.family is not None and args.family not in families:  # it printed the list's heading over no point
        parser.exit(2, f"error: --family {args.family!r}: no common grid point of that family; expected one of "
                       f"{', '.join(families)}\n")
    groups: dict[tuple[str, str], list[float]] = {}
    for k in common:
        rows = k[1][0] + k[3][0]
        group = (k[0], f"{'>=' if rows >= LARGE_BATCH else '<'} {LARGE_BATCH} decode rows")
        groups.setdefault(group, []).append(b[k]["median_s"] / a[k]["median_s"])
    print(f"B / A, median step times of {len(common)} common grid points (A {args.a}, B {args.b})")
    for (family, rows), ratios in sorted(groups.items()):
        print(f"  {family:20s} {rows:20s} {len(ratios):3d} points: median {statistics.median(ratios):.3f}, "
              f"range {min(ratios):.3f}-{max(ratios):.3f}")
    if args.family:
        print(f"{args.family}: decode (rows, context), prefill (cached, new) per chunk; A ms, B ms, A - B ms, "
              "rows B checked one by one")
        for k in sorted(k for k in common if k[0] == args.family):
            ta, tb = 1e3 * a[k]["median_s"], 1e3 * b[k]["median_s"]
            print(f"  {k[1]} {list(k[2])} {ta:8.2f} {tb:8.2f} {ta - tb:+7.2f}  {b[k].get('checked_rows', 'n/a')}")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
