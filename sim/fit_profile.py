"""Refit a measured profile's cost model without re-measuring: ``python -m sim.fit_profile PROFILE.json``."""

from __future__ import annotations

import os
from pathlib import Path

from engine.core.config_args import OneLineErrorParser
from engine.core.interrupt import EACH_FILE_WHOLE, exit_130_on_interrupt, exit_when_done
from engine.core.messages import escape_controls
from sim.profiled_cost_model import describe_held_out, fit_profile, read_profile, write_profile


@exit_130_on_interrupt(EACH_FILE_WHOLE)
def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m sim.fit_profile", description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", help="profile JSON files written by python -m sim.profile")
    args = parser.parse_args(argv)
    # Every profile is read and refitted before any is written: a bad one later on the command line left the ones
    # before it rewritten, after an error that said nothing of them.
    fitted = []
    seen: dict[Path, str] = {}
    for given in args.profiles:
        path = Path(given)
        # As sim.calibrate refuses a run folder given twice: the same file (by any spelling) was refitted and
        # rewritten once per mention, and printed as many times as if it were several profiles.
        real = Path(os.path.realpath(path))  # Path.resolve raised a RuntimeError traceback on a symbolic link loop
        if real in seen:
            parser.exit(2, f"error: profile {given} is given twice (also as {seen[real]}); give each profile once\n")
        seen[real] = given
        try:
            profile = read_profile(path)  # its errors name the file
        except ValueError as exc:
            parser.exit(2, f"error: {exc}\n")
        try:
            profile["fit"] = fit_profile(profile)
        except ValueError as exc:
            parser.exit(2, f"error: {path}: {exc}\n")
        fitted.append((path, profile))
    for path, profile in fitted:
        try:
            write_profile(path, profile)
        except (OSError, ValueError) as exc:  # both name the file
            parser.exit(2, f"error: {exc}\n")
        held = profile["fit"]["held_out"]
        by_family = f" by family {held['mean_abs_rel_error_by_family']}" if held.get("num_points") else ""
        print(f"{escape_controls(path)}: {len(profile['points'])} points; {describe_held_out(held)}{by_family}")
    return 0


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
