"""Fixtures for the traces tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.traces.helpers import WORDS


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level Hugging Face tokenizer built locally (no downloads): id = word index + 1, 0 = unknown."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0} | {word: index + 1 for index, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(directory)
    return directory
