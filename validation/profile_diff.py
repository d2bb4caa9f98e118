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

import argparse
import json
import statistics
import sys
from pathlib import Path

LARGE_BATCH = 32  # engine.core.scheduler._MIN_STEADY_ROWS


def _key(point: dict) -> tuple:
    return (point["family"], tuple(point["decode"]), tuple(map(tuple, point["prefill"])),
            tuple(point.get("long_decode", (0, 0))))


def _points(path: Path) -> dict[tuple, dict]:
    try:
        profile = json.loads(path.read_text())
        return {_key(p): p for p in profile["points"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"error: {path}: not a readable sim.profile JSON ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--family", help="also list every point of this family")
    args = parser.parse_args(argv)
    a, b = _points(args.a), _points(args.b)
    common = [k for k in a if k in b]
    if not common:
        raise SystemExit(f"error: {args.a} and {args.b} share no grid point")
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
    sys.exit(main())
