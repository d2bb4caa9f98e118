"""Session 50 (A): hostile input against the less-probed command lines (the server's probes are in
tests/engine/test_probe_session50_A.py)."""

from __future__ import annotations

import os

import pytest

from analysis.capacity.ray_executor import _init_with_timeout
from analysis.capacity.sweep import SweepError


class _GrpcButNotRay:
    """ray.init at an address that answers gRPC but is no Ray cluster: Ray's C++ core writes a warning to file
    descriptor 2 on every retry (past Python's logging), then the init fails."""

    def __init__(self) -> None:
        self.calls = 0

    def init(self, **kwargs) -> None:
        self.calls += 1
        for _ in range(3):
            os.write(2, b"[2026-12-07 W 1 2] gcs_client.cc:210: Failed to get cluster ID from GCS server: RpcError\n")
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")

    def shutdown(self) -> None:
        pass


def test_rays_native_warnings_do_not_precede_the_one_line_error(capfd) -> None:
    """analysis.capacity --ray HOST:PORT at such an address printed 40 lines of gcs_client.cc warnings over 40 s
    before its one-line error."""
    ray = _GrpcButNotRay()
    with pytest.raises(SweepError) as failed:
        _init_with_timeout(ray, "10.0.0.1:6379", {}, timeout_s=5)
    assert str(failed.value) == ("--ray '10.0.0.1:6379': cannot connect to the Ray cluster: Failed to connect to Ray "
                                 "cluster at 10.0.0.1:6379")
    assert ray.calls == 2  # the retry too was held
    assert capfd.readouterr().err == ""
    os.write(2, b"after\n")  # the descriptor is the test's own again
    assert capfd.readouterr().err == "after\n"


def test_a_connected_init_leaves_stderr_as_it_was(capfd) -> None:
    class Connects:
        def init(self, **kwargs) -> None:
            os.write(2, b"native chatter\n")

    _init_with_timeout(Connects(), "ray://head:10001", {}, timeout_s=5)
    os.write(2, b"mine\n")
    assert capfd.readouterr().err == "mine\n"
