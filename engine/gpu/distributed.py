"""Tensor parallelism: rank 0 schedules and samples; worker processes follow its plans.

Rank 0 (this process) runs the engine. Every step it packs the batch into a host-side StepPlan,
broadcasts it to the workers over a gloo control group, and all ranks run the same forward: the
column/row-parallel layers all-reduce over the default group (NCCL on GPUs, gloo on CPU), and the
LM head gathers logits to rank 0, which samples. Workers are started with spawn and told to stop
with a ``None`` plan; a dead worker is reported instead of hanging the driver.
"""

from __future__ import annotations

import atexit
import os
import socket
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.interrupt import exit_with_parent
from engine.core.model_config import ModelShape
from engine.gpu.model_runner import ModelRunner, StepPlan, resolve_device
from engine.gpu.parallel import ParallelContext
from engine.options import EngineOptions

# A collective that waits this long means a rank is gone: fail with an error rather than hang.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(options: EngineOptions, device_type: str) -> str:
    if options.distributed_backend != "auto":
        return options.distributed_backend
    return "nccl" if device_type == "cuda" else "gloo"


def _init(rank: int, world_size: int, port: int, backend: str, device: torch.device):
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT, **kwargs,
    )
    return dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)  # control messages travel on the CPU


def _device_for(options: EngineOptions, rank: int) -> torch.device:
    device = resolve_device(options)
    return torch.device("cuda", rank) if device.type == "cuda" else device


def _worker_main(rank: int, world_size: int, port: int, options: EngineOptions, shape: ModelShape, model_dir) -> None:
    exit_with_parent()  # a driver killed with SIGKILL cannot stop its daemon workers
    device = _device_for(options, rank)
    control = _init(rank, world_size, port, _backend(options, device.type), device)
    try:
        runner = ModelRunner(options, shape, model_dir, ParallelContext(rank, world_size), device=device)
        while True:
            message = [None]
            dist.broadcast_object_list(message, src=0, group=control)
            plan = message[0]
            if plan is None:
                break
            runner.execute(runner.materialize(plan), None)
        runner.close()
    except Exception:
        traceback.print_exc()
        os._exit(1)  # the driver notices the dead worker
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class TensorParallelRunner(ModelRunner):
    """Rank 0's ModelRunner: spawns ``tensor_parallel_size - 1`` workers and drives them."""

    def __init__(self, options: EngineOptions, shape: ModelShape, model_dir: Path | None) -> None:
        if dist.is_available() and dist.is_initialized():
            raise RuntimeError("a tensor-parallel engine already runs in this process; close it first")
        world_size = options.tensor_parallel_size
        device = _device_for(options, 0)
        if device.type == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} needs {world_size} GPUs; torch sees {torch.cuda.device_count()}"
            )
        port = _free_port()
        context = mp.get_context("spawn")
        self._workers = [
            context.Process(target=_worker_main, args=(rank, world_size, port, options, shape, model_dir), daemon=True)
            for rank in range(1, world_size)
        ]
        for worker in self._workers:
            worker.start()
        self._serving = False
        self._closed = False
        atexit.register(self.close)
        try:
            self._control = _init(0, world_size, port, _backend(options, device.type), device)
            super().__init__(options, shape, model_dir, ParallelContext(0, world_size), device=device)
        except BaseException:
            self.close()
            raise
        self._serving = True

    def broadcast_plan(self, plan: StepPlan) -> None:
        if not self._serving:
            return  # during start-up every rank runs the same warm-up and capture on its own
        dead = [w.pid for w in self._workers if not w.is_alive()]
        if dead:
            raise RuntimeError(f"tensor-parallel worker process(es) {dead} died; see their output above")
        dist.broadcast_object_list([plan], src=0, group=self._control)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            if self._serving and all(w.is_alive() for w in self._workers):
                dist.broadcast_object_list([None], src=0, group=self._control)
        except Exception:
            pass
        for worker in self._workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
        if getattr(self, "model", None) is not None:
            super().close()
        if dist.is_initialized():
            dist.destroy_process_group()
        atexit.unregister(self.close)
