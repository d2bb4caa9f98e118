"""The simulator's deployment: the engine's ``EngineConfig`` plus the hardware, replicas, router and
cost model it runs on (torch-free). Every engine setting is the engine's own field, validated by the
engine's validator, so the simulator accepts exactly what the engine accepts."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import ConfigError, EngineConfig, check, check_choice, check_int, option
from engine.core.model_config import ModelShape
from engine.core.sampling_params import field_problem, sampling_mode
from sim.cost_model import num_kv_blocks_for
from sim.hardware import GPUS, get_gpu
from sim.host_speed import parse_host_slowdown
from sim.router import ROUTERS

MAX_REPLICAS = 10_000  # 100 times the largest fleet benchmarked (benchmarks/sim_million.py: 64)
# The most sequences or tokens a simulated step or sequence may be allowed (the engine stops below 2**31, its int32
# kernels; the simulator takes larger limits for timing studies): the most tokens a run's tables hold for a request
# (analysis.schema.MAX_TOKENS). --max-num-seqs 10**20 simulated, and capacity.parquet got an Int128 column that
# pyarrow cannot read.
MAX_SIM_LIMIT = 2**40


@dataclass(frozen=True, kw_only=True)
class SimConfig(EngineConfig):
    model: str = option("qwen3-0.6b", "shipped model config name or HF model dir")
    # Any case, as the config takes it (get_gpu): analysis.capacity took --gpu H200 and sim.replay refused it.
    gpu: str = option("h200", "GPU type", choices=tuple(sorted(GPUS)), parse=str.lower)
    num_replicas: int = option(1, "number of engine replicas", flag="--replicas")
    router: str = option("rr", "request router", choices=tuple(sorted(ROUTERS)))
    cost_model: str = option(
        "auto", "auto (a measured profile from sim/profiles/ when one matches --model, --gpu and TP, else the "
        "roofline estimate), roofline, or a profile JSON path")
    host_slowdown: str = option(
        "calibrated", "how much slower than on the profiling grid the serving host runs: calibrated (the profile's "
        "measured serving average), a number, episodes:NORMAL,SLOW,FRACTION,MEAN_S (seeded random slow periods), or "
        "a CSV of start_s,slowdown (python -m sim.host_speed)")

    # Every request's sampling, as engine.replay's options of the same names set it: the steps take what the profile
    # measured sampling to add (sim.profile's sampled decode points); the batches are the greedy replay's but for
    # requests of one prompt (sim.runner.first_token_id).
    temperature: float = option(0.0, "every request's sampling temperature (0: greedy; steps are priced with the "
                                "sampling cost the profile measured)")
    top_k: int = option(-1, "every request's top_k (-1: off; Qwen3's generation config serves 20)")
    top_p: float = option(1.0, "every request's top_p (1: off; Qwen3's generation config serves 0.95)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("temperature", "top_k", "top_p"):  # SamplingParams' own rules: each request must take them
            problem = field_problem(name, getattr(self, name))
            check(problem is None, f"{name} {problem}", name)
        check(isinstance(self.model, str) and bool(self.model), f"model must be a name or a folder, got {self.model!r}",
              "model")
        check(isinstance(self.gpu, str), f"gpu must be a GPU name ({', '.join(GPUS)}), got {self.gpu!r}", "gpu")
        try:
            # Recorded as the GPU's own name (H200 as h200), as analysis.capacity records it.
            object.__setattr__(self, "gpu", get_gpu(self.gpu).name)
        except ValueError as exc:
            raise ConfigError("gpu", str(exc)) from None
        check_int("num_replicas", self.num_replicas)
        # Each replica is an event-loop process with its own KV cache, built up front: 2**70 of them never started.
        check(self.num_replicas <= MAX_REPLICAS, f"num_replicas must be at most {MAX_REPLICAS:,}, got "
              f"{self.num_replicas}", "num_replicas")
        check_choice("router", self.router, tuple(ROUTERS))
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            check(value is None or value <= MAX_SIM_LIMIT, f"{name} must be at most 2**40 ({MAX_SIM_LIMIT:,}), got "
                  f"{value}", name)
        parse_host_slowdown(self.host_slowdown)  # validates the spec (and the file, if one is named)

    @property
    def model_shape(self) -> ModelShape:
        return ModelShape.load(self.model)

    def sampling_mode(self, vocab_size: int) -> str:
        """'greedy', 'temperature' or 'filters': what the requests' sampling costs a step (sampling_mode)."""
        return sampling_mode(self.temperature, self.top_k, self.top_p, vocab_size)

    def describe_sampling(self) -> dict:
        """The sampling options as a run's summary.json records them, as engine.replay's do: the temperature, and
        top_k and top_p only when on (analysis.compare lists options that differ)."""
        return {"temperature": self.temperature, **({"top_k": self.top_k} if self.top_k > 0 else {}),
                **({"top_p": self.top_p} if self.top_p < 1.0 else {})}

    def resolved_for(self, model: ModelShape) -> SimConfig:
        """Checked against ``model``, with the KV cache sized as the engine sizes it and max_model_len filled in."""
        self.check_model(model)
        num_blocks = self.num_gpu_blocks
        if num_blocks is None:
            num_blocks = num_kv_blocks_for(model, get_gpu(self.gpu), self.block_size, self.gpu_memory_utilization,
                                           self.max_num_batched_tokens, self.tensor_parallel_size)
        max_model_len = model.max_position_embeddings if self.max_model_len is None else self.max_model_len
        return self.resolved(num_gpu_blocks=num_blocks, max_model_len=max_model_len)


def unused_router_note(router: str, max_num_replicas: int) -> str | None:
    """A note for a router asked of a deployment of one replica: every request goes to that replica whichever router
    picks, so --router named a choice that changes nothing (a script passes --router whatever --replicas it sweeps,
    so this is a note, not an error). None where a replica count above 1 is asked, or for the default router."""
    if max_num_replicas != 1 or router == SimConfig.__dataclass_fields__["router"].default:
        return None
    return (f"note: --router {router}: with --replicas 1 every request goes to the one replica, so the router changes "
            "nothing (the run is the same with any router)")
