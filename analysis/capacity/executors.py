"""Where a sweep's simulations run: in this process, a local process pool, or a Ray cluster
(`analysis.capacity.ray_executor`).

Each implements `analysis.capacity.sweep.Executor`, the interface the sweep's driver uses.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import tempfile
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from analysis.capacity.interrupts import interrupts_held
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


def _init_worker(library_path: str, workload: WorkloadParams, slos: tuple[SLO, ...]) -> None:
    """Read the trace's sessions once per worker process (from the file LocalExecutor wrote), not once per
    simulation. Ctrl-C reaches every process of the terminal's group: a worker is born with SIGINT blocked
    (LocalExecutor.submit), ignores it from here on, and the parent stops it (LocalExecutor.close)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # a Ctrl-C that reached it while it started is pending: now ignored
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    with open(library_path, "rb") as file:
        library = pickle.load(file)
    _WORKER_STATE["args"] = (library, workload, slos)


def _evaluate_in_worker(job: PointJob) -> PointResult:
    return evaluate_point(*_WORKER_STATE["args"], job)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class LocalExecutor(Executor):
    """A pool of `num_jobs` local processes.

    Started with "spawn", not "fork": polars and pyarrow keep thread pools that a forked child
    can inherit in a locked state. The trace's sessions reach the workers through a temporary file, not
    with their start-up data: the pool writes that data from `submit`, where Ctrl-C is held, and megabytes
    of it kept `submit` waiting until each new worker had imported its modules (seconds on a loaded machine).
    """

    def __init__(self, library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO], num_jobs: int) -> None:
        import multiprocessing
        from multiprocessing import resource_tracker

        descriptor, path = tempfile.mkstemp(prefix="capacity-sessions-", suffix=".pickle")
        self._remove_library = weakref.finalize(self, _remove, path)  # by close, else when collected or at exit
        with os.fdopen(descriptor, "wb") as file:
            pickle.dump(library, file, protocol=pickle.HIGHEST_PROTOCOL)
        self._pool = ProcessPoolExecutor(
            max_workers=num_jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(path, workload, tuple(slos)),
        )
        if os.name == "posix":  # running before any worker starts: started from `submit`, it unblocks SIGINT there
            resource_tracker.ensure_running()

    def submit(self, job: PointJob) -> Future:
        # The pool starts its workers in here: born with SIGINT blocked, they cannot be interrupted as they import.
        with interrupts_held(block_sigint=True):
            return self._pool.submit(_evaluate_in_worker, job)

    def close(self, interrupted: bool = False) -> None:
        try:
            if interrupted:
                self._stop()
            else:
                try:
                    self._pool.shutdown(wait=True, cancel_futures=True)
                except BaseException:  # Ctrl-C while the workers finish: stop them as after any interrupt
                    self._stop()
                    raise
        finally:
            self._remove_library()

    def _stop(self) -> None:
        """Stop the running simulations and cancel the queued ones, now. Waiting for the running ones would take as
        long as they do (up to a minute) and the pool has no public way to stop them, so its processes are terminated
        directly. The pool's own thread then notices them gone and closes the pool's pipes: it is waited for. Left to
        run, it could close its wake-up pipe while the interpreter exited, and Python 3.11's exit hook for pools
        (which writes to that pipe without the pool's lock) printed "OSError: [Errno 9] Bad file descriptor" under
        the interrupt's one line; once the thread is done the hook finds the pipe closed and leaves it alone."""
        pool = self._pool
        manager = getattr(pool, "_executor_manager_thread", None)
        processes = list((getattr(pool, "_processes", None) or {}).values())
        with interrupts_held():
            for process in processes:
                process.terminate()
            for process in processes:
                process.join(timeout=1.0)
                if process.exitcode is None:
                    process.kill()
                    process.join(timeout=1.0)
            pool.shutdown(wait=False, cancel_futures=True)
            if manager is not None:
                manager.join(timeout=5.0)


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
