"""How preemptions under KV pressure follow the host's speed: the KV-pressure run simulated at several host slowdowns.

    python validation/kv_sensitivity.py [--slowdowns calibrated,1.0,1.2,1.5] [--json OUT]

Simulates plan run ``d-azure-kv`` of ``validation/compare_all.py`` (the Azure slice at ~70 %, 300 KV blocks, as
``validation/run_gpu.sh kv-pressure`` runs it on the GPU) once per ``--host-slowdown`` value and prints, per value,
the preemptions and TPOT / TTFT p90: a cache this tight sits on a cliff, where a few per cent more time per step
keeps more requests running at once and each one more fills the cache.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from validation.compare_all import PLAN, TRACES  # noqa: E402

RUN = "d-azure-kv"
KV_BLOCKS = 300  # validation/run_gpu.sh's KV_BLOCKS_AZURE


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowdowns", default="calibrated,1.0,1.2,1.5",
                        help="comma-separated --host-slowdown values (default: %(default)s)")
    parser.add_argument(  # as typed (not a Path): check_output_path reads a trailing '/' as a folder
        "--json", default=None, metavar="OUT", help="also write the figures here (whole, its folder made if missing)")
    args = parser.parse_args(argv)
    from cli.sim_replay import main as sim_replay
    from sim.files import check_output_path, write_text_atomic

    _, trace, options = PLAN[RUN]
    if not (TRACES / trace).is_file():
        parser.exit(2, f"error: {TRACES / trace} does not exist; expected the validation slices "
                       "(python validation/make_traces.py)\n")
    # Before the simulations: --json onto the trace replaced it, and a folder or an unwritable path failed after them.
    problem = args.json is not None and check_output_path(args.json, "--json", [TRACES / trace])
    if problem:
        parser.exit(2, f"error: {problem}\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, slowdown in enumerate(s.strip() for s in args.slowdowns.split(",")):
            out = Path(tmp) / str(i)
            code = sim_replay([str(TRACES / trace), *options, "--num-gpu-blocks", str(KV_BLOCKS),
                               "--host-slowdown", slowdown, "--out", str(out), "--quiet", "--no-report"])
            if code:
                parser.exit(2, f"error: --slowdowns {slowdown!r}: sim.replay exited {code}\n")
            summary = json.loads((out / "summary.json").read_text())
            rows.append({"host_slowdown": slowdown, "num_preemptions": summary["num_preemptions"],
                         "p90_tpot_ms": summary["tpot_ms"]["p90"], "p90_ttft_ms": summary["ttft_ms"]["p90"],
                         "cost_model": summary["cost_model"]})
            print(f"--host-slowdown {slowdown:>10}: {rows[-1]['num_preemptions']:4d} preemptions, TPOT p90 "
                  f"{rows[-1]['p90_tpot_ms']:.2f} ms, TTFT p90 {rows[-1]['p90_ttft_ms']:.1f} ms", flush=True)
    if args.json is not None:  # whole or not at all (a link is replaced, not written through)
        try:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(args.json), json.dumps({"run": RUN, "num_gpu_blocks": KV_BLOCKS, "rows": rows},
                                                          indent=1) + "\n")
        except OSError as exc:
            parser.exit(2, f"error: --json {args.json}: cannot write it ({exc.strerror or exc})\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
