"""Integer-valued distributions for token lengths and turns per session, parsed from CLI text.

Spec syntax: `KIND[:key=value,...]`, for example `fixed:512` (or `fixed:value=512`),
`uniform:low=64,high=1024`, `lognormal:mean=161,sigma=1.0`, `lognormal:median=100,sigma=1,max=4096`,
`geometric:mean=3.51,max=40`, or the preset `sharegpt`, whose meaning depends on what is being
drawn (see SHAREGPT_PRESETS and traces/README.md for the published figures behind it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Published ShareGPT figures (sources in traces/README.md):
#  - mean input 161 and mean output 338 tokens per request: Kwon et al., "Efficient Memory
#    Management for Large Language Model Serving with PagedAttention", SOSP 2023, Fig. 11;
#  - 3.51 turns per conversation (330,239 turns / 94,145 conversations): Yan et al.,
#    "ShareChat: A Dataset of Chatbot Conversations in the Wild", arXiv:2512.17843, Table 1.
# The shapes (lognormal sigmas, geometric turns, the caps) are our assumptions.
SHAREGPT_PRESETS: dict[str, str] = {
    "prompt": "lognormal:mean=161,sigma=1.0,max=4096",
    "output": "lognormal:mean=338,sigma=0.8,max=4096",
    "turns": "geometric:mean=3.51,max=40",
}

_KINDS = ("fixed", "uniform", "lognormal", "geometric", "sharegpt")


@dataclass(frozen=True)
class LengthDist:
    """A distribution over integers >= 1; `spec` is the text it was parsed from."""

    kind: str
    params: tuple[tuple[str, float], ...]
    spec: str

    def param(self, name: str, default: float | None = None) -> float | None:
        return dict(self.params).get(name, default)

    def sample(self, num: int, rng: np.random.Generator) -> np.ndarray:
        """`num` draws as int64, each >= 1 (and <= max when a max is given)."""
        p = dict(self.params)
        if self.kind == "fixed":
            values = np.full(num, p["value"], dtype=np.float64)
        elif self.kind == "uniform":
            values = rng.integers(int(p["low"]), int(p["high"]), size=num, endpoint=True).astype(np.float64)
        elif self.kind == "lognormal":
            values = np.rint(rng.lognormal(_lognormal_mu(p), p["sigma"], size=num))
        elif self.kind == "geometric":
            values = rng.geometric(1.0 / p["mean"], size=num).astype(np.float64)
        else:  # pragma: no cover - parse_length_dist only builds known kinds
            raise AssertionError(self.kind)
        # Without max= the draws are capped at MAX_LENGTH (beyond any model's context): uncapped, a lognormal draw
        # past 2**63 (median=2**40,sigma=10) cast to int64 as -2**63 (a RuntimeWarning, then a misleading "token
        # counts must be >= 1" error), and draws up to 2**63 were written silently, or summed past int64 in sessions.
        upper = p.get("max", MAX_LENGTH)
        return np.clip(values, 1, upper).astype(np.int64)

    def mean(self) -> float:
        """The mean of `sample`, cap included (exact, or for lognormal to double precision)."""
        p = dict(self.params)
        if self.kind == "fixed":
            return float(p["value"])
        if self.kind == "uniform":
            return (p["low"] + p["high"]) / 2
        if self.kind == "lognormal":
            return _lognormal_sample_mean(_lognormal_mu(p), p["sigma"], p.get("max", MAX_LENGTH))  # sample's cap
        prob = 1.0 / p["mean"]
        cap = p.get("max")
        if cap is None:  # sample caps at MAX_LENGTH: mean=1e12 keeps 2/3 of its mean; a usual mean is unchanged
            cap = MAX_LENGTH
            if (1 - prob) ** cap == 0:
                return p["mean"]
        if cap > _SUMMED_CAP:  # E[min(X, cap)] in closed form: summing 10^12 terms would not end
            return float((1 - (1 - prob) ** cap) / prob)
        ks = np.arange(1, int(cap))
        pmf = prob * (1 - prob) ** (ks - 1)
        return float((ks * pmf).sum() + cap * (1 - prob) ** (cap - 1))


def _lognormal_mu(p: dict[str, float]) -> float:
    if "median" in p:
        return math.log(p["median"])
    return math.log(p["mean"]) - p["sigma"] ** 2 / 2


def _lognormal_sample_mean(mu: float, sigma: float, cap: float) -> float:
    """E[clip(rint(X), 1, cap)] for X lognormal(mu, sigma), what `sample` draws. exp(mu + sigma**2 / 2) ignored the
    cap: `--turns lognormal:...,max=N` started sessions at qps / that mean and gave a request rate below --qps.

    clip(rint(X), 1, cap) > k exactly when X > k + 1/2 (for 1 <= k < cap), so the mean is
    1 + sum over k = 1 .. cap - 1 of P(X > k + 1/2): the first terms are summed one by one, the rest, where
    P(X > x) is smooth on the scale of one token, integrated in closed form (the midpoint rule)."""
    if sigma == 0:
        return float(np.clip(np.rint(math.exp(mu)), 1, cap))

    def survival(x: float) -> float:
        return 0.5 * math.erfc((math.log(x) - mu) / (sigma * math.sqrt(2)))

    summed_to = min(cap, _SUMMED_TERMS)
    total = 1.0 + math.fsum(survival(k + 0.5) for k in range(1, int(summed_to)))
    if cap > summed_to:
        total += _lognormal_survival_integral(mu, sigma, summed_to, cap)
    return total


def _lognormal_survival_integral(mu: float, sigma: float, low: float, high: float) -> float:
    """The integral of P(X > x) from low to high (high may be inf): [x P(X > x)] plus the partial mean of X."""
    def upper_tail(z: float) -> float:  # P(Z > z) for a standard normal Z
        return 0.5 * math.erfc(z / math.sqrt(2))

    def z_of(x: float, shift: float) -> float:
        return (math.log(x) - mu - shift) / sigma

    at_high = 0.0 if high == math.inf else high * upper_tail(z_of(high, 0.0))
    at_low = low * upper_tail(z_of(low, 0.0))
    # P(a < Z < b) from the tails that are small: Q(a) - Q(b) with both near 1 (sigma=10: a and b below -10) lost
    # every digit, times exp(mu + sigma**2 / 2) ~ 1e33, and the mean of median=2**40,sigma=10 came out 8 % low.
    a, b = z_of(low, sigma**2), (math.inf if high == math.inf else z_of(high, sigma**2))
    # (Only where both tails are near 1, b <= 0: elsewhere Q(a) - Q(b) keeps its digits, and its value as before.)
    between = upper_tail(-b) - upper_tail(-a) if b <= 0 else upper_tail(a) - upper_tail(b)
    partial_mean = math.exp(mu + sigma**2 / 2) * between
    return at_high - at_low + partial_mean


# Lengths in tokens (or turns) beyond any model's context; a sigma past 10 spreads one draw over 10^8 and more,
# and past ~37 exp(sigma**2 / 2) overflows.
MAX_LENGTH = float(2**40)
MAX_SIGMA = 10.0

_SUMMED_CAP = 1_000_000  # a geometric mean's cap up to which the capped mean is summed term by term
_SUMMED_TERMS = 10_000  # terms of a lognormal mean summed one by one before its tail is integrated

_ALLOWED = {
    "fixed": ({"value"}, set()),
    "uniform": ({"low", "high"}, set()),
    "lognormal": ({"sigma"}, {"mean", "median", "max"}),
    "geometric": ({"mean"}, {"max"}),
}


def parse_length_dist(text: str, role: str = "prompt") -> LengthDist:
    """Parse a spec; `role` ('prompt', 'output' or 'turns') picks the `sharegpt` preset."""
    kind, _, rest = text.strip().partition(":")
    if kind not in _KINDS:
        raise ValueError(f"distribution {text!r}: unknown kind {kind!r}; expected one of {', '.join(_KINDS)}")
    if kind == "sharegpt":
        if rest:
            raise ValueError(f"distribution {text!r}: 'sharegpt' takes no parameters")
        if role not in SHAREGPT_PRESETS:
            raise ValueError(f"no sharegpt preset for {role!r}; expected one of {', '.join(SHAREGPT_PRESETS)}")
        preset = parse_length_dist(SHAREGPT_PRESETS[role], role)
        return LengthDist(preset.kind, preset.params, text)
    params: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            if kind == "fixed" and not params:
                key, value = "value", item
            else:
                raise ValueError(f"distribution {text!r}: expected key=value, got {item!r}")
        if key.strip() in params:  # uniform:low=10,high=20,low=3 drew from 3 to 20, the first low dropped unsaid
            raise ValueError(f"distribution {text!r}: {key.strip()!r} is given twice; expected each key once")
        try:
            params[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"distribution {text!r}: {key.strip()!r} is {value!r}, not a number") from None
    required, optional = _ALLOWED[kind]
    unknown = set(params) - required - optional
    missing = required - set(params)
    if unknown or missing:
        raise ValueError(
            f"distribution {text!r}: {kind} takes {', '.join(sorted(required))}"
            + (f" and optionally {', '.join(sorted(optional))}" if optional else "")
            + (f"; unknown {sorted(unknown)}" if unknown else "")
            + (f"; missing {sorted(missing)}" if missing else "")
        )
    _check_values(kind, params, text)
    return LengthDist(kind, tuple(sorted(params.items())), text)


def _check_values(kind: str, p: dict[str, float], text: str) -> None:
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"distribution {text!r}: {what}")

    for key, value in p.items():  # NaN, inf and 1e308 overflowed math.exp or int64 as tracebacks
        limit, shown = (MAX_SIGMA, "10") if key == "sigma" else (MAX_LENGTH, "2**40")
        need(math.isfinite(value) and abs(value) <= limit, f"{key} must be a finite number up to {shown}")
    if kind == "fixed":
        need(p["value"] >= 1 and p["value"] == int(p["value"]), "value must be an integer >= 1")
    elif kind == "uniform":  # low=1.5 drew 1s, below it, and the mean the session rate is set by was not the draws'
        need(p["low"] == int(p["low"]) and p["high"] == int(p["high"]), "low and high must be integers")
        need(1 <= p["low"] <= p["high"], "need 1 <= low <= high")
    elif kind == "lognormal":
        need(("mean" in p) != ("median" in p), "give exactly one of mean= or median=")
        need(p.get("mean", p.get("median", 0)) > 0, "mean/median must be > 0")
        need(p["sigma"] >= 0, "sigma must be >= 0")
    elif kind == "geometric":
        need(p["mean"] >= 1, "mean must be >= 1 (a geometric draw is at least 1: one token, or one turn)")
    if "max" in p:  # draws are cut to a whole number: a cap of 40.5 drew at most 40 and took the mean at 40.5
        need(p["max"] >= 1 and p["max"] == int(p["max"]), "max must be an integer >= 1")
