"""Session 45 (helper C) hostile-input probes: a num_images of NaN (pandas' missing value, an unknown count) was
counted as a request with images ("(nan in all)"); and sim.profile with a short --max-model-len built grid points
longer than it (several prefills at once, the decode step after an eager one), whose every step failed with a
traceback while their times went into the profile, at exit 0; with one below every point it measured nothing and
blamed the KV cache."""

from __future__ import annotations

import polars as pl
import pytest

from sim.limits import images_warning
from sim.profile import build_grid
from tests.sim.helpers import save_tiny_qwen3


def test_a_nan_image_count_is_no_image() -> None:
    frame = pl.DataFrame({"request_id": [0, 1, 2], "num_images": [float("nan"), 2.0, float("nan")]})
    warning, = images_warning(frame)
    assert warning["value"] == 1
    assert warning["message"].startswith("1 of 3 requests carry images (2 in all, the trace's num_images)")
    assert images_warning(frame.with_columns(pl.lit(float("nan")).alias("num_images"))) == []


def _longest_sequence(point) -> int:
    """The most tokens one sequence of a grid point holds, with the tokens its timed steps add."""
    lengths = [c + q + 2 for c, q in point.prefill]
    lengths += [ctx + 16 for num, ctx in (point.decode, point.long_decode) if num]
    return max(lengths)


@pytest.mark.parametrize("max_model_len", [300, 1000, 2100])
def test_every_grid_point_fits_max_model_len(max_model_len) -> None:
    grid = build_grid(256, 8192, max_model_len, 10**9, quick=False)
    assert max(map(_longest_sequence, grid)) <= max_model_len
    # What the limit leaves: prefill chunks and decode batches that fit, several prefills of short chunks at once.
    assert {"decode", "prefill", "multi_prefill"} <= {point.family for point in grid}


def test_a_grid_within_max_model_len_keeps_every_family_that_fits() -> None:
    grid = build_grid(256, 8192, 1000, 10**9, quick=False)
    after_eager = {(p.decode[1], p.prefill[0][1]) for p in grid if p.family == "decode_after_eager"}
    assert after_eager == {(512, 256)}  # of contexts 512 and 2048 with chunks 256 and 2048: the one that fits
    multi = sorted({(len(p.prefill), p.prefill[0][1]) for p in grid if p.family == "multi_prefill"})
    assert multi == [(4, 512), (8, 256), (16, 128), (32, 64)]  # not 2 x 1024, 3 x 1500 nor 4 x 2048


def test_a_max_model_len_below_every_point_is_one_line(tmp_path, capsys) -> None:
    from sim.profile import main as profile_main

    save_tiny_qwen3(tmp_path / "model", max_position_embeddings=512)
    capsys.readouterr()  # what saving it printed
    with pytest.raises(SystemExit) as refused:
        profile_main(["--model", str(tmp_path / "model"), "--device", "cpu", "--quick", "--max-model-len", "10",
                      "--out", str(tmp_path / "profile.json")])
    assert refused.value.code == 2
    assert capsys.readouterr().err == ("error: --max-model-len 10: no grid point fits within it; expected room for at "
                                       "least the shortest prefill chunk and its output\n")
    assert not (tmp_path / "profile.json").exists()
