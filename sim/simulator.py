"""Replays a trace on simulated replicas with simpy: each replica runs the engine's own step loop
(``LLMEngine.begin_step`` / ``end_step``) with a cost-model runner, behind a router.

Requests join a replica's waiting queue at their arrival time and are considered at the next step
boundary, exactly as on hardware; an idle replica sleeps until a request arrives.
"""

from __future__ import annotations

import time
from pathlib import Path
from dataclasses import asdict, dataclass, field
from typing import Callable

import simpy

from engine.core.config import SCHEDULING_POLICIES, SchedulerConfig
from engine.core.llm_engine import LLMEngine
from engine.core.model_config import ModelShape
from engine.core.records import request_row
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from sim.cost_model import CostModel, RooflineCostModel, num_kv_blocks_for
from sim.hardware import get_gpu
from sim.profiled_cost_model import ProfiledCostModel, find_profile
from sim.router import ROUTERS, make_router
from sim.host_speed import parse_host_slowdown
from sim.runner import CostModelRunner


class SimClock:
    def __init__(self, env: simpy.Environment) -> None:
        self._env = env

    def now(self) -> float:
        return self._env.now


@dataclass(frozen=True)
class SimConfig:
    model: str = "qwen3-0.6b"
    gpu: str = "h200"
    num_replicas: int = 1
    router: str = "rr"
    policy: str = "mixed"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 256
    num_gpu_blocks: int | None = None  # None: sized from GPU memory like the engine does
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    seed: int = 0
    cost_model: str = "auto"  # auto: a shipped measured profile if one matches, else the roofline; or roofline; or a profile path
    host_slowdown: str = "calibrated"  # see sim.host_speed: calibrated, a number, episodes:NORMAL,SLOW,FRACTION,MEAN_S, or a CSV

    def __post_init__(self) -> None:
        for name, flag in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens"),
                           ("block_size", "--block-size"), ("num_gpu_blocks", "--num-gpu-blocks"),
                           ("max_model_len", "--max-model-len")):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{flag} must be a positive integer, got {value!r}")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size}")
        if self.num_replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.num_replicas}")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; supported: {', '.join(ROUTERS)}")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; supported: {', '.join(SCHEDULING_POLICIES)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        get_gpu(self.gpu)  # validates the name
        parse_host_slowdown(self.host_slowdown)  # validates the spec (and the file, if one is named)

    @property
    def model_shape(self) -> ModelShape:
        return ModelShape.load(self.model)

    def scheduler_config(self, model: ModelShape) -> SchedulerConfig:
        num_blocks = self.num_gpu_blocks
        if num_blocks is None:
            num_blocks = num_kv_blocks_for(
                model,
                get_gpu(self.gpu),
                self.block_size,
                self.gpu_memory_utilization,
                self.max_num_batched_tokens,
                self.tensor_parallel_size,
            )
        return SchedulerConfig(
            num_gpu_blocks=num_blocks,
            max_model_len=model.max_position_embeddings if self.max_model_len is None else self.max_model_len,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            policy=self.policy,
            enable_prefix_caching=self.enable_prefix_caching,
        )


@dataclass
class SimResult:
    request_rows: list[tuple]
    engines: list[LLMEngine]
    config: SimConfig
    scheduler_config: SchedulerConfig
    cost_model_name: str
    wall_s: float
    meta: dict = field(default_factory=dict)

    def requests_table(self):
        from engine.core.records import requests_to_arrow

        return requests_to_arrow(self.request_rows)

    def steps_table(self):
        import pyarrow as pa

        return pa.concat_tables([e.step_log.to_arrow() for e in self.engines])

    def describe(self) -> dict:
        """The options and derived figures that produced this run, for summary.json."""
        return {
            **asdict(self.config),
            "num_gpu_blocks": self.scheduler_config.num_gpu_blocks,
            "max_model_len": self.scheduler_config.max_model_len,
            "cost_model": self.cost_model_name,
            "simulator_wall_s": round(self.wall_s, 3),
            **self.meta,
        }


def make_cost_model(config: SimConfig, model: ModelShape) -> CostModel:
    choice = config.cost_model
    if choice == "roofline":
        return RooflineCostModel(model, get_gpu(config.gpu), config.tensor_parallel_size)
    if choice == "auto":
        path = find_profile(model.name, config.gpu, config.tensor_parallel_size)
        if path is None:
            return RooflineCostModel(model, get_gpu(config.gpu), config.tensor_parallel_size)
    else:
        path = Path(choice)
        if not path.is_file():
            raise ValueError(f"cost model {choice!r} is neither 'auto', 'roofline' nor an existing profile JSON")
    return ProfiledCostModel.load(path)


def simulate(
    trace,
    config: SimConfig,
    *,
    cost_model: CostModel | None = None,
    on_request_done: Callable[[int], None] | None = None,
) -> SimResult:
    """Run ``trace`` (a ``traces.schema.Trace``) to completion; every request finishes or is rejected."""
    started = time.perf_counter()
    model = config.model_shape
    sched_config = config.scheduler_config(model)
    cost_model = cost_model or make_cost_model(config, model)
    env = simpy.Environment()
    clock = SimClock(env)
    engines = [
        LLMEngine(
            sched_config,
            # one host-speed process per replica: each replica is its own machine
            CostModelRunner(cost_model, host_speed=parse_host_slowdown(config.host_slowdown, config.seed + i), clock=clock),
            clock=clock,
            eos_token_ids=model.eos_token_ids,
            replica=i,
        )
        for i in range(config.num_replicas)
    ]
    wakeups: list[simpy.Event | None] = [None] * len(engines)
    rows: list[tuple] = []
    router = make_router(config.router)

    def done(seqs: list[Sequence]) -> None:
        for seq in seqs:
            rows.append(request_row(seq))
        if on_request_done is not None and seqs:
            on_request_done(len(seqs))

    def replica(env: simpy.Environment, index: int):
        engine = engines[index]
        runner = engine.runner
        while True:
            if not engine.has_unfinished_requests():
                wakeups[index] = env.event()
                yield wakeups[index]
                continue
            batch = engine.begin_step()
            output = runner.run(batch)
            yield env.timeout(output.duration_s)
            done(engine.end_step(batch, output))

    requests = trace.requests
    arrivals_s = requests["arrival_s"].to_list()
    output_tokens = requests["output_tokens"].to_list()
    request_ids = requests["request_id"].to_list()
    vocab_size = model.vocab_size

    def arrivals(env: simpy.Environment):
        for i, arrival_s in enumerate(arrivals_s):
            if arrival_s > env.now:
                yield env.timeout(arrival_s - env.now)
            prompt = trace.prompt_token_ids(i, vocab_size, config.seed)
            index = router.route(prompt, engines)
            params = SamplingParams(max_tokens=output_tokens[i], ignore_eos=True)
            seq = engines[index].add_request(prompt, params, request_id=request_ids[i], arrival_s=arrival_s)
            if seq.is_finished:  # rejected
                done([seq])
            wakeup = wakeups[index]
            if wakeup is not None:
                wakeups[index] = None
                wakeup.succeed()

    for i in range(len(engines)):
        env.process(replica(env, i))
    env.process(arrivals(env))
    env.run()
    return SimResult(rows, engines, config, sched_config, cost_model.name, time.perf_counter() - started)
