"""What a measured capacity means in money and in hardware: $/1M output tokens, the cost/latency
Pareto front, and how many replicas a target load needs.

Kept apart from the sweep so each rule is a small pure function with exact tests, and so the
report's in-page cost editor (JavaScript) can mirror exactly these formulas.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from engine.core.json_errors import json_problem
from sim.files import read_json_input
from sim.hardware import GPUS
from traces.files import existing_path

# Illustrative on-demand list prices in USD per GPU-hour, for comparing configurations only: not a
# quote, and real prices vary widely by provider, region and commitment. Edit here, or pass
# --gpu-cost h200=3.5,h100=2.5 (or a file) to the CLI, or edit the table in report.html.
DEFAULT_GPU_COST_PER_HOUR_USD: dict[str, float] = {
    "h200": 3.50,
    "h100": 2.50,
    "a100-80g": 1.80,
    "l40s": 1.00,
}
SECONDS_PER_HOUR = 3600.0
# A price list is a few lines; a larger "file" is not one (and /dev/zero has no end).
MAX_PRICE_FILE_BYTES = 2**20
TOKENS_PER_MILLION = 1e6
MAX_USD_PER_GPU_HOUR = 1e4  # list prices are a few dollars; far above that is a typo (or a cost of a whole fleet)
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _parse_price(name: str, text: object, source: str) -> tuple[str, float]:
    try:
        if isinstance(text, bool):  # JSON true is no price (float() read it as 1.0)
            raise TypeError
        # Plain decimal notation only: float() also takes '1_000' and other scripts' digits ('٣' is 3).
        if isinstance(text, str) and not _DECIMAL.fullmatch(text.strip()):
            raise ValueError
        price = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{source}: price of {name!r} is {text!r}, expected a number of USD per GPU-hour") from None
    # A free GPU made every configuration on it cost $0 per million tokens and win every comparison; a price near
    # the float limit made the cost of two replicas inf, written as no cost at all.
    if not (math.isfinite(price) and 0 < price <= MAX_USD_PER_GPU_HOUR):
        raise ValueError(f"{source}: price of {name!r} must be a number of USD per GPU-hour above 0 and at most "
                         f"{MAX_USD_PER_GPU_HOUR:g}, got {text!r}")
    key = name.strip().lower()
    if key not in GPUS:
        raise ValueError(f"{source}: unknown GPU {name.strip()!r}; supported: {', '.join(GPUS)}")
    return key, price


def _parse_pairs(text: str, source: str, separators: str) -> dict[str, float]:
    prices: dict[str, float] = {}
    for raw in text.replace("\n", separators[0]).split(separators[0]):
        item = raw.split("#", 1)[0].strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"{source}: cannot parse {item!r}; expected GPU=USD_PER_HOUR, e.g. h200=3.5")
        name, value = item.split("=", 1)
        key, price = _parse_price(name, value.strip(), source)
        _add_price(prices, key, price, source)
    return prices


def _add_price(prices: dict[str, float], key: str, price: float, source: str) -> None:
    """A GPU priced twice is a mistake (which price was meant?), refused as --replicas 1,1 is: the last one won."""
    if key in prices:
        raise ValueError(f"{source}: {key} is priced twice ({prices[key]:g} and {price:g}); give one price per GPU")
    prices[key] = price


def _json_prices(text: str, source: str) -> dict[str, float]:
    try:  # each object as its (name, value) pairs: json.loads kept only the last of a name given twice
        pairs = json.loads(text, object_pairs_hook=list)  # the top level starts with '{': an object
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc})") from None
    except (ValueError, RecursionError) as exc:  # nested thousands deep was a traceback, 5000 digits named no file
        raise ValueError(f"{source}: not valid JSON ({json_problem(exc)})") from None
    prices: dict[str, float] = {}
    for name, value in pairs:
        _add_price(prices, *_parse_price(str(name), value, source), source)
    return prices


def load_gpu_costs(spec: str | None, defaults: Mapping[str, float] = DEFAULT_GPU_COST_PER_HOUR_USD) -> dict[str, float]:
    """`defaults` overridden by `spec`: ``h200=3.5,h100=2.5``, or a file with a JSON object or
    ``gpu=price`` lines (``#`` comments). Errors name the GPU or the file."""
    prices = {name: float(price) for name, price in defaults.items()}
    if spec is None:
        return prices
    if not spec.strip():  # an unset shell variable, most likely: the illustrative prices were used without a word
        raise ValueError("--gpu-cost is empty; expected GPU=USD_PER_HOUR pairs such as h200=3.5,h100=2.5 or a file")
    path = existing_path(spec)  # None for pairs too long to be a file name, as h200=3.5000... is
    if path is not None and path.is_file():
        source = str(path)
        try:
            text = read_json_input(path, MAX_PRICE_FILE_BYTES)
        except UnicodeDecodeError:
            raise ValueError(f"{source}: not UTF-8 text; expected a JSON object or gpu=price lines") from None
        except OSError as exc:
            raise ValueError(f"{source}: cannot read it ({exc.strerror or exc})") from None
        given = _json_prices(text, source) if text.lstrip().startswith("{") else _parse_pairs(text, source, "\n")
        if not given:
            raise ValueError(f"{source}: no price in it; expected a JSON object or gpu=price lines, e.g. h200=3.5")
        return {**prices, **given}
    if "=" not in spec:
        raise ValueError(f"{spec!r} is neither a file nor GPU=USD_PER_HOUR pairs such as h200=3.5,h100=2.5")
    prices.update(_parse_pairs(spec, "--gpu-cost", ","))
    return prices


def cost_per_million_output_tokens_usd(num_replicas: int, tensor_parallel_size: int, usd_per_gpu_hour: float,
                                       tokens_per_s: float) -> float | None:
    """(replicas x TP x $/GPU-hour) / (output tokens per hour / 1e6); None without any tokens."""
    tokens_per_hour = tokens_per_s * SECONDS_PER_HOUR
    if not tokens_per_hour > 0:
        return None
    usd_per_hour = num_replicas * tensor_parallel_size * usd_per_gpu_hour
    return usd_per_hour / (tokens_per_hour / TOKENS_PER_MILLION)


def pareto_front(points: Sequence[tuple[float, float] | None]) -> list[bool]:
    """For (cost, latency) points, lower being better in both: True where no other point dominates.

    A point is dominated by one that is no worse in both and better in at least one; identical
    points do not dominate each other. None (no capacity) is never on the front.
    """
    present = [(i, p) for i, p in enumerate(points) if p is not None]
    on_front = [False] * len(points)
    for i, (cost, latency) in present:
        on_front[i] = not any(
            other_cost <= cost and other_latency <= latency and (other_cost < cost or other_latency < latency)
            for j, (other_cost, other_latency) in present
            if j != i
        )
    return on_front


@dataclass(frozen=True)
class ReplicasNeeded:
    """Fewest replicas for `target_qps`: measured when some replica count reached it, else extrapolated."""

    target_qps: float
    num_replicas: int | None
    extrapolated: bool
    note: str


def replicas_needed(measured: Mapping[int, float | None], target_qps: float) -> ReplicasNeeded:
    """From {num_replicas: max_qps} of one configuration family, the fewest replicas for `target_qps`.

    When no measured count reaches the target, scale linearly from the largest measured count's
    per-replica max QPS (the one that includes most of the router's effect), and say so: real
    scaling is at best linear, so read it as a lower bound.
    """
    reached = sorted(n for n, qps in measured.items() if qps is not None and qps >= target_qps)
    if reached:
        n = reached[0]
        return ReplicasNeeded(target_qps, n, False, f"measured: {n} replica(s) reach {measured[n]:.4g} req/s")
    with_capacity = sorted((n, qps) for n, qps in measured.items() if qps is not None and qps > 0)
    if not with_capacity:
        return ReplicasNeeded(target_qps, None, False, "no measured replica count met the SLOs at any QPS")
    n, qps = with_capacity[-1]
    per_replica_qps = qps / n
    needed = math.ceil(target_qps / per_replica_qps - 1e-9)
    return ReplicasNeeded(
        target_qps,
        needed,
        True,
        f"extrapolated linearly from {n} replica(s) at {qps:.4g} req/s ({per_replica_qps:.4g} req/s per replica)",
    )


@dataclass(frozen=True)
class ConfigEconomics:
    """The money and hardware view of one configuration's capacity (None where undefined)."""

    num_gpus: int
    usd_per_gpu_hour: float | None
    output_tokens_per_s: float | None
    cost_per_million_output_tokens_usd: float | None
    pareto_latency_ms: float | None
    on_pareto_front: bool
    replicas_needed: ReplicasNeeded | None


def assess(results: Sequence, gpu_costs: Mapping[str, float], target_qps: float,
           pareto_key: str) -> list[ConfigEconomics]:
    """Cost, Pareto membership and replicas needed for each `analysis.capacity.sweep.ConfigResult`.

    `pareto_key` names the SLO statistic (e.g. ``ttft_p90``) used as the latency axis, read at
    each configuration's max QPS.
    """
    families: dict[tuple, list[int]] = {}  # indices of the configurations that differ only in their replica count
    for index, result in enumerate(results):
        options = tuple((k, v) for k, v in asdict(result.config).items() if k != "num_replicas")
        families.setdefault(options, []).append(index)
    needed_by_index: dict[int, ReplicasNeeded] = {}
    for members in families.values():
        answer = replicas_needed({results[i].config.num_replicas: results[i].max_qps for i in members}, target_qps)
        unsure = sorted({results[i].kind for i in members if not results[i].is_answer})
        if unsure and answer.num_replicas is not None:
            answer = dataclasses.replace(answer, note=f"{answer.note}; from capacities that are not all converged "
                                         f"answers ({', '.join(k.replace('_', ' ') for k in unsure)})")
        needed_by_index.update(dict.fromkeys(members, answer))
    rows = []
    for result in results:
        config, point = result.config, result.point_at_max
        price = gpu_costs.get(config.gpu.lower())
        # The steady token rate of serving max_qps, not the replay's measured throughput (which its ramp-up and
        # drain dilute).
        tokens_per_s = result.max_qps * point.output_tokens_per_request if point else None
        cost = None
        if price is not None and tokens_per_s is not None:
            cost = cost_per_million_output_tokens_usd(config.num_replicas, config.tensor_parallel_size, price,
                                                      tokens_per_s)
        latency = point.slo_values_ms.get(pareto_key) if point else None
        rows.append((config.num_replicas * config.tensor_parallel_size, price, tokens_per_s, cost, latency))
    # Only converged answers compete: a cost from a lower bound or an open bracket is not a cost one can bank on.
    front = pareto_front([(c, lat) if c is not None and lat is not None and result.is_answer else None
                          for result, (*_, c, lat) in zip(results, rows)])
    return [
        ConfigEconomics(num_gpus, price, tokens_per_s, cost, latency, front[i], needed_by_index.get(i))
        for i, (num_gpus, price, tokens_per_s, cost, latency) in enumerate(rows)
    ]


def replicas_needed_by_family(
    family_labels: Sequence[str], economics: Sequence[ConfigEconomics]
) -> dict[str, ReplicasNeeded | None]:
    """{family label: replicas needed}, in first-appearance order; every member of a family shares the answer."""
    answers: dict[str, ReplicasNeeded | None] = {}
    for label, econ in zip(family_labels, economics):
        answers.setdefault(label, econ.replicas_needed)
    return answers
