"""Tensor parallelism: rank 0 schedules and samples; worker processes follow its plans.

Rank 0 (this process) runs the engine. Every step it packs the batch into a host-side StepPlan and sends it
to each worker over a pipe, and all ranks run the same forward: the column/row-parallel layers all-reduce
over the process group (NCCL on GPUs, gloo on CPU), and the LM head gathers logits to rank 0, which samples.
Workers are started with spawn and told to stop with a ``None`` plan; a dead worker is reported instead of
hanging the driver.

Plans travel over pipes, not a collective: a worker waits for its next plan for as long as the engine is idle
(a server between requests), and a collective there timed out after COLLECTIVE_TIMEOUT and killed every worker
after two idle minutes. A pipe waits without a deadline and ends (EOF) when rank 0's process is gone.

Start-up: rank 0 opens the rendezvous store and waits for every worker to join it, for as long as the workers
are alive (spawning one and importing torch takes seconds, tens on a busy two-core machine), and only then do the
ranks build the process group, whose own waits are COLLECTIVE_TIMEOUT's. A worker that dies before joining is
reported at once; one that neither joins nor dies within START_TIMEOUT is reported with that limit.

Teardown: on NCCL, destroying the process group is itself collective (each rank waits for the others, and for
the CUDA graphs that captured its collectives to be freed), so a clean close sends ``None``, frees rank 0's
graphs and weights, then destroys alongside the workers. A close after a failure, with a worker dead or out of
step, kills the workers first and gives the destroy a deadline (in a daemon thread): it would otherwise wait
for a peer that never comes, and the failure that caused the close would never be printed.
"""

from __future__ import annotations

import atexit
import os
import pickle
import threading
import time
import traceback
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.interrupt import defer_sigterm_to_parent, exit_with_parent
from engine.core.model_config import ModelShape
from engine.core.runner import RunnerOutput
from engine.core.scheduler import ScheduledBatch
from engine.gpu.model_runner import ModelRunner, StepPlan, resolve_device
from engine.gpu.parallel import ParallelContext
from engine.options import EngineOptions

# A collective that waits this long means a rank is gone: fail with an error rather than hang. (Plans do not
# wait on it: they travel over pipes.)
COLLECTIVE_TIMEOUT = timedelta(seconds=120)
# How long rank 0 waits for the spawned workers to join the rendezvous store (while they are alive).
START_TIMEOUT = timedelta(seconds=600)
# The store's own deadline for connecting and for its reads.
_STORE_TIMEOUT = timedelta(seconds=600)
# How long a teardown may take: a clean one (every rank destroys together), and one after a failure.
CLEAN_TEARDOWN_S = 60.0
FAILED_TEARDOWN_S = 5.0


def _backend(options: EngineOptions, device_type: str) -> str:
    if options.distributed_backend != "auto":
        return options.distributed_backend
    return "nccl" if device_type == "cuda" else "gloo"


_JOINED = "nanoserve/workers-joined"  # the store's counter of workers that reached it


def _open_store() -> dist.TCPStore:
    """Rank 0's rendezvous store, on a port the system picks (nothing else can take it between pick and bind)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=_STORE_TIMEOUT, wait_for_workers=False)


def _join_store(port: int) -> dist.TCPStore:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=_STORE_TIMEOUT)
    store.add(_JOINED, 1)
    return store


def _wait_for_workers(store: dist.TCPStore, workers: list) -> None:
    """Return once every worker joined the store; raise as soon as one died, or after START_TIMEOUT."""
    deadline = time.monotonic() + START_TIMEOUT.total_seconds()
    while (joined := store.add(_JOINED, 0)) < len(workers):
        dead = [w.pid for w in workers if not w.is_alive()]
        if dead:
            raise RuntimeError(
                f"tensor-parallel worker process(es) {dead} died during start-up; see their output above"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(workers) - joined} of {len(workers)} tensor-parallel worker process(es) did not start within "
                f"{START_TIMEOUT.total_seconds():g} s (START_TIMEOUT)"
            )
        time.sleep(0.02)


def _init(rank: int, world_size: int, store: dist.TCPStore, backend: str, device: torch.device,
          timeout: timedelta) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs)


def _forget_failed_init() -> None:
    """A failed init_process_group has already counted its group: the next one in this process would be named "1"
    while fresh workers name theirs "0", and their rendezvous keys would never meet (a 120 s hang, then an error).
    destroy_process_group resets the count, but only once a group exists."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if not dist.is_initialized() and world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def _destroy_within(deadline_s: float) -> bool:
    """Destroy the process group, waiting at most ``deadline_s``; False if it is still waiting for a peer (the
    daemon thread is left to it: the process can exit, but it cannot start another tensor-parallel engine)."""
    if not dist.is_initialized():
        return True
    thread = threading.Thread(target=dist.destroy_process_group, name="destroy-process-group", daemon=True)
    thread.start()
    thread.join(deadline_s)
    return not thread.is_alive()


def _device_for(options: EngineOptions, rank: int) -> torch.device:
    device = resolve_device(options)
    return torch.device("cuda", rank) if device.type == "cuda" else device


def _worker_main(rank: int, world_size: int, port: int, options: EngineOptions, shape: ModelShape, model_dir,
                 plans, timeout: timedelta) -> None:
    exit_with_parent()  # a driver killed with SIGKILL cannot stop its daemon workers
    # ... but while it lives, rank 0 stops them (close): a SIGTERM sent to the whole group (systemd, `timeout`) ended a
    # worker at once, and a served engine's requests in flight failed in their next collective ("Connection closed by
    # peer") while the server drained them
    defer_sigterm_to_parent(pass_on=False)
    try:
        device = _device_for(options, rank)
        store = _join_store(port)
        _init(rank, world_size, store, _backend(options, device.type), device, timeout)
        runner = ModelRunner(options, shape, model_dir, ParallelContext(rank, world_size), device=device)
        while True:
            try:
                plan = pickle.loads(plans.recv_bytes())
            except EOFError:  # rank 0's process is gone: nobody will send the next plan
                os._exit(1)
            if plan is None:
                break
            runner.execute(runner.materialize(plan), None)
        runner.close()  # its graphs first: NCCL's teardown waits for the graphs that captured collectives
    except BaseException as exc:  # SystemExit too: the parent died (exit_with_parent)
        if not isinstance(exc, SystemExit):
            traceback.print_exc()
        os._exit(1)  # no collective teardown: a peer that is gone or out of step would hold it forever
    os._exit(0 if _destroy_within(CLEAN_TEARDOWN_S) else 1)


class TensorParallelRunner(ModelRunner):
    """Rank 0's ModelRunner: spawns ``tensor_parallel_size - 1`` workers and drives them."""

    def __init__(self, options: EngineOptions, shape: ModelShape, model_dir: Path | None,
                 eos_token_ids: Iterable[int] = ()) -> None:
        """``eos_token_ids``: ModelRunner's (rank 0 alone samples)."""
        if dist.is_available() and dist.is_initialized():
            raise RuntimeError("a tensor-parallel engine already runs in this process; close it first")
        world_size = options.tensor_parallel_size
        device = _device_for(options, 0)
        options.check_device_type(device.type)  # --distributed-backend nccl where 'auto' found no GPU: before spawning
        if device.type == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} needs {world_size} GPUs; torch sees {torch.cuda.device_count()}"
            )
        store = _open_store()
        port = store.port
        context = mp.get_context("spawn")
        pipes = [context.Pipe(duplex=False) for _ in range(1, world_size)]  # (worker's end, rank 0's end)
        self._workers = [
            context.Process(target=_worker_main, daemon=True,
                            args=(rank, world_size, port, options, shape, model_dir, pipes[rank - 1][0],
                                  COLLECTIVE_TIMEOUT))
            for rank in range(1, world_size)
        ]
        for worker in self._workers:
            worker.start()
        for receiving, _ in pipes:
            receiving.close()  # the worker holds its own copy: its recv ends (EOF) once rank 0's end closes
        self._plans = [sending for _, sending in pipes]
        self._serving = False
        self._closed = False
        self._broken: str | None = None  # why the ranks are out of step, once they are
        self._plan_sent = False
        atexit.register(self.close)
        try:
            _wait_for_workers(store, self._workers)
            self.distributed_backend_name = _backend(options, device.type)  # what 'auto' became, for the run folder
            _init(0, world_size, store, self.distributed_backend_name, device, COLLECTIVE_TIMEOUT)
            super().__init__(options, shape, model_dir, ParallelContext(0, world_size), device=device,
                             eos_token_ids=eos_token_ids)
        except BaseException:
            self._broken = "start-up failed"
            self.close()
            _forget_failed_init()
            raise
        self._serving = True

    def broadcast_plan(self, plan: StepPlan) -> None:
        if not self._serving:
            return  # during start-up every rank runs the same warm-up and capture on its own
        dead = [w.pid for w in self._workers if not w.is_alive()]
        if dead:
            self._broken = f"tensor-parallel worker process(es) {dead} died"
            raise RuntimeError(f"{self._broken}; see their output above")
        message = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)  # once, whatever the number of workers
        for worker, plans in zip(self._workers, self._plans):
            try:
                plans.send_bytes(message)
            except OSError as exc:  # BrokenPipeError: it exited since the check above
                self._broken = f"tensor-parallel worker process {worker.pid} is gone ({exc})"
                raise RuntimeError(self._broken) from None
            self._plan_sent = True  # from the first worker on, a failure leaves the ranks out of step

    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        if self._broken:
            raise RuntimeError(f"the tensor-parallel engine cannot run more steps: {self._broken}; restart it")
        self._plan_sent = False
        try:
            return super().run(batch)
        except BaseException as exc:
            # A failure before the plan went out leaves every rank where it was (a request that cannot be sampled
            # fails so); after it, the workers ran collectives rank 0 did not, and the next step's would pair with
            # theirs: stop here rather than hang or sum the wrong tensors.
            if self._plan_sent and not self._broken:
                self._broken = f"a step failed on rank 0 after its plan went to the workers ({type(exc).__name__})"
            raise

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        clean = self._serving and not self._broken and all(w.is_alive() for w in self._workers)
        if clean:
            stop = pickle.dumps(None)
            for plans in self._plans:
                try:
                    plans.send_bytes(stop)
                except OSError:
                    clean = False
        for plans in self._plans:
            plans.close()  # a worker still waiting for a plan sees EOF and exits
        if not clean:  # nobody will meet rank 0 in a collective teardown: do not wait for them
            for worker in self._workers:
                worker.kill()
        if getattr(self, "model", None) is not None:
            super().close()  # graphs and weights before the teardown (NCCL's waits on graphs that captured it)
        _destroy_within(CLEAN_TEARDOWN_S if clean else FAILED_TEARDOWN_S)
        for worker in self._workers:
            worker.join(timeout=10 if clean else 2)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5)
        atexit.unregister(self.close)
