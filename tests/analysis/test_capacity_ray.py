"""Capacity sweeps on Ray (analysis.capacity.ray_executor): fast one-line failures, files that travel with
the job, and, on a local Ray head started here, results identical to the local pool."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from analysis.capacity.cli import main
from analysis.capacity.ray_executor import _init_with_timeout, probe_address, stage_files
from analysis.capacity.sweep import SweepError
from sim.config import SimConfig

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "traces" / "sharegpt.parquet")
PROFILE = REPO / "sim" / "profiles" / "h200" / "qwen3-0.6b.json"
HAS_RAY = importlib.util.find_spec("ray") is not None
FAIL_WITHIN_S = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_without_the_ray_package_the_cli_exits_2_naming_it(monkeypatch, tmp_path, capsys) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "ray" else real_find_spec(name, *args))
    with pytest.raises(SystemExit) as exit_info:
        main([TRACE, "--slo", "ttft_p90=2s", "--ray", "auto", "--quiet", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("error: --ray: the 'ray' package is not installed; install it "
                                       "(pip install -e '.[ray]') or drop --ray to run on local cores\n")
    assert not (tmp_path / "out").exists()


def test_addresses_that_are_not_ray_fail_at_once(monkeypatch, tmp_path) -> None:
    port = _free_port()
    with pytest.raises(SweepError, match=rf"--ray '127.0.0.1:{port}': nothing accepts connections at 127.0.0.1:{port}"):
        probe_address(f"127.0.0.1:{port}")
    with pytest.raises(SweepError, match=rf"--ray 'ray://127.0.0.1:{port}': nothing accepts connections"):
        probe_address(f"ray://127.0.0.1:{port}")
    with pytest.raises(SweepError, match="expected auto, HOST:PORT or ray://HOST:PORT"):
        probe_address("ray://head:port")
    with socket.socket() as silent:  # listens, never speaks gRPC
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        started = time.perf_counter()
        with pytest.raises(SweepError, match="accepts connections but does not answer as Ray"):
            probe_address(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
        assert time.perf_counter() - started < 2.0
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(SweepError, match="--ray auto: no running Ray cluster found on this machine"):
        probe_address("auto")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(SweepError, match=rf"--ray 'auto \(127.0.0.1:{port}\)': nothing accepts connections"):
        probe_address("auto")


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install -e '.[ray]')")
def test_a_wrong_address_ends_the_cli_within_seconds_in_one_line(tmp_path) -> None:
    port = _free_port()
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "analysis.capacity", TRACE, "--slo", "ttft_p90=2s", "--ray",
                           f"ray://127.0.0.1:{port}", "--quiet", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert time.perf_counter() - started < FAIL_WITHIN_S
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: --ray 'ray://127.0.0.1:{port}': nothing accepts connections at "
                                        f"127.0.0.1:{port} (Connection refused); is the Ray head running there?"]


class _FlakyRay:
    """ray.init fails its first ``failures`` calls the way a loaded Ray Client server did in CI."""

    def __init__(self, failures: int, hang_s: float = 0.0) -> None:
        self.failures, self.hang_s = failures, hang_s
        self.calls = self.shutdowns = 0

    def init(self, **kwargs) -> None:
        self.calls += 1
        time.sleep(self.hang_s)
        if self.calls <= self.failures:
            raise ConnectionAbortedError("Initialization failure from server:\nTraceback (most recent call last):\n"
                                         "  File x\nRuntimeError: the specific server did not start")

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_failed_ray_init_is_retried_once_then_one_line() -> None:
    recovered = _FlakyRay(failures=1)
    _init_with_timeout(recovered, "ray://head:10001", {}, timeout_s=5)
    assert (recovered.calls, recovered.shutdowns) == (2, 1)
    with pytest.raises(SweepError) as failed:
        _init_with_timeout(_FlakyRay(failures=2), "ray://head:10001", {}, timeout_s=5)
    assert str(failed.value) == ("--ray 'ray://head:10001': cannot connect to the Ray cluster: Initialization failure "
                                 "from server: Traceback (most recent call last): File x RuntimeError: the specific "
                                 "server did not start")
    started = time.monotonic()
    with pytest.raises(SweepError, match="no Ray cluster answered within 0.5 s"):
        _init_with_timeout(_FlakyRay(failures=0, hang_s=3.0), "ray://head:10001", {}, timeout_s=0.5)
    assert time.monotonic() - started < 2.0


def test_files_named_by_options_are_staged_with_relative_names(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("slow.csv").write_text("start_s,slowdown\n0,1.5\n")
    model_dir = tmp_path / "models" / "my-qwen"
    model_dir.mkdir(parents=True)
    shutil.copyfile(REPO / "engine" / "configs" / "qwen3-0.6b" / "config.json", model_dir / "config.json")
    (model_dir / "model.safetensors").write_bytes(b"weights are not shipped")
    plain = SimConfig()
    shipped = SimConfig(model=str(model_dir), cost_model=str(PROFILE), host_slowdown="slow.csv")
    stage = tmp_path / "stage"
    remote = stage_files([plain, shipped], stage)
    assert remote[plain] == plain  # nothing to ship
    assert (remote[shipped].model, remote[shipped].cost_model, remote[shipped].host_slowdown) == (
        "files/0/my-qwen", "files/1/qwen3-0.6b.json", "files/2/slow.csv")
    assert sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()) == [
        "files/0/my-qwen/config.json", "files/1/qwen3-0.6b.json", "files/2/slow.csv"]
    assert (stage / "files/2/slow.csv").read_text() == "start_s,slowdown\n0,1.5\n"


@pytest.fixture()
def ray_head():
    """A local Ray head (2 CPUs) of this test's own; stopped by its process id, never by `ray stop`."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    gcs_port, client_port = _free_port(), _free_port()
    # Ports that would otherwise be fixed defaults: another Ray on this machine (another user's) must not clash.
    others = [f"--{name}={_free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                        "metrics-export-port", "runtime-env-agent-port")]
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={gcs_port}",
         f"--ray-client-server-port={client_port}", "--include-dashboard=false", "--num-cpus=2",
         "--disable-usage-stats", f"--temp-dir={temp_dir}", *others],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                probe_address(f"ray://127.0.0.1:{client_port}", timeout_s=1.0)
                break
            except SweepError:
                if time.monotonic() > deadline or head.poll() is not None:
                    raise
                time.sleep(1.0)
        yield f"ray://127.0.0.1:{client_port}"
    finally:
        head.terminate()  # --block: the head stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_a_sweep_on_a_local_ray_head_equals_the_local_pool(ray_head, tmp_path) -> None:
    # A relative --host-slowdown file: Ray's workers do not run in this folder, so it must travel with the job.
    (tmp_path / "slow.csv").write_text("start_s,slowdown\n0,1.0\n20,1.3\n")
    sweep = [TRACE, "--limit", "200", "--model", "qwen3-8b", "--gpu", "l40s", "--replicas", "1,2",
             "--cost-model", "roofline", "--host-slowdown", "slow.csv", "--slo", "ttft_p90=500ms,tpot_p90=50ms",
             "--tolerance", "0.2", "--max-iterations", "4", "--min-duration-s", "30", "--min-requests", "100",
             "--quiet", "--overwrite"]
    for where, extra in (("ray", ["--ray", ray_head]), ("local", ["--jobs", "2"])):
        proc = subprocess.run([sys.executable, "-m", "analysis.capacity", *sweep, "--out", where, *extra],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    ray_records = json.loads((tmp_path / "ray" / "capacity.json").read_text())
    assert ray_records[0]["options"]["host_slowdown"] == "slow.csv"  # the outputs keep the path as given
    for name in ("capacity.json", "capacity.parquet"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
