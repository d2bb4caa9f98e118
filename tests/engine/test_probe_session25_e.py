"""Hostile-input probe (session 25, E): the lines engine.serve and LLM print about a model's generation config quote
the model's folder, whose name may hold control characters."""

from __future__ import annotations

import json

from engine.core.generation_defaults import read_generation_defaults


def test_the_generation_config_lines_quote_the_folder_escaped(tmp_path) -> None:
    """A model folder named with an ANSI escape and a newline was printed raw at start-up: the line split in two and
    the terminal recoloured."""
    model = tmp_path / "m\x1b[31m\nX"
    model.mkdir()
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "repetition_penalty": 1.1}))
    source = f"{tmp_path}/m\\x1b[31m\\nX/generation_config.json"
    assert read_generation_defaults(model).report("--generation-config vllm") == [
        f"{source}: the model's generation config sets the default sampling parameters of requests that leave them "
        "out: temperature=0.6 (as vLLM does; --generation-config vllm ignores the file)",
        f"note: {source}: repetition_penalty=1.1 not applied: the engine does not implement it (vLLM would)",
    ]
