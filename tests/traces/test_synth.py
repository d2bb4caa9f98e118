"""Synthetic traces: arrival processes, length distributions and multi-turn sessions."""

from __future__ import annotations

import numpy as np
import pytest

from traces.lengths import parse_length_dist
from traces.synth import SynthConfig, synthesize


def test_single_turn_poisson_is_deterministic_and_at_rate() -> None:
    config = SynthConfig(num_requests=4000, qps=8.0, prompt_dist="fixed:100", output_dist="uniform:low=10,high=20",
                         seed=5)
    trace = synthesize(config)
    requests = trace.requests
    assert requests["request_id"].to_list() == list(range(4000))
    assert set(requests["prompt_tokens"]) == {100}
    assert set(requests["output_tokens"]) == set(range(10, 21))
    arrivals = requests["arrival_s"].to_numpy()
    assert arrivals[0] == 0.0
    assert (len(arrivals) - 1) / arrivals[-1] == pytest.approx(8.0, rel=0.05)
    gaps = np.diff(arrivals)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert synthesize(config).requests.equals(requests)
    assert not synthesize(SynthConfig(**{**config.__dict__, "seed": 6})).requests.equals(requests)
    assert "hash_ids" not in requests.columns and trace.hash_block_size is None


@pytest.mark.parametrize("cv", [0.0, 0.5, 3.0])
def test_gamma_arrivals_have_the_requested_cv(cv: float) -> None:
    trace = synthesize(SynthConfig(num_requests=20_000, qps=10.0, arrival_cv=cv, seed=1))
    gaps = np.diff(trace.requests["arrival_s"].to_numpy())
    assert gaps.mean() == pytest.approx(0.1, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.1 * max(cv, 0.2))


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    lognormal = parse_length_dist("lognormal:mean=161,sigma=1.0").sample(200_000, rng)
    assert lognormal.mean() == pytest.approx(161, rel=0.02)
    median = parse_length_dist("lognormal:median=100,sigma=0.5").sample(100_000, rng)
    assert np.median(median) == pytest.approx(100, rel=0.02)
    capped = parse_length_dist("lognormal:mean=1000,sigma=2,max=50").sample(1000, rng)
    assert capped.max() == 50 and capped.min() >= 1
    assert parse_length_dist("fixed:7").sample(3, rng).tolist() == [7, 7, 7]
    assert parse_length_dist("fixed:value=7") == parse_length_dist("fixed:value=7")
    turns = parse_length_dist("geometric:mean=3.51,max=40")
    assert turns.sample(200_000, rng).mean() == pytest.approx(turns.mean(), rel=0.01)
    assert turns.mean() == pytest.approx(3.51, rel=0.001)
    sharegpt_prompt = parse_length_dist("sharegpt", "prompt").sample(200_000, rng)
    sharegpt_output = parse_length_dist("sharegpt", "output").sample(200_000, rng)
    assert sharegpt_prompt.mean() == pytest.approx(161, rel=0.02)
    assert sharegpt_output.mean() == pytest.approx(338, rel=0.02)


def test_lognormal_mean_is_that_of_the_capped_draws() -> None:
    """mean() was exp(mu + sigma**2 / 2) whatever the cap: 2.47 for lognormal:median=1.5,sigma=1,max=2, whose draws
    are 1 or 2 with P(X > 1.5) = 1/2, so average 1.5. Figures checked by summing P(X > k + 1/2) over every k."""
    assert parse_length_dist("lognormal:median=1.5,sigma=1,max=2").mean() == 1.5
    assert parse_length_dist("lognormal:mean=10,sigma=1.5,max=3").mean() == pytest.approx(2.265779347290022, rel=1e-12)
    # past 10,000 terms the tail is integrated: within 1e-9 of the 999,999-term sum
    assert parse_length_dist("lognormal:mean=5000,sigma=2,max=1000000").mean() == pytest.approx(4883.762607636014,
                                                                                              rel=1e-9)
    assert parse_length_dist("lognormal:median=2.5,sigma=0,max=5").mean() == 2.0  # rint(2.5), as sample draws
    rng = np.random.default_rng(0)
    for spec in ("lognormal:mean=10,sigma=1.5,max=3", "lognormal:mean=3,sigma=0.5"):
        dist = parse_length_dist(spec)
        assert dist.sample(1_000_000, rng).mean() == pytest.approx(dist.mean(), rel=0.003)


def test_capped_lognormal_turns_give_the_requested_rate() -> None:
    """Sessions start at qps / mean turns: with the uncapped mean (2.47 for 1.5 drawn) requests came at 0.61 x qps."""
    config = SynthConfig(num_requests=20_000, qps=5.0, multi_turn=True, turns_dist="lognormal:median=1.5,sigma=1,max=2",
                         seed=0)
    arrivals = synthesize(config).requests["arrival_s"].to_numpy()
    assert (len(arrivals) - 1) / arrivals[-1] == pytest.approx(5.0, rel=0.03)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("zipf:a=2", "unknown kind 'zipf'"),
        ("fixed:0", "integer >= 1"),
        ("uniform:low=5", r"missing \['high'\]"),
        ("uniform:low=9,high=5", "low <= high"),
        # low=1.5 drew 1s, and the mean that sets the session rate (2 for low=1.5,high=2.5) was not the draws' (1.5)
        ("uniform:low=1.5,high=2.5", "low and high must be integers"),
        ("geometric:mean=3,max=40.5", "max must be an integer >= 1"),
        ("lognormal:mean=100,sigma=1,max=0.5", "max must be an integer >= 1"),
        ("lognormal:sigma=1", "exactly one of mean= or median="),
        ("lognormal:mean=10,median=5,sigma=1", "exactly one of"),
        ("lognormal:mean=abc,sigma=1", "'mean' is 'abc', not a number"),
        ("geometric:mean=0.5", "mean must be >= 1"),
        ("fixed:value=3,colour=2", r"unknown \['colour'\]"),
        ("sharegpt:x=1", "takes no parameters"),
        ("uniform:low=10,high=20,low=3", "'low' is given twice; expected each key once"),  # drew from 3, unsaid
        ("fixed:5,value=6", "'value' is given twice"),
    ],
)
def test_bad_distribution_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_length_dist(spec)


MULTI = SynthConfig(
    num_requests=1500, qps=5.0, multi_turn=True, think_time_s=10.0, hash_block_size=16, max_context_tokens=8192, seed=2
)


@pytest.fixture(scope="module")
def multi_turn():
    return synthesize(MULTI)


def test_multi_turn_later_turns_extend_earlier_prompts(multi_turn) -> None:
    requests = multi_turn.requests
    assert multi_turn.hash_block_size == 16
    assert requests["request_id"].to_list() == list(range(len(requests)))
    checked = 0
    for _, session in requests.sort("session_id", "turn").group_by("session_id", maintain_order=True):
        rows = session.to_dicts()
        for earlier, later in zip(rows, rows[1:]):
            if later["turn"] != earlier["turn"] + 1:
                continue
            # the next prompt holds the previous prompt, its answer and a new message of >= 1 token
            assert later["prompt_tokens"] >= earlier["prompt_tokens"] + earlier["output_tokens"] + 1
            assert later["hash_ids"][: len(earlier["hash_ids"])] == earlier["hash_ids"]
            assert later["arrival_s"] > earlier["arrival_s"]
            a = multi_turn.prompt_token_ids(earlier["request_id"], 1000)
            b = multi_turn.prompt_token_ids(later["request_id"], 1000)
            assert b[: len(a)] == a
            checked += 1
    assert checked > 500


def test_multi_turn_sessions_share_nothing_and_fit_the_context(multi_turn) -> None:
    requests = multi_turn.requests
    owners: dict[int, int] = {}
    for session, hash_ids in requests.select("session_id", "hash_ids").iter_rows():
        for block in hash_ids:
            assert owners.setdefault(block, session) == session
    assert ((requests["prompt_tokens"] + requests["output_tokens"]) <= 8192).all()
    assert requests["arrival_s"][0] == 0.0
    rate = (len(requests) - 1) / requests["arrival_s"][-1]
    assert rate == pytest.approx(5.0, rel=0.1)  # steady state from the start thanks to the warm-up


def test_multi_turn_is_deterministic(multi_turn) -> None:
    assert synthesize(MULTI).requests.equals(multi_turn.requests)


def test_multi_turn_first_turn_lengths_follow_the_prompt_dist() -> None:
    config = SynthConfig(
        num_requests=300, qps=2.0, multi_turn=True, prompt_dist="fixed:20", output_dist="fixed:30",
        turns_dist="fixed:3", think_time_s=5.0, think_time_cv=0.0, warmup_s=0.0, seed=0,
    )
    requests = synthesize(config).requests
    by_turn = {turn: set(requests.filter(requests["turn"] == turn)["prompt_tokens"]) for turn in range(3)}
    assert by_turn == {0: {20}, 1: {70}, 2: {120}}
    assert set(requests["output_tokens"]) == {30}
    assert set(requests["hash_ids"].list.len()) == {2, 5, 8}  # ceil(20/16), ceil(70/16), ceil(120/16)
    session0 = requests.filter(requests["session_id"] == 0)
    assert session0["arrival_s"].to_list() == pytest.approx([0.0, 5.0, 10.0])


def test_bad_configs() -> None:
    with pytest.raises(ValueError, match="num_requests"):
        SynthConfig(num_requests=0, qps=1.0)
    with pytest.raises(ValueError, match="qps"):
        SynthConfig(num_requests=1, qps=0.0)


def _sessions_one_at_a_time(num_requests, mean_start_gap_s, arrival_cv, config, seed, warmup_s):
    """The session-at-a-time builder the vectorised one replaced: its reference, draw for draw (sessions started
    ``mean_start_gap_s`` apart on average)."""
    import polars as pl

    from engine.core.config import cdiv
    from traces.arrivals import gamma_gaps_s
    from traces.sessions import SessionStreams

    streams = SessionStreams.from_seed(seed)
    columns = {"arrival_s": [], "prompt_tokens": [], "output_tokens": [], "hash_ids": [], "session_id": [], "turn": []}
    next_block_id = 0

    def add_session(session_id, start_s):
        nonlocal next_block_id
        num_turns = int(config.turns.sample(1, streams.turns)[0])
        user = config.user_tokens.sample(num_turns, streams.user)
        answer = config.answer_tokens.sample(num_turns, streams.answer)
        gaps = gamma_gaps_s(num_turns, config.think_time_s, config.think_time_cv, streams.think)
        blocks, stream_tokens, arrival = [], 0, start_s
        for turn in range(num_turns):
            prompt, output = stream_tokens + int(user[turn]), int(answer[turn])
            if prompt + output > config.max_context_tokens:
                if turn > 0:
                    break
                prompt = max(1, min(prompt, config.max_context_tokens // 2))
                output = max(1, min(output, config.max_context_tokens - prompt))
            while len(blocks) < cdiv(prompt, config.hash_block_size):
                blocks.append(next_block_id)
                next_block_id += 1
            for name, value in (("arrival_s", arrival), ("prompt_tokens", prompt), ("output_tokens", output),
                                ("hash_ids", blocks[: cdiv(prompt, config.hash_block_size)]),
                                ("session_id", session_id), ("turn", turn)):
                columns[name].append(value)
            stream_tokens = prompt + output
            arrival += float(gaps[turn])

    def kth_arrival_s():
        arrivals = np.asarray(columns["arrival_s"])
        arrivals = arrivals[arrivals >= 0]
        if arrivals.size < num_requests:
            return None
        return float(np.partition(arrivals, num_requests - 1)[num_requests - 1])

    session_id, next_start_s = 0, -warmup_s
    while True:
        for gap_s in gamma_gaps_s(256, mean_start_gap_s, arrival_cv, streams.starts):
            kth = kth_arrival_s() if next_start_s >= 0 else None
            if kth is not None and next_start_s > kth:
                break
            add_session(session_id, next_start_s)
            session_id += 1
            next_start_s += float(gap_s)
        else:
            continue
        break
    frame = pl.DataFrame(columns, schema_overrides={"hash_ids": pl.List(pl.Int64)})
    frame = frame.filter(pl.col("arrival_s") >= 0).sort(["arrival_s", "session_id", "turn"]).head(num_requests)
    frame = frame.with_columns(pl.col("arrival_s") - pl.col("arrival_s").first())
    return frame.with_row_index("request_id").with_columns(pl.col("request_id").cast(pl.Int64))


@pytest.mark.parametrize("options", [
    {},
    {"qps": 60.0, "arrival_cv": 2.5, "think_time_cv": 0.5, "max_context_tokens": 600,
     "prompt_dist": "lognormal:mean=300,sigma=1.2"},  # first turns cut to fit, sessions ended early
    {"qps": 3.0, "warmup_s": 0.0, "turns_dist": "uniform:low=1,high=60", "hash_block_size": 7, "arrival_cv": 0.0,
     "think_time_cv": 0.0},
    {"num_requests": 1},
])
def test_multi_turn_sessions_are_those_drawn_one_at_a_time(options, monkeypatch) -> None:
    from traces import sessions

    config = SynthConfig(**{"num_requests": 2500, "qps": 40.0, "multi_turn": True, "seed": 3, **options})
    vectorised = synthesize(config).requests
    build = sessions._build_sessions

    def reference(*args):  # its sessions, with the counts of turns kept and drawn that set the second pass's starts
        return _sessions_one_at_a_time(*args), *build(*args)[1:]

    monkeypatch.setattr(sessions, "_build_sessions", reference)
    assert vectorised.equals(synthesize(config).requests)


def test_multi_turn_span_follows_qps_at_a_very_low_rate() -> None:
    """At --qps 1e-9 sessions (3.51 turns 30 s apart) are ~3.5e9 s apart, so a short trace is mostly turns of one
    session: 2 requests read 0.035 req/s (seed 0), as in 71% of seeds. That is the within-session rate, not a biased
    start (seed 0's two turns are session 1's; the session at -warmup_s reaches the window in 2% of seeds): over
    seeds the span of N requests averages (N - 1) / qps."""
    qps, num_requests = 1e-9, 20
    spans_s = [synthesize(SynthConfig(num_requests=num_requests, qps=qps, multi_turn=True, seed=seed))
               .requests["arrival_s"][-1] for seed in range(200)]
    assert np.mean(spans_s) * qps / (num_requests - 1) == pytest.approx(1.0, abs=0.1)
