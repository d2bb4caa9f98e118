"""GPU specifications the roofline cost model and KV sizing use, and what a measurement records of its host.

Datasheet figures are leads; where a figure was measured on the real card (``measured_*``), the
cost model uses that instead. H200 measurements: ../shared/notes/h200-yardsticks.md (torch 2.11,
bf16): 4.24 TB/s device copy, ~790 TFLOP/s dense bf16 matmul at 8192^3.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int  # usable device memory as the driver reports it
    datasheet_bandwidth_bps: float  # HBM bytes per second
    datasheet_bf16_flops: float  # dense bf16 FLOP/s
    measured_bandwidth_bps: float | None = None
    measured_bf16_flops: float | None = None

    @property
    def bandwidth_bps(self) -> float:
        return self.measured_bandwidth_bps or self.datasheet_bandwidth_bps

    @property
    def bf16_flops(self) -> float:
        return self.measured_bf16_flops or self.datasheet_bf16_flops


MIB = 1 << 20

GPUS: dict[str, GPUSpec] = {
    spec.name: spec
    for spec in (
        GPUSpec("h200", 143_771 * MIB, 4.8e12, 989e12, measured_bandwidth_bps=4.24e12, measured_bf16_flops=790e12),
        GPUSpec("h100", 81_559 * MIB, 3.35e12, 989e12),
        GPUSpec("a100-80g", 81_920 * MIB, 2.039e12, 312e12),
        GPUSpec("l40s", 46_068 * MIB, 0.864e12, 362e12),
    )
}


def get_gpu(name: str) -> GPUSpec:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; supported: {', '.join(GPUS)}") from None


def host_info() -> dict[str, object]:
    """The host CPU a measurement ran on (profiles and GPU replays record it): step times of host-bound work
    follow it, and two machine starts of the same GPU kind can differ by 2x (validation/README.md)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "num_cpus": os.cpu_count(), "node": platform.node()}
