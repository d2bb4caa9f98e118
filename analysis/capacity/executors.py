"""Where a sweep's simulations run: in this process, a local process pool, or a Ray cluster
(`analysis.capacity.ray_executor`).

Each implements `analysis.capacity.sweep.Executor`, the interface the sweep's driver uses.
"""

from __future__ import annotations

import contextlib
import os
import signal
import weakref
from collections.abc import Sequence
from concurrent.futures import Future

from analysis.capacity.point import PointJob, PointResult, evaluate_point
from analysis.capacity.sweep import Executor
from analysis.capacity.workload import SessionLibrary, WorkloadParams
from analysis.process_pools import (
    interrupts_held,
    read_start_up_file,
    remove_start_up_file,
    spawn_pool,
    stop_pool,
    write_start_up_file,
)
from analysis.slo import SLO
from sim.config import SimConfig
from sim.memory import reusing_freed_memory


class SerialExecutor(Executor):
    """In this process, at submit time: the reference the parallel executors must match."""

    def __init__(self, library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO]) -> None:
        self._args = (library, workload, tuple(slos))
        # Until close: pages of freed arrays reused rather than mapped anew and zero-filled by the kernel at first
        # touch. A sweep's simulations are many and moderate (thousands of requests), and each makes and drops arrays
        # of megabytes (its tables, token gaps, the stream's hash ids): on the default sweep of
        # traces/sharegpt.parquet, 243,000 page faults became 84,000 and 0.5 system CPU s of 0.55 went, for ~30 MB
        # more resident memory (sim.memory.return_freed_memory_promptly's settings are for one long simulation).
        self._memory = contextlib.ExitStack()
        self._memory.enter_context(reusing_freed_memory())

    def close(self, interrupted: bool = False) -> None:
        self._memory.close()

    def submit(self, job: PointJob) -> Future:
        future: Future = Future()
        try:
            future.set_result(evaluate_point(*self._args, job))
        except Exception as exc:  # surfaced by future.result(), as a pool would
            future.set_exception(exc)
        return future


_WORKER_STATE: dict[str, object] = {}
# Slots of the shared array through which the sweep tells a worker to drop a job: job ticket t is dropped when slot
# t % _DROP_SLOTS holds t (tickets count up from 1, so a slot's old value never names a later job).
_DROP_SLOTS = 1024


class JobDropped(Exception):
    """A job run ahead of its search's verdicts that no search took: stopped in its worker (its result unread)."""


def _init_worker(library_path: str, workload: WorkloadParams, slos: tuple[SLO, ...], dropped) -> None:
    """Read the trace's sessions once per worker process (from the file LocalExecutor wrote), not once per
    simulation. Ctrl-C reaches every process of the terminal's group: a worker is born with SIGINT blocked
    (LocalExecutor.submit), ignores it from here on, and the parent stops it (LocalExecutor.close)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # a Ctrl-C that reached it while it started is pending: now ignored
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _WORKER_STATE["args"] = (read_start_up_file(library_path), workload, slos)
    _WORKER_STATE["dropped"] = dropped
    # For the worker's life: freed memory reused, as SerialExecutor does until it closes.
    _WORKER_STATE["memory"] = contextlib.ExitStack()
    _WORKER_STATE["memory"].enter_context(reusing_freed_memory())


def _evaluate_in_worker(job: PointJob, ticket: int) -> PointResult:
    dropped = _WORKER_STATE["dropped"]
    slot = ticket % len(dropped)

    def stop_if_dropped(_num_done: int) -> None:
        # Read as each request finishes (thousands of times a simulation, a shared-memory load each): a dropped job
        # ends within a few requests instead of keeping its worker from the jobs a search still needs.
        if dropped[slot] == ticket:
            raise JobDropped(f"job {ticket} ({job.qps} req/s) dropped")

    return evaluate_point(*_WORKER_STATE["args"], job, on_request_done=stop_if_dropped)


class LocalExecutor(Executor):
    """A pool of `num_jobs` local processes (`analysis.process_pools.spawn_pool`). The trace's sessions reach the
    workers through a temporary file, not with their start-up data: the pool writes that data from `submit`, where
    Ctrl-C is held, and megabytes of it kept `submit` waiting until each new worker had imported its modules (seconds
    on a loaded machine).
    """

    def __init__(self, library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO], num_jobs: int) -> None:
        path = write_start_up_file(library, "capacity-sessions-")
        # by close, else when collected or at exit
        self._remove_library = weakref.finalize(self, remove_start_up_file, path)
        import multiprocessing

        # Written here, read by the workers (given to them as they start): which running jobs to drop.
        self._dropped = multiprocessing.get_context("spawn").RawArray("q", _DROP_SLOTS)
        self._tickets: dict[Future, int] = {}
        self._pool = spawn_pool(num_jobs, _init_worker, (path, workload, tuple(slos), self._dropped))
        self.num_workers = num_jobs  # the sweep runs jobs ahead of their verdicts on the ones it leaves idle

    def submit(self, job: PointJob) -> Future:
        # The pool starts its workers in here: born with SIGINT blocked, they cannot be interrupted as they import.
        ticket = len(self._tickets) + 1
        with interrupts_held(block_sigint=True):
            future = self._pool.submit(_evaluate_in_worker, job, ticket)
        self._tickets[future] = ticket
        return future

    def drop(self, future: Future) -> bool:
        """Cancel a job run ahead that no search took, or, when it runs already, have its worker stop it soon (its
        future then ends in JobDropped). True when it never started."""
        if future.cancel():
            return True
        ticket = self._tickets[future]
        self._dropped[ticket % _DROP_SLOTS] = ticket
        return False

    def close(self, interrupted: bool = False) -> None:
        try:
            if interrupted:
                stop_pool(self._pool)
            else:
                try:
                    self._pool.shutdown(wait=True, cancel_futures=True)
                except BaseException:  # Ctrl-C while the workers finish: stop them as after any interrupt
                    stop_pool(self._pool)
                    raise
        finally:
            self._remove_library()



def default_num_jobs() -> int:
    """The cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def make_executor(library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO], num_jobs: int,
                  ray_address: str | None = None, configs: Sequence[SimConfig] = (),
                  ray_connect_timeout_s: float | None = None) -> Executor:
    """Ray when an address is given (`configs`: the sweep's, whose files travel with the job), else a local
    pool (in-process for one job)."""
    if ray_address:
        from analysis.capacity.ray_executor import DEFAULT_CONNECT_TIMEOUT_S, RayExecutor

        return RayExecutor(library, workload, slos, ray_address, configs,
                           ray_connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S)
    if num_jobs == 1:
        return SerialExecutor(library, workload, slos)
    return LocalExecutor(library, workload, slos, num_jobs)
