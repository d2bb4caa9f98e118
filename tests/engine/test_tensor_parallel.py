"""tensor_parallel_size=2 over gloo on CPU gives the same greedy tokens as a single process."""

from __future__ import annotations

import multiprocessing

import pytest

torch = pytest.importorskip("torch")

from engine import LLM, SamplingParams  # noqa: E402


def test_tp2_gloo_matches_tp1(tiny_qwen3):
    path, _ = tiny_qwen3
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (3, 20, 45, 70)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    options = dict(block_size=16, max_model_len=128, max_num_batched_tokens=64, device="cpu")
    single = LLM(path, **options)
    expected = [o["token_ids"] for o in single.generate(prompts, params, use_tqdm=False)]
    single.close()
    with LLM(path, tensor_parallel_size=2, **options) as llm:
        got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
        workers = llm.runner._workers
    assert got == expected
    assert all(not w.is_alive() for w in workers), "workers must exit when the engine closes"
    assert not multiprocessing.active_children()


def test_tp_size_must_divide_heads(tiny_qwen3):
    path, _ = tiny_qwen3
    with pytest.raises(ValueError, match="not divisible by tensor_parallel_size"):
        LLM(path, tensor_parallel_size=3, block_size=16, max_model_len=128, device="cpu")
    assert not multiprocessing.active_children(), "a failed start must not leave workers behind"
    assert not torch.distributed.is_initialized()


def _tp2(path, **extra):
    return LLM(path, tensor_parallel_size=2, block_size=16, max_model_len=128, max_num_batched_tokens=64,
               device="cpu", **extra)


def test_an_idle_engine_outlives_the_collective_timeout(tiny_qwen3, monkeypatch):
    # Workers waited for the next plan in a gloo collective, which timed out after COLLECTIVE_TIMEOUT (120 s): a
    # server idle for two minutes lost every worker, and every later request failed. Plans now come over pipes.
    import time
    from datetime import timedelta

    import engine.gpu.distributed as distributed

    # The workers get it too. Start-up does not: the ranks wait for each other there under START_TIMEOUT (a worker
    # spawned on a busy two-core machine joined after more than 3 s, and a start under this timeout failed).
    monkeypatch.setattr(distributed, "COLLECTIVE_TIMEOUT", timedelta(seconds=3))
    path, _ = tiny_qwen3
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with _tp2(path) as llm:
        first = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0]
        time.sleep(5)  # longer than the timeout, idle
        assert all(w.is_alive() for w in llm.runner._workers)
        again = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0]
    assert again["error"] is None and again["token_ids"] == first["token_ids"]
    assert not multiprocessing.active_children()


def test_a_step_that_fails_after_its_plan_went_out_stops_the_engine_cleanly(tiny_qwen3, monkeypatch):
    # The workers ran the step's collectives and rank 0 did not: the next step's would pair with theirs (on NCCL a
    # hang or wrong sums). Every later step fails with the reason, and closing does not wait on the workers.
    path, _ = tiny_qwen3
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = _tp2(path)
    try:
        def fail(*args, **kwargs):
            raise RuntimeError("injected failure on rank 0")

        monkeypatch.setattr(llm.runner, "materialize", fail)
        out = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]
        assert out["finish_reason"] == "error" and "injected failure" in out["error"]
        monkeypatch.undo()
        later = llm.generate([[4, 5, 6]], params, use_tqdm=False)[0]
        assert later["finish_reason"] == "error"
        assert "cannot run more steps: a step failed on rank 0 after its plan went to the workers" in later["error"]
        workers = llm.runner._workers
    finally:
        llm.close()
    assert all(not w.is_alive() for w in workers) and not multiprocessing.active_children()
    assert not torch.distributed.is_initialized()


def test_a_dead_worker_is_reported_and_the_engine_closes(tiny_qwen3):
    path, _ = tiny_qwen3
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = _tp2(path)
    try:
        worker = llm.runner._workers[0]
        worker.kill()
        worker.join(5)
        out = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]
        assert out["finish_reason"] == "error" and f"worker process(es) [{worker.pid}] died" in out["error"]
    finally:
        llm.close()
    assert not multiprocessing.active_children() and not torch.distributed.is_initialized()



def test_failed_starts_leave_the_process_able_to_start_an_engine(tiny_qwen3, monkeypatch):
    # A failed init_process_group leaves this process's group count at 1: the next engine's rank 0 named its group
    # "1", its fresh workers "0", the rendezvous hung for 120 s, and every later tensor-parallel test failed.
    from datetime import timedelta

    import engine.gpu.distributed as distributed

    path, _ = tiny_qwen3
    alone = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with pytest.raises(torch.distributed.DistError):  # rank 0 of 2, and rank 1 never comes
        torch.distributed.init_process_group("gloo", store=alone, rank=0, world_size=2, timeout=timedelta(seconds=1))
    assert not torch.distributed.is_initialized()
    monkeypatch.setattr(distributed, "START_TIMEOUT", timedelta(seconds=0))  # rank 0's wait: workers do not copy it
    with pytest.raises(RuntimeError, match=r"1 of 1 tensor-parallel worker process\(es\) did not start within 0 s"):
        _tp2(path)
    assert not multiprocessing.active_children() and not torch.distributed.is_initialized()
    monkeypatch.undo()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with _tp2(path) as llm:
        out = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]
    assert out["error"] is None and len(out["token_ids"]) == 4
