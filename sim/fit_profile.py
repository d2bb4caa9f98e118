"""Refit a measured profile's cost model without re-measuring: ``python -m sim.fit_profile PROFILE.json``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.files import write_text_atomic
from sim.profiled_cost_model import fit_profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.fit_profile", description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", help="profile JSON files written by python -m sim.profile")
    args = parser.parse_args(argv)
    for path in map(Path, args.profiles):
        try:
            profile = json.loads(path.read_text())
            profile["fit"] = fit_profile(profile)
        except (OSError, UnicodeDecodeError) as exc:
            parser.exit(2, f"error: {path}: cannot read the profile ({getattr(exc, 'strerror', None) or exc})\n")
        except json.JSONDecodeError as exc:
            parser.exit(2, f"error: {path}: line {exc.lineno}: not valid JSON ({exc.msg}); expected a profile "
                           "written by python -m sim.profile\n")
        except ValueError as exc:
            parser.exit(2, f"error: {path}: {exc}\n")
        try:
            write_text_atomic(path, json.dumps(profile, indent=1, allow_nan=False) + "\n")
        except OSError as exc:
            parser.exit(2, f"error: {path}: cannot write the profile ({exc.strerror or exc})\n")
        held = profile["fit"]["held_out"]
        print(f"{path}: {len(profile['points'])} points; held-out |error| mean {held['mean_abs_rel_error']:.1%}, "
              f"p90 {held['p90_abs_rel_error']:.1%}, max {held['max_abs_rel_error']:.1%} "
              f"by family {held['mean_abs_rel_error_by_family']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
