"""A sweep's simulations as tasks on a Ray cluster: ``--ray auto``, ``--ray HOST:PORT`` or ``--ray ray://HOST:PORT``.

What travels with the job: the project's packages (`py_modules`, as directories, so a Ray Client
connection can send them too), the trace's sessions (put in the object store once), and every file an
option names (`PATH_FIELDS`: a profile JSON, a host-slowdown CSV, a model directory's config.json),
copied into the job's `working_dir` and named relative to it in the configurations the workers get.
The outputs keep the paths as given, so a Ray sweep writes the same bytes as a local one.

Failures end fast with one line (a `SweepError`): no `ray` package; an address that does not accept a
connection within `PROBE_TIMEOUT_S` (Ray itself would retry for minutes); no running cluster for
``auto``; `ray.init` not done within the connect timeout; a file too large to ship.
The cluster's Python needs the simulator's dependencies installed (see pyproject.toml).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

from analysis.capacity.point import PointJob, evaluate_point
from analysis.capacity.sweep import Executor, SweepError
from analysis.capacity.workload import SessionLibrary, WorkloadParams
from analysis.slo import SLO
from engine.core.messages import one_line
from sim.config import SimConfig
from traces.files import existing_path

# SimConfig fields whose value may be a local file or directory the workers must read.
PATH_FIELDS = ("model", "cost_model", "host_slowdown")
PROBE_TIMEOUT_S = 2.0
# The probe has already told a Ray endpoint from anything else, so the connection itself may take its time:
# a Ray Client server starts a process per client and the packages upload before ray.init returns (6 s was
# too short on a loaded 2-core machine).
DEFAULT_CONNECT_TIMEOUT_S = 60.0
# Set before ray is imported (a user's own setting wins): Ray's driver waits 30 s for a GCS that does not
# answer, and its C++ side prints a warning every few seconds while it waits.
RAY_ENVIRONMENT = {"RAY_py_gcs_connect_timeout_s": "5"}
# A gRPC server (Ray's GCS and its client server both are) answers a client's HTTP/2 preface with a
# SETTINGS frame: a cheap way to tell a Ray endpoint from any other listening port before ray.init.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS_TYPE = 4
MAX_SHIPPED_BYTES = 50 * 1024 * 1024  # Ray refuses larger working_dir packages; say so before trying
DEFAULT_CLIENT_PORT = 10001


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a plain or ray:// address; None for "auto" and "local"."""
    if address in ("auto", "local"):
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = rest, str(DEFAULT_CLIENT_PORT if address.startswith("ray://") else 6379)
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise SweepError(f"--ray {address!r}: expected auto, HOST:PORT or ray://HOST:PORT") from None


def check_ray(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Before anything else: the ray package is installed and something listens at the address."""
    if importlib.util.find_spec("ray") is None:
        raise SweepError("--ray: the 'ray' package is not installed; install it (pip install -e '.[ray]') "
                         "or drop --ray to run on local cores")
    probe_address(address, timeout_s)


def probe_address(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail at once, in one line, when nothing listens at the address (Ray would retry for minutes)."""
    if address == "local":
        raise SweepError("--ray local would start a throw-away cluster in this process; use --jobs instead")
    if address == "auto":  # as Ray resolves it: $RAY_ADDRESS, else the cluster this machine last started
        found = os.environ.get("RAY_ADDRESS", "")
        current = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "ray_current_cluster")
        if not found and current.is_file():
            found = current.read_text().strip()
        if not found or found == "auto":
            raise SweepError("--ray auto: no running Ray cluster found on this machine (start one with "
                             "'ray start --head', or give HOST:PORT or ray://HOST:10001)")
        address, shown = found, f"auto ({found})"
    else:
        shown = address
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(_HTTP2_PREFACE)
            header = connection.recv(9)
    except TimeoutError:
        header = b""
    except OSError as exc:
        raise SweepError(f"--ray {shown!r}: nothing accepts connections at {host}:{port} "
                         f"({exc.strerror or exc}); is the Ray head running there?") from None
    if len(header) < 4 or header[3] != _HTTP2_SETTINGS_TYPE:
        raise SweepError(f"--ray {shown!r}: {host}:{port} accepts connections but does not answer as Ray (gRPC) "
                         "does; check the port (the head's GCS, default 6379, or its Ray Client server, 10001)")


def _shipped_path(value: str) -> Path | None:
    """The local file or directory an option value names, or None (a shipped name, a number, ...)."""
    path = existing_path(value) if value else None  # a number too long to be a file name is no file
    return path if path is not None and (path.is_file() or path.is_dir()) else None


def stage_files(configs: Sequence[SimConfig], stage: Path) -> dict[SimConfig, SimConfig]:
    """Copy every file the configurations name into `stage/files/`; {config: config as the workers see it}.

    A model directory contributes its config.json only (weights are not needed to simulate); its
    folder name is kept, since it names the model (and so picks a measured profile).
    """
    copies: dict[str, str] = {}
    total_bytes = 0
    for config in configs:
        for name in PATH_FIELDS:
            value = getattr(config, name)
            path = _shipped_path(value)
            if path is None or value in copies:
                continue
            target = Path("files") / str(len(copies)) / (path.resolve().name or "root")
            if path.is_dir():
                source = path / "config.json"
                if not source.is_file():
                    raise SweepError(f"--{name.replace('_', '-')} {value}: a directory without config.json")
                (stage / target).mkdir(parents=True)
                shutil.copyfile(source, stage / target / "config.json")
                total_bytes += source.stat().st_size
            else:
                (stage / target).parent.mkdir(parents=True)
                shutil.copyfile(path, stage / target)
                total_bytes += path.stat().st_size
            if total_bytes > MAX_SHIPPED_BYTES:
                raise SweepError(f"--{name.replace('_', '-')} {value}: the files to ship to Ray pass "
                                 f"{MAX_SHIPPED_BYTES // 2**20} MiB; copy them onto the cluster's nodes instead")
            copies[value] = target.as_posix()
    return {config: _with_paths(config, copies) for config in configs}


def _with_paths(config: SimConfig, copies: dict[str, str]) -> SimConfig:
    """`config` with shipped paths renamed, without SimConfig's checks: the names are the workers', relative
    to their working directory, and need not exist here."""
    clone = copy.copy(config)
    for name in PATH_FIELDS:
        if getattr(config, name) in copies:
            object.__setattr__(clone, name, copies[getattr(config, name)])
    return clone


def _init_once(ray, address: str, runtime_env: dict, wait_s: float) -> BaseException | None:
    """One ``ray.init`` in a thread (Ray's own waits are minutes long); its exception, or None once it is done;
    TimeoutError when it is not done within ``wait_s``."""
    failure: list[BaseException] = []
    done = threading.Event()

    def connect() -> None:
        try:
            ray.init(address=address, runtime_env=runtime_env, ignore_reinit_error=True, log_to_driver=False,
                     logging_level="ERROR")
        except BaseException as exc:  # ray raises several types (ConnectionError, RuntimeError, ...)
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=connect, name="ray-init", daemon=True).start()
    if not done.wait(wait_s):
        raise TimeoutError
    return failure[0] if failure else None


@contextmanager
def _native_stderr_held() -> Iterator[None]:
    """File descriptor 2 into a discarded temporary file while the block runs. Ray's C++ core writes its warnings
    there, past Python's logging (ray.init's logging_level): an address that answers gRPC but is no Ray cluster (a
    service mesh's proxy, another gRPC server) printed "gcs_client.cc:210: Failed to get cluster ID from GCS server"
    once a second, 40 lines in all, before the one-line error. What fails is said by that line."""
    sys.stderr.flush()
    try:
        saved_fd = os.dup(2)
    except OSError:  # no stderr to hold (closed by the caller): nothing to keep clean either
        yield
        return
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved_fd, 2)
    finally:
        os.close(saved_fd)


def _init_with_timeout(ray, address: str, runtime_env: dict, timeout_s: float, attempts: int = 2) -> None:
    """``ray.init`` within ``timeout_s`` in all, Ray's native warnings held (_native_stderr_held)."""
    with _native_stderr_held():
        _init_attempts(ray, address, runtime_env, timeout_s, attempts)


def _init_attempts(ray, address: str, runtime_env: dict, timeout_s: float, attempts: int) -> None:
    """``ray.init`` within ``timeout_s`` in all. A failed attempt is retried once: on a loaded head, Ray Client's
    per-client server sometimes fails its own start ("Initialization failure from server"), and the next
    attempt succeeds (seen in CI on a 2-core machine)."""
    deadline = time.monotonic() + timeout_s
    for attempt in range(1, attempts + 1):
        try:
            failure = _init_once(ray, address, runtime_env, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise SweepError(f"--ray {address!r}: no Ray cluster answered within {timeout_s:g} s") from None
        if failure is None:
            return
        if attempt < attempts and time.monotonic() < deadline:
            try:
                ray.shutdown()  # what the failed attempt set up, before the next
            except Exception:  # noqa: BLE001 - nothing to shut down is fine
                pass
            continue
        # Ray's messages span lines (the server's traceback follows its first line): one line, bounded.
        detail = one_line(failure, 300) or type(failure).__name__
        raise SweepError(f"--ray {address!r}: cannot connect to the Ray cluster: {detail}")


class RayExecutor(Executor):
    """Tasks on a Ray cluster (see the module docstring)."""

    def __init__(self, library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO], address: str,
                 configs: Sequence[SimConfig], connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        check_ray(address)
        import analysis
        import engine
        import sim
        import traces

        self._stage = Path(tempfile.mkdtemp(prefix="capacity-ray-"))
        try:
            self._remote_configs = stage_files(configs, self._stage)
            for name, value in RAY_ENVIRONMENT.items():
                os.environ.setdefault(name, value)
            import ray

            packages = [str(Path(package.__file__).parent) for package in (engine, sim, traces, analysis)]
            runtime_env: dict = {"py_modules": packages, "excludes": ["__pycache__", "*.pyc"]}
            if any(self._stage.iterdir()):
                runtime_env["working_dir"] = str(self._stage)
            _init_with_timeout(ray, address, runtime_env, connect_timeout_s)
        except BaseException:
            shutil.rmtree(self._stage, ignore_errors=True)
            raise
        self._ray = ray
        self._remote = ray.remote(evaluate_point)
        self._library_ref = ray.put(library)
        self._args = (workload, tuple(slos))

    def submit(self, job: PointJob) -> Future:
        remote_job = dataclasses.replace(job, config=self._remote_configs.get(job.config, job.config))
        return self._remote.remote(self._library_ref, *self._args, remote_job).future()

    def close(self, interrupted: bool = False) -> None:
        try:
            self._ray.shutdown()
        finally:
            shutil.rmtree(self._stage, ignore_errors=True)
