"""Stop a capacity point's simulation once it has certainly missed an SLO (a ``sim.simulator.RunWatch``).

A percentile SLO on a latency that ends at an event the step loop records as it happens (TTFT at the first token,
queue time at the first scheduling) is missed for sure once enough requests of the measured window are known to
exceed the limit. With ``n`` samples, numpy's linear-interpolation percentile at ``q`` lies at or above the sample of
index ``floor((n - 1) * q / 100)`` in sorted order (``analysis.stats.percentile``), so ``n - floor((n - 1) * q / 100)``
samples above the limit put the statistic above it, whatever the others are. A request is known to exceed the limit
``L`` from the first instant ``t`` with ``t - arrival > L`` (computed as the latency itself is) at which its event has
not happened, or when the event happened that late; an unfinished request (rejected) counts as infinitely slow, as
``analysis.capacity.slo_check`` counts it. Each request of the window is looked at once per SLO, at or after that
instant, and forgotten then.

The verdict is the one the whole simulation would give: a point stopped this way fails its SLOs, as it would have
after simulating every request. Near capacity the simulation then stops at a fraction of the stream (a load a few
per cent past capacity misses its TTFT limit for sure after about three quarters of it, one 20 % past after a
third); a load that meets its SLOs runs in full and is untouched. Mean SLOs, the token-gap metrics (TPOT, ITL) and
E2E are not watched: their values are known only when requests finish, and a finish inside a quiet window the
simulator applies lazily (sim.simulator) is recorded after its time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import numpy as np

from analysis.slo import SLO, STATISTICS
from engine.core.sequence import Sequence

# The event that ends each watched latency, as a Sequence attribute (analysis.metrics.add_latency_columns): both are
# set when they happen (a first token inside a quiet window when the window is planned, ahead of the clock).
_EVENTS = {"ttft": "first_token_s", "queue": "first_scheduled_s"}
# At most this many looks are left pending between two wakes: a request's sequence is held until it is looked at,
# and fewer wakes than looks keep the watch's own simpy events few.
_MAX_PENDING_LOOKS = 256


def samples_that_decide(num_samples: int, q: float) -> int:
    """How many of ``num_samples`` samples above a limit put their ``q``-th percentile above it for sure: those from
    the percentile's lower interpolation index up (``analysis.stats.percentile``)."""
    return num_samples - int(math.floor((num_samples - 1) * q / 100.0))


def first_instant_beyond(arrivals_s: np.ndarray, limit_s: float) -> np.ndarray:
    """Per arrival ``a``: the least float ``t`` with ``t - a > limit_s`` in float64, as a latency is computed; any
    event at or after it gives a latency above the limit (subtraction rounds monotonically)."""
    instants = arrivals_s + limit_s
    while True:
        short = ~(instants - arrivals_s > limit_s)
        if not short.any():
            return instants
        instants[short] = np.nextafter(instants[short], np.inf)


class CertainMiss:
    """Watches one simulation of ``arrivals_s`` (a trace's, in row order) for a certain miss of ``slos`` over the
    requests arriving in [start_s, end_s). ``missed`` names the SLO once one is certain."""

    def __init__(self, arrivals_s: np.ndarray, start_s: float, end_s: float, slos: Seq[SLO]) -> None:
        arrivals_s = np.asarray(arrivals_s, dtype=np.float64)
        window = np.flatnonzero((arrivals_s >= start_s) & (arrivals_s < end_s))
        self._rules = [slo for slo in slos if slo.metric in _EVENTS and STATISTICS[slo.statistic] is not None]
        self._needed = [samples_that_decide(len(window), STATISTICS[slo.statistic]) for slo in self._rules]
        self._beyond = [0] * len(self._rules)
        self.missed: SLO | None = None
        # Every look in time order: (instant, rule, request index).
        instants, rules, rows = [], [], []
        for rule, slo in enumerate(self._rules):
            instants.append(first_instant_beyond(arrivals_s[window], slo.limit_s))
            rules.append(np.full(len(window), rule, dtype=np.int64))
            rows.append(window)
        if instants:
            order_s = np.concatenate(instants)
            order = np.argsort(order_s, kind="stable")
            self._instants = order_s[order].tolist()
            self._look_rules = np.concatenate(rules)[order].tolist()
            self._look_rows = np.concatenate(rows)[order].tolist()
        else:
            self._instants, self._look_rules, self._look_rows = [], [], []
        self._next = 0  # the first look not yet taken
        self._looks_left = dict.fromkeys(window.tolist(), len(self._rules))  # per request, looks still to take
        self._seqs: dict[int, Sequence] = {}

    def arrived(self, index: int, seq: Sequence) -> None:
        if index in self._looks_left:
            self._seqs[index] = seq

    def next_check_s(self) -> float:
        """The next instant a miss can become certain: each look adds at most one request beyond a limit, so not
        before the fewest looks any rule still needs have been taken (nor later than a few hundred looks on)."""
        if self.missed is not None or self._next >= len(self._instants):
            return math.inf
        fewest = min(needed - beyond for needed, beyond in zip(self._needed, self._beyond))
        position = self._next + max(1, min(fewest, _MAX_PENDING_LOOKS)) - 1
        return self._instants[min(position, len(self._instants) - 1)]

    def check(self, now_s: float) -> bool:
        """Takes every look due by ``now_s``; True once some SLO is certainly missed."""
        instants, rules, rows = self._instants, self._look_rules, self._look_rows
        position = self._next
        while position < len(instants) and instants[position] <= now_s:
            rule, row = rules[position], rows[position]
            position += 1
            seq = self._seqs[row]
            if self._beyond_limit(seq, self._rules[rule]):
                self._beyond[rule] += 1
            self._looks_left[row] -= 1
            if not self._looks_left[row]:
                del self._seqs[row], self._looks_left[row]
        self._next = position
        for rule, slo in enumerate(self._rules):
            if self._beyond[rule] >= self._needed[rule]:
                self.missed = slo
                return True
        return False

    @staticmethod
    def _beyond_limit(seq: Sequence, slo: SLO) -> bool:
        """Whether ``seq``'s latency is known to exceed the limit, looked at no earlier than its first instant beyond
        it: an event that has not happened yet happens later still."""
        if seq.finish_reason is not None and not seq.finish_reason.served:
            return True  # rejected, aborted or failed: counted as infinitely slow
        event_s = getattr(seq, _EVENTS[slo.metric])
        return event_s is None or event_s - seq.arrival_s > slo.limit_s
