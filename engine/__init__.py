"""A compact LLM inference engine in the nano-vLLM design.

Importing ``engine`` loads no torch: the scheduling core is shared with the simulator, which runs
on machines without it. ``engine.LLM`` pulls in torch on first use.
"""

from engine.core.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
