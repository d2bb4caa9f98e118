"""Text prompts for servers that refuse token ids: text the tokenizer encodes to exactly the trace's length
(special tokens included, as the server counts them), sent by ``traces.bench --prompt-format text``."""

from __future__ import annotations

import polars as pl
import pytest

from cli.traces_bench import main as bench_main
from tests.traces.fake_openai import FakeOpenAI
from traces.bench_prompts import text_prompt
from traces.schema import save_trace

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A word-level tokenizer that adds a BOS to every text: decoding N ids and encoding again gives N + 1."""
    vocab = {f"w{i}": i for i in range(60)} | {"the": 60, "[UNK]": 61, "<s>": 62}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 62)])
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>")
    target = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(target)
    return target


@pytest.mark.parametrize("num_tokens", [1, 2, 7, 30])
def test_text_has_the_exact_token_count(tokenizer_dir, num_tokens) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = [(7 * i) % 60 for i in range(num_tokens)]
    text = text_prompt(ids, num_tokens, tokenizer)
    assert len(tokenizer(text)["input_ids"]) == num_tokens
    assert text.split()[:num_tokens - 2] == [f"w{i}" for i in ids[:num_tokens - 2]]  # the ids' own words first
    longer = text_prompt(ids[:2], num_tokens + 5, tokenizer)  # too short: padded
    assert len(tokenizer(longer)["input_ids"]) == num_tokens + 5


def test_bench_sends_text_prompts(tmp_path, tokenizer_dir) -> None:
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, 0.0], "prompt_tokens": [4, 9],
                             "output_tokens": [2, 3]}), trace)
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0) as server:
        assert bench_main([server.url, str(trace), "--prompt-format", "text", "--tokenizer", str(tokenizer_dir),
                           "--out", str(tmp_path / "out"), "--quiet", "--no-report"]) == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    bodies = {body["max_tokens"]: body["prompt"] for body in (r.body for r in server.received)}
    assert all(isinstance(prompt, str) for prompt in bodies.values())
    assert {n: len(tokenizer(p)["input_ids"]) for n, p in bodies.items()} == {2: 4, 3: 9}
