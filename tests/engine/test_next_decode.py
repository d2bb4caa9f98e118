"""The runner prepares the next decode step while the current one runs (ModelRunner.NextDecode): whenever it
uses that preparation, it must be exactly the plan and sampling inputs a fresh plan of the batch gives,
including rows whose next token opens a new block, seeded rows' counters, and batches that change."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402


def test_a_prepared_next_step_equals_a_fresh_plan_of_the_batch(tiny_qwen3, monkeypatch) -> None:
    llm = LLM(tiny_qwen3[0], block_size=16, max_model_len=256, num_gpu_blocks=64, seed=3, run_ahead=False)
    runner = llm.runner
    real_take = runner._take_next_decode
    used: list[int] = []  # boundary rows of each prepared step that was used
    fell_back = [0]

    def checked_take(batch):
        nxt = real_take(batch)
        if nxt is None:
            fell_back[0] += 1
            return None
        fresh = runner.plan(batch)
        plan = nxt.plan
        assert (plan.ids, list(plan.positions), list(plan.slots)) == (fresh.ids, list(fresh.positions),
                                                                     list(fresh.slots))
        assert np.array_equal(plan.decode_tables, fresh.decode_tables)
        assert (plan.num_decode, plan.logits_indices, plan.sample_rows, plan.graph_bs, plan.piecewise_size) == (
            fresh.num_decode, fresh.logits_indices, fresh.sample_rows, fresh.graph_bs, fresh.piecewise_size)
        rows, fresh_rows = nxt.sampling, runner._sampling_rows(batch, fresh)
        assert rows.temperatures == fresh_rows.temperatures and rows.all_greedy == fresh_rows.all_greedy
        if not rows.all_greedy:
            assert rows.seeded_rows == fresh_rows.seeded_rows and rows.filtered_rows == fresh_rows.filtered_rows
            # The first word of unseeded rows is drawn when the step runs; every other word must agree.
            assert np.array_equal(rows.words[:, 1:], fresh_rows.words[:, 1:])
            assert np.array_equal(rows.words[rows.seeded_rows], fresh_rows.words[rows.seeded_rows])
        used.append(len(nxt.boundary_rows))
        return nxt

    monkeypatch.setattr(runner, "_take_next_decode", checked_take)
    prompts = [[(3 * i + k) % 500 for k in range(n)] for i, n in enumerate((5, 14, 15, 30, 47, 9))]
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, max_tokens=12 + 7 * i, ignore_eos=True,
                             seed=1000 + i if i % 2 else None) for i in range(len(prompts))]
    seqs = _serve(llm.engine, prompts, params)
    assert len(used) > 20 and fell_back[0] > 3
    assert sum(1 for n in used if n) > 3  # rows crossing into a new block were patched and checked
    # The runner used a prepared step exactly where the scheduler marked the batch as repeating the one before:
    # the flag the simulator prices decode steps by.
    steps = llm.engine.step_log.to_arrow()
    assert runner.timings.num_prepared_steps == len(used) == sum(steps.column("continues_batch").to_pylist())
    # The same requests planned afresh every step give the same tokens.
    again = LLM(tiny_qwen3[0], block_size=16, max_model_len=256, num_gpu_blocks=64, seed=3, run_ahead=False)
    monkeypatch.setattr(again.runner, "_take_next_decode", lambda batch: None)
    assert [s.token_ids for s in seqs] == [s.token_ids for s in _serve(again.engine, prompts, params)]


def _serve(engine, prompts, params) -> list:
    """Four requests, then two more arriving mid-decode (the batch changes), stepped to the end."""
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts[:4], params[:4])]
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == 6:
            seqs += [engine.add_request(p, sp) for p, sp in zip(prompts[4:], params[4:])]
    return seqs


def test_a_prepared_graph_step_stages_the_inputs_a_fresh_one_would(tiny_qwen3, monkeypatch) -> None:
    """The decode graphs' host inputs (ids, positions, slots, context lengths, row order, long rows, padded block
    tables) of a prepared step equal those built from a fresh plan. There are no CUDA graphs on CPU, so the
    runner is told it has one of 16 rows (with long-context rows) and its steps run eagerly."""
    import dataclasses
    from types import SimpleNamespace

    from engine.gpu.attention.triton_kernels_host import DecodeSplits

    llm = LLM(tiny_qwen3[0], block_size=16, max_model_len=256, num_gpu_blocks=64, seed=3, run_ahead=False)
    runner = llm.runner
    monkeypatch.setattr(runner, "graphs", {16: None})
    monkeypatch.setattr(runner, "_graph_sizes", [16], raising=False)
    monkeypatch.setattr(runner, "_max_graph_bs", 16, raising=False)
    splits = DecodeSplits(num_splits=2, fill_splits=1, cap_tiles=1, num_long_seqs=2)  # contexts > 64: long
    monkeypatch.setattr(runner, "_graph_meta", {16: SimpleNamespace(decode_splits=splits)}, raising=False)
    real_materialize, real_take = runner.materialize, runner._take_next_decode
    monkeypatch.setattr(runner, "materialize",
                        lambda plan, graph_host=None: real_materialize(dataclasses.replace(plan, graph_bs=0)))
    checked = []

    def checked_take(batch):
        nxt = real_take(batch)
        if nxt is not None:
            assert nxt.plan.graph_bs == 16
            fresh_flat, fresh_tables = runner._graph_host(runner.plan(batch))
            flat, tables = nxt.graph_host
            assert np.array_equal(flat, fresh_flat) and np.array_equal(tables, fresh_tables)
            checked.append((len(nxt.boundary_rows), int((flat[5 * 16 :] >= 0).sum())))
        return nxt

    monkeypatch.setattr(runner, "_take_next_decode", checked_take)
    prompts = [[(3 * i + k) % 500 for k in range(n)] for i, n in enumerate((5, 14, 15, 30, 47, 9))]
    params = [SamplingParams(temperature=0.7, max_tokens=20 + 9 * i, ignore_eos=True) for i in range(6)]
    _serve(llm.engine, prompts, params)
    assert len(checked) > 20
    assert any(boundary for boundary, _ in checked) and any(long_rows for _, long_rows in checked)
