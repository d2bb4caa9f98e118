"""Checks shared by the GPU test and the Triton-interpreter test of the top-k / top-p floors
(engine.gpu.layers.sampling_kernels.filter_floors): they keep what the torch reference keeps, and draw its tokens."""

from __future__ import annotations

import torch

from engine.gpu.layers.sampler import _apply_top_k_top_p, sample_reference

# Per row: (temperature, top_k, top_p, shape of its logits). Greedy rows with filters, top-k alone, top-p alone,
# both, k of 1 and k past the vocabulary, a top_p that is 0 in float32, a flat row, a row with -inf logits, and a
# peaked one; rows without filters among them take the same pass.
ROWS = [
    (0.0, 5, 0.9, "normal"),
    (0.6, 20, 1.0, "normal"),
    (1.0, -1, 0.9, "normal"),
    (1.7, 50, 0.5, "normal"),
    (0.3, 1, 0.95, "normal"),
    (0.8, 7, 0.3, "normal"),
    (1.0, -1, 1.0, "normal"),
    (1.0, 10**9, 0.8, "normal"),
    (1.0, -1, 1e-50, "normal"),
    (0.7, 40, 0.95, "peaked"),
    (1.0, -1, 0.5, "flat"),
    (1.0, 3, 0.99, "masked"),
    (1.3, 64, 0.9, "normal"),
]


def filtered_case(vocab_size: int, dtype: torch.dtype, device: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _, _, _, shape in ROWS:
        row = torch.randn(vocab_size, generator=gen) * 3
        if shape == "peaked":
            row[torch.randint(0, vocab_size, (3,), generator=gen)] += 15.0
        elif shape == "flat":
            row = torch.zeros(vocab_size)
        elif shape == "masked":
            row[::2] = float("-inf")
        rows.append(row)
    logits = torch.stack(rows).to(dtype).to(device)
    temperatures = torch.tensor([r[0] for r in ROWS], dtype=torch.float32, device=device)
    top_ks = torch.tensor([r[1] for r in ROWS], dtype=torch.int64, device=device)
    top_ps = torch.tensor([r[2] for r in ROWS], dtype=torch.float32, device=device)
    words = torch.randint(0, 2**32, (len(ROWS), 3), generator=gen).to(device)
    return logits, temperatures, words, top_ks, top_ps


def check_floors(filter_floors, gumbel_argmax, vocab_size: int, dtype: torch.dtype, device: str, seed: int) -> None:
    """The floors keep exactly the reference's tokens, except that a run of equal logits at the top-p boundary
    stays whole (the reference's sort splits it anywhere); where the kept tokens agree, so do the draws."""
    logits, temperatures, words, top_ks, top_ps = filtered_case(vocab_size, dtype, device, seed)
    floors = filter_floors(logits, temperatures, top_ks, top_ps)
    got = gumbel_argmax(logits, temperatures, words, floors).cpu()
    expected = sample_reference(logits, temperatures, words, top_ks, top_ps).cpu()
    divisor = torch.where(temperatures == 0, 1.0, temperatures).unsqueeze(1)
    scaled = logits.float() / divisor
    kept_ref = (_apply_top_k_top_p(scaled, top_ks, top_ps) > float("-inf")).cpu()
    floor_scaled = (floors.unsqueeze(1) / divisor).cpu()
    kept = scaled.cpu() >= floor_scaled
    scaled = scaled.cpu()
    for row, (temperature, top_k, top_p, shape) in enumerate(ROWS):
        what = f"row {row} {ROWS[row]} vocab {vocab_size} {dtype}"
        if temperature == 0.0:
            assert floors[row].item() == float("-inf"), what
            assert got[row] == logits[row].float().argmax().item() == expected[row], what
            continue
        if not (0 < top_k < vocab_size) and top_p >= 1.0:
            assert floors[row].item() == float("-inf"), what
        if shape != "flat" and dtype == torch.float32:  # no equal logits: the very same tokens kept
            assert torch.equal(kept[row] & (scaled[row] > float("-inf")), kept_ref[row]), (what, kept[row].sum(),
                                                                                         kept_ref[row].sum())
        assert bool((kept[row] | ~kept_ref[row]).all()), what  # every token the reference keeps
        extra = kept[row] & ~kept_ref[row] & (scaled[row] > float("-inf"))
        assert bool((scaled[row][extra] == floor_scaled[row, 0]).all()), what  # ... and ties with the floor
        assert kept[row, got[row]], what
        if not extra.any():
            assert got[row] == expected[row], what
    top_k_rows = [r for r, row in enumerate(ROWS) if 0 < row[1] < vocab_size and row[0] > 0 and row[2] >= 1.0]
    for row in top_k_rows:  # top-k alone: at least k kept, exactly k where the k-th logit has no equal
        assert kept[row].sum() >= ROWS[row][1]
