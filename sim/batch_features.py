"""What a step's cost depends on, read off a ScheduledBatch (shared by the profiler and the cost models)."""

from __future__ import annotations

from engine.scheduler import ScheduledBatch


def batch_features(batch: ScheduledBatch) -> dict[str, int]:
    return {
        "num_seqs": len(batch.seqs),
        "num_prefill_seqs": batch.num_prefill_seqs,
        "num_prefill_tokens": batch.num_prefill_tokens,
        "prefill_context_tokens": batch.prefill_context_tokens,
        "num_decode_seqs": batch.num_decode_seqs,
        "decode_context_tokens": batch.decode_context_tokens,
        "prefill_attention_pairs": batch.prefill_attention_pairs,
        "max_decode_context_tokens": batch.max_decode_context_tokens,
    }
