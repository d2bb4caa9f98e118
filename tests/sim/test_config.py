"""One configuration: the simulator's deployment and the engine's options share the engine's fields,
defaults and validator, so the simulator accepts exactly what the engine accepts."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import EngineConfig
from engine.core.config_args import add_config_arguments, build_config, field_names
from engine.core.model_config import ModelShape
from engine.options import EngineOptions
from sim.config import SimConfig

ENGINE_FIELDS = field_names(EngineConfig)

values = st.fixed_dictionaries(
    {},
    optional={
        "policy": st.sampled_from(["mixed", "nano", "bogus"]),
        "max_num_seqs": st.integers(-2, 600),
        "max_num_batched_tokens": st.integers(-2, 20000),
        "block_size": st.sampled_from([0, 1, 3, 8, 16, 24, 32, 64, 128, 256, 512]),
        "num_gpu_blocks": st.none() | st.integers(-1, 100),
        "max_model_len": st.none() | st.integers(-1, 100_000),
        "enable_prefix_caching": st.booleans(),
        "gpu_memory_utilization": st.sampled_from([0.0, 0.5, 0.9, 1.0, 1.5, float("nan")]),
        "tensor_parallel_size": st.integers(0, 9),
        "seed": st.integers(-1, 3),
    },
)


def _accepts(cls, **kwargs) -> bool:
    try:
        cls(**kwargs)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(kwargs=values, model=st.sampled_from(["qwen3-0.6b", "qwen3-8b", "llama-3.1-8b"]))
def test_the_simulator_accepts_exactly_what_the_engine_accepts(kwargs, model):
    sim_ok = _accepts(SimConfig, model=model, **kwargs)
    assert sim_ok == _accepts(EngineOptions, model=model, **kwargs)
    if not sim_ok:
        return
    shape = ModelShape.load(model)
    sim_config, engine_options = SimConfig(model=model, **kwargs), EngineOptions(model=model, **kwargs)
    try:
        sim_config.resolved_for(shape)
        sim_resolves = True
    except ValueError as exc:
        sim_resolves = "does not fit" in str(exc)  # the GPU's memory, which the engine learns only on the GPU
    try:
        engine_options.check_model(shape)
        engine_takes_model = True
    except ValueError:
        engine_takes_model = False
    assert sim_resolves == engine_takes_model


def test_defaults_are_declared_once():
    engine, sim = EngineOptions(), SimConfig()
    for name in ENGINE_FIELDS:
        assert getattr(engine, name) == getattr(sim, name) == EngineConfig.__dataclass_fields__[name].default


def test_engine_limits_are_refused_by_both():
    for cls in (SimConfig, EngineOptions):
        with pytest.raises(ValueError, match="block_size must be a power of two from 16 to 256, got 8"):
            cls(block_size=8)
    with pytest.raises(ValueError, match="max_model_len=50000 is more than qwen3-0.6b's max_position_embeddings=40960"):
        SimConfig(max_model_len=50000).resolved_for(ModelShape.load("qwen3-0.6b"))
    long_config = SimConfig(max_model_len=50000, allow_long_max_model_len=True)
    assert long_config.resolved_for(ModelShape.load("qwen3-0.6b")).max_model_len == 50000  # only when asked for
    with pytest.raises(ValueError, match=r"attention heads \(16\) is not divisible by tensor_parallel_size \(3\)"):
        SimConfig(tensor_parallel_size=3).resolved_for(ModelShape.load("qwen3-0.6b"))


def test_cli_options_are_generated_from_the_fields():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, SimConfig)
    args = parser.parse_args(["--replicas", "3", "--no-prefix-caching", "--block-size", "64", "--router", "prefix"])
    config = build_config(SimConfig, args)
    assert config == dataclasses.replace(SimConfig(), num_replicas=3, enable_prefix_caching=False, block_size=64,
                                         router="prefix")
    with pytest.raises(ValueError, match="^--replicas: num_replicas must be an integer >= 1, got 0$"):
        build_config(SimConfig, parser.parse_args(["--replicas", "0"]))


def test_resolved_fills_in_what_the_scheduler_needs():
    config = SimConfig(num_gpu_blocks=10)
    assert not config.is_resolved
    resolved = config.resolved_for(ModelShape.load("qwen3-0.6b"))
    assert (resolved.num_gpu_blocks, resolved.max_model_len, resolved.kv_capacity_tokens) == (10, 40960, 2560)
    assert type(resolved) is SimConfig and resolved.num_replicas == config.num_replicas
