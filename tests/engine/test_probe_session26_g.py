"""Configuration probe (session 26, G): where engine.LLM and the engine's command lines disagreed.

- ``LLM(dtype="half")`` (vLLM's spelling) was taken, ``--dtype half`` on engine.serve and engine.replay refused
  ("invalid choice"), and ``EngineOptions(dtype="half")`` refused too: the alias lived in LLM's keyword path only.
- ``load_format`` 'auto' ran random weights for any weightless model folder whose parent was named "configs" (meant
  for the shipped configs only): /data/configs/MODEL without its safetensors served noise without a word.
- LLM named a shipped config by its whole path in its errors ("/.../engine/configs/qwen3-0.6b's
  max_position_embeddings"), where the other entry points say "qwen3-0.6b's".
- ``--warmup-requests``: the same warm-up, limited to 1,000 by engine.serve and to 10,000 by engine.replay, each with
  a line of its own.
"""

from __future__ import annotations

import shutil

import pytest

from cli.engine_replay import build_parser as replay_parser
from cli.engine_serve import build_parser as serve_parser
from engine.core.config_args import build_config
from engine.core.model_config import CONFIG_DIR
from engine.options import EngineOptions


@pytest.mark.parametrize("typed, dtype", [("half", "float16"), ("float", "float32"), ("bfloat16", "bfloat16")])
def test_the_command_lines_take_the_dtype_spellings_llm_takes(typed, dtype) -> None:
    for args in (serve_parser().parse_args(["--dtype", typed]),
                 replay_parser().parse_args(["t.parquet", "--out", "o", "--dtype", typed])):
        assert build_config(EngineOptions, args).dtype == dtype
    assert EngineOptions(dtype=typed).dtype == dtype
    assert EngineOptions.from_kwargs("qwen3-0.6b", dtype=typed).dtype == dtype


def test_a_dtype_that_is_none_of_them_is_still_refused() -> None:
    with pytest.raises(SystemExit):
        serve_parser().parse_args(["--dtype", "int8"])
    with pytest.raises(ValueError, match=r"^dtype must be one of auto, bfloat16, float16, float32, got 'fp8'$"):
        EngineOptions(dtype="fp8")


def test_a_weightless_folder_under_a_folder_named_configs_is_not_run_on_random_weights(tmp_path) -> None:
    from engine.llm import LLM

    model = tmp_path / "configs" / "mine"
    model.mkdir(parents=True)
    shutil.copy(CONFIG_DIR / "qwen3-0.6b" / "config.json", model / "config.json")
    with pytest.raises(FileNotFoundError, match="has no \\*.safetensors weights; pass load_format='dummy'"):
        LLM(str(model), device="cpu")


def test_llm_names_a_shipped_config_as_the_other_entry_points_do() -> None:
    from engine.llm import LLM

    with pytest.raises(ValueError, match=r"^max_model_len=50000 is more than qwen3-0.6b's max_position_embeddings"):
        LLM(str(CONFIG_DIR / "qwen3-0.6b"), device="cpu", max_model_len=50000)
    with pytest.raises(ValueError, match=r"^max_model_len=50000 is more than qwen3-0.6b's max_position_embeddings"):
        LLM("qwen3-0.6b", device="cpu", max_model_len=50000)


@pytest.mark.parametrize("count", ["10001", "-1"])
def test_both_command_lines_limit_the_warm_up_alike(count, capsys) -> None:
    from cli.engine_replay import main as replay_main
    from cli.engine_serve import main as serve_main

    lines = []
    for main, argv in ((serve_main, []), (replay_main, ["t.parquet", "--out", "o"])):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--warmup-requests", count])
        assert exit_info.value.code == 2
        lines.append(capsys.readouterr().err)
    assert lines == [f"error: --warmup-requests must be an integer from 0 to 10000, got {count}\n"] * 2
