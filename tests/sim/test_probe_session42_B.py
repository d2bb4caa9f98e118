"""Probe B (session 42): the simulator on traces it was never shown, in the layouts the converters claim.

What the probe found: a replay of the Azure 2025 multimodal trace (``AzureLMMInferenceTrace_multimodal.csv.gz``, which
traces.convert keeps with its ``NumImages`` as ``num_images``) ran at exit 0 with a summary that said nothing of its
images: the simulated model is text only, no step encodes an image, and every such request's prefill was priced on
its ``prompt_tokens`` alone. Expected: summary.json's ``warnings`` (printed, and in the report) name it, as they name
the other ways a run leaves what the simulator measured.
"""

from __future__ import annotations

import gzip
import json

import polars as pl

from cli.sim_replay import main as sim_main
from sim.limits import images_warning
from traces.convert import main as convert_main

# The multimodal trace's layout (tests/traces/test_convert_public_variants.py): gzip'd, times like
# '2024-10-15T12:00:00.269Z', NumImages before the token counts; a request without images beside two with.
MULTIMODAL_CSV = ("TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
                  "2024-10-15T12:00:00.269Z,0,770,491\n"
                  "2024-10-15T12:00:01.000Z,2,1200,30\n"
                  "2024-10-15T12:00:02.500Z,16,5000,8\n")
MESSAGE = ("2 of 3 requests carry images (18 in all, the trace's num_images), which the simulated model, text only, "
           "never sees: their prefills are priced on prompt_tokens alone, without encoding the images")


def _requests(num_images: list) -> pl.DataFrame:
    n = len(num_images)
    return pl.DataFrame({"request_id": list(range(n)), "arrival_s": [float(i) for i in range(n)],
                         "prompt_tokens": [10] * n, "output_tokens": [5] * n, "num_images": num_images})


def test_a_replay_of_the_multimodal_trace_names_its_images(tmp_path, capsys) -> None:
    source = tmp_path / "AzureLMMInferenceTrace_multimodal.csv.gz"
    source.write_bytes(gzip.compress(MULTIMODAL_CSV.encode()))
    trace = tmp_path / "mm.parquet"
    assert convert_main(["azure", str(source), "-o", str(trace)]) == 0
    out = tmp_path / "run"
    assert sim_main([str(trace), "--out", str(out), "--no-report"]) == 0
    warnings = json.loads((out / "summary.json").read_text())["warnings"]
    assert warnings == [{"code": "images_not_simulated", "message": MESSAGE, "value": 2, "limit": 0}]
    assert f"warning [images_not_simulated]: {MESSAGE}\n" in capsys.readouterr().out
    # As replayed: --limit 1 keeps only the request without images, and no warning.
    assert sim_main([str(trace), "--limit", "1", "--out", str(tmp_path / "first"), "--no-report", "--quiet"]) == 0
    assert json.loads((tmp_path / "first" / "summary.json").read_text())["warnings"] == []


def test_images_warning_counts_requests_with_images_and_ignores_other_columns() -> None:
    warning, = images_warning(_requests([None, 1.0, 0.0, 3.0]))  # pandas' floats, a missing count
    assert warning["value"] == 2
    assert warning["message"].startswith("2 of 4 requests carry images (4 in all, the trace's num_images)")
    assert images_warning(_requests([0, 0])) == []  # the multimodal trace's text-only requests
    assert images_warning(_requests(["two", "none"])) == []  # a column of that name that is no count
    assert images_warning(_requests([1]).drop("num_images")) == []
