"""Which replica an arriving request goes to."""

from __future__ import annotations

from typing import Protocol, Sequence as Seq

from engine.llm_engine import LLMEngine


class Router(Protocol):
    name: str

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int: ...


class RoundRobinRouter:
    name = "rr"

    def __init__(self) -> None:
        self._next = 0

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int:
        index = self._next % len(engines)
        self._next += 1
        return index


class LeastOutstandingRouter:
    """Fewest unfinished (waiting + running) requests; ties go to the lowest index."""

    name = "lor"

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int:
        loads = [e.scheduler.num_unfinished for e in engines]
        return loads.index(min(loads))


ROUTERS = {cls.name: cls for cls in (RoundRobinRouter, LeastOutstandingRouter)}


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; supported: {', '.join(ROUTERS)}") from None
