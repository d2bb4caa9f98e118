"""Readers for public trace formats; each turns a source file into trace columns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traces.formats import azure, burstgpt, mooncake, sharegpt, vidur
from traces.formats.base import Converted, ConvertOptions


@dataclass(frozen=True)
class Format:
    read: Callable[[Path, ConvertOptions], Converted]
    summary: str  # one line for --help


FORMATS: dict[str, Format] = {
    "azure": Format(azure.read,
                    "Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens; 2023, 2024, "
                    "2025 multimodal)"),
    "mooncake": Format(mooncake.read,
                       "Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids of 512-token blocks)"),
    "burstgpt": Format(burstgpt.read,
                       "BurstGPT CSV (Timestamp, [Session ID, Elapsed time,] Model, Request tokens, Response "
                       "tokens, ...); drops failures"),
    "sharegpt": Format(sharegpt.read,
                       "ShareGPT conversation JSON or JSONL (conversations/items/messages); needs --tokenizer "
                       "and --qps; one request per answered turn"),
    "vidur": Format(vidur.read, "Vidur CSV (num_prefill_tokens, num_decode_tokens, optional arrived_at)"),
}

__all__ = ["FORMATS", "ConvertOptions", "Converted", "Format"]
