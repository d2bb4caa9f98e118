"""What attention needs to know about one step's flattened batch.

Tokens are laid out decode rows first (one token each), then prefill chunks back to back. Every
new token's K and V are written to ``slot_mapping`` before attention reads the cache, so a chunk
attends to its cached prefix and to itself through the same paged path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.gpu.attention.triton_kernels_host import NO_SPLITS, DecodeSplits


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; -1 = padding, not stored
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None = None  # [num_decode, max_blocks] int32
    decode_context_lens: torch.Tensor | None = None  # [num_decode] int32, the new token included
    decode_splits: DecodeSplits = NO_SPLITS
    decode_long_seqs: torch.Tensor | None = None  # [decode_splits.num_long_seqs] int32 rows, -1 = unused
    decode_row_order: torch.Tensor | None = None  # [num_decode] int32, the rows longest context first
    num_prefill_seqs: int = 0
    prefill_cu_seqlens_q: torch.Tensor | None = None  # [num_prefill + 1] int32, from 0 over prefill tokens only
    prefill_context_lens: torch.Tensor | None = None  # [num_prefill] int32, tokens cached before the chunk
    prefill_block_tables: torch.Tensor | None = None  # [num_prefill, max_blocks] int32
    prefill_max_q_len: int = 0
    prefill_max_k_len: int = 0  # longest context + chunk
    # Host-side copies for the reference backend (and cheap to keep): lists of python ints.
    host_decode_context_lens: list[int] | None = None
    host_prefill_q_lens: list[int] | None = None
    host_prefill_context_lens: list[int] | None = None
