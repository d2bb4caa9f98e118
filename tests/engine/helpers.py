"""Test doubles for the step loop: a runner that samples a fixed token and a manual clock."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.runner import RunnerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import ScheduledBatch


class FixedTokenRunner:
    """Samples ``token_id`` for every sequence and advances the clock by ``step_s``."""

    def __init__(self, clock: ManualClock, token_id: int = 7, step_s: float = 0.01) -> None:
        self.clock = clock
        self.token_id = token_id
        self.step_s = step_s
        self.batches: list[list[tuple[int, int]]] = []
        self.released: list[int] = []

    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        self.batches.append([(s.seq_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        self.clock.t += self.step_s
        return RunnerOutput([self.token_id] * len(batch.seqs), self.step_s)

    def release(self, seqs) -> None:
        self.released.extend(s.seq_id for s in seqs)


@dataclass(frozen=True, kw_only=True)
class SmallBlockConfig(EngineConfig):
    """The scheduler's logic holds for any power-of-two block size, and tiny blocks put block boundaries
    inside short test prompts; the engine's kernels need 16 and up, so only tests widen the set."""

    SUPPORTED_BLOCK_SIZES: ClassVar[tuple[int, ...]] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def make_engine(**config) -> tuple[LLMEngine, FixedTokenRunner]:
    token_id = config.pop("token_id", 7)
    eos = config.pop("eos_token_ids", (2,))
    cfg = SmallBlockConfig(**{"num_gpu_blocks": 64, "max_model_len": 1024, "block_size": 4, **config})
    clock = ManualClock()
    runner = FixedTokenRunner(clock, token_id)
    return LLMEngine(cfg, runner, clock=clock, eos_token_ids=eos), runner


def params(max_tokens: int = 4, ignore_eos: bool = True) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)


def run_to_completion(engine: LLMEngine, max_steps: int = 10_000) -> int:
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        assert steps < max_steps, "engine did not drain"
    return steps


# ---- engine.serve as a process (Linux: reads /proc) ------------------------------------------------------------------
def serve_process(model_dir: str, *args: str):
    """``python -m engine.serve`` on the CPU, any free port, stdout and stderr merged as text."""
    import os
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "engine.serve", "--model", model_dir, "--device", "cpu",
                             "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"})


@contextmanager
def killed_on_exit(proc):
    """Run the block with ``proc`` (a server process); kill it if the block leaves it running (an assertion failed,
    or a wait timed out), so that no test leaves a server behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def process_cmdline(pid: int) -> str:
    """A process's command line, "" once it is gone."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def engine_processes(server_pid: int) -> list[int]:
    """The server's spawned children (its engine process, once started)."""
    from pathlib import Path

    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    return [int(c) for c in children if "spawn_main" in process_cmdline(int(c))]


SERVING = "serving on "  # the line engine.serve prints once it listens, before its URL


def start_server(model_dir: str, *extra: str):
    """``python -m engine.serve`` on a tiny model at a free loopback port: (the process, its URL) once it serves."""
    import time

    proc = serve_process(model_dir, "--warmup-requests", "0", *extra)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith(SERVING):
            return proc, line[len(SERVING):].strip()
        assert time.monotonic() < deadline
    proc.kill()
    raise AssertionError(f"the server did not start: exit {proc.wait()}")
