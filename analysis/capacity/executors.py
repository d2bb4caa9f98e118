"""Where a sweep's simulations run: in this process, a local process pool, or a Ray cluster
(`analysis.capacity.ray_executor`).

Each implements `analysis.capacity.sweep.Executor`, the interface the sweep's driver uses.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from analysis.capacity.point import PointJob, PointResult, evaluate_point
from analysis.capacity.sweep import Executor
from analysis.capacity.workload import SessionLibrary, WorkloadParams
from analysis.slo import SLO
from sim.config import SimConfig


class SerialExecutor(Executor):
    """In this process, at submit time: the reference the parallel executors must match."""

    def __init__(self, library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO]) -> None:
        self._args = (library, workload, tuple(slos))

    def submit(self, job: PointJob) -> Future:
        future: Future = Future()
        try:
            future.set_result(evaluate_point(*self._args, job))
        except Exception as exc:  # surfaced by future.result(), as a pool would
            future.set_exception(exc)
        return future


_WORKER_STATE: dict[str, object] = {}


def _init_worker(library: SessionLibrary, workload: WorkloadParams, slos: tuple[SLO, ...]) -> None:
    """Receive the trace's sessions once per worker process rather than once per simulation. Ctrl-C reaches
    every process of the terminal's group: workers ignore it, and the parent stops them (LocalExecutor.close)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_STATE["args"] = (library, workload, slos)


def _evaluate_in_worker(job: PointJob) -> PointResult:
    return evaluate_point(*_WORKER_STATE["args"], job)


class LocalExecutor(Executor):
    """A pool of `num_jobs` local processes.

    Started with "spawn", not "fork": polars and pyarrow keep thread pools that a forked child
    can inherit in a locked state.
    """

    def __init__(self, library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO], num_jobs: int) -> None:
        import multiprocessing

        self._pool = ProcessPoolExecutor(
            max_workers=num_jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(library, workload, tuple(slos)),
        )

    def submit(self, job: PointJob) -> Future:
        return self._pool.submit(_evaluate_in_worker, job)

    def close(self, interrupted: bool = False) -> None:
        if not interrupted:
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        # Waiting for the running simulations would take as long as they do (up to a minute): stop them.
        # The pool has no public way to, so after it stops taking work its processes are terminated directly.
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=1.0)


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
