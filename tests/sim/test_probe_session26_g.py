"""Configuration probe (session 26, G): where the simulator's entry points and the shared config disagreed.

- A shipped model config given as its folder (``--model /.../engine/configs/qwen3-0.6b``) was named by that whole
  path, so no measured profile matched it and the replay was priced with the roofline estimate without a word,
  while ``--model qwen3-0.6b`` and ``--model engine/configs/qwen3-0.6b`` got the measured profile.
- ``--gpu H200``: analysis.capacity and SimConfig took it (get_gpu ignores case), sim.replay refused it.
- numpy scalars: np.float32(0.5) as gpu_memory_utilization and np.False_ as enable_prefix_caching were refused by
  messages that contradict themselves ("must be in (0, 1], got np.float32(0.5)").
- sim.profile restated the engine's defaults, and its --max-model-len default of 32768 was refused for every model of
  a shorter context, by a message advising --allow-long-max-model-len, which sim.profile did not take.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli.sim_replay import build_parser, config_from_args
from engine.core.model_config import CONFIG_DIR, ModelShape
from sim.config import SimConfig
from sim.simulator import make_cost_model
from tests.sim.helpers import save_tiny_qwen3


@pytest.mark.parametrize("model", ["qwen3-0.6b", "engine/configs/qwen3-0.6b", str(CONFIG_DIR / "qwen3-0.6b")])
def test_a_shipped_config_is_priced_by_its_profile_however_it_is_named(model) -> None:
    config = SimConfig(model=model)
    assert config.model_shape.name == "qwen3-0.6b"
    assert make_cost_model(config, config.model_shape).name.startswith("profile:h200/qwen3-0.6b ")


def test_the_engine_names_a_shipped_config_by_its_name() -> None:
    """LLM loads the resolved folder: its errors said '/.../engine/configs/qwen3-0.6b's max_position_embeddings'."""
    assert ModelShape.load(CONFIG_DIR / "qwen3-0.6b").name == "qwen3-0.6b"


def test_sim_replay_takes_a_gpu_name_in_any_case_as_capacity_does() -> None:
    config = config_from_args(build_parser().parse_args(["t.parquet", "--gpu", "H200"]))
    assert config.gpu == "h200"  # recorded by its own name, as analysis.capacity records it
    assert SimConfig(gpu="L40S").gpu == "l40s"


def test_a_gpu_that_is_not_a_name_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"^gpu must be a GPU name \(h200, h100, a100-80g, l40s\), got None$"):
        SimConfig(gpu=None)


def test_numpy_scalars_are_taken_as_the_values_they_hold() -> None:
    config = SimConfig(gpu_memory_utilization=np.float32(0.5), enable_prefix_caching=np.False_,
                       allow_long_max_model_len=np.True_)
    assert (config.gpu_memory_utilization, config.enable_prefix_caching, config.allow_long_max_model_len) == (
        0.5, False, True)
    assert type(config.gpu_memory_utilization) is float and type(config.enable_prefix_caching) is bool
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\], got nan"):
        SimConfig(gpu_memory_utilization=np.float32("nan"))


def test_sim_profile_defaults_to_a_short_models_own_context(tmp_path) -> None:
    """Its 32768 default was refused for a model of 512 positions ('--allow-long-max-model-len accepts it', an option
    sim.profile refused); now the model's own, at most 32768, and --allow-long-max-model-len is an option."""
    pytest.importorskip("torch")
    from sim.profile import main as profile_main

    save_tiny_qwen3(tmp_path / "model", max_position_embeddings=512)
    common = ["--model", str(tmp_path / "model"), "--device", "cpu", "--quick", "--repeats", "1", "--max-num-seqs",
              "16", "--max-num-batched-tokens", "512"]
    assert profile_main([*common, "--out", str(tmp_path / "a.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["engine_options"]["max_model_len"] == 512
    assert profile_main([*common, "--max-model-len", "1024", "--allow-long-max-model-len",
                         "--out", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["engine_options"]["max_model_len"] == 1024
