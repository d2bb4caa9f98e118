"""engine.LLM's Python API against vLLM's (session 22, probe L): each test failed before its fix."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.config import EngineConfig  # noqa: E402
from engine.options import EngineOptions  # noqa: E402

OPTIONS = dict(device="cpu", block_size=16, max_model_len=128)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3):
    return LLM(tiny_qwen3[0], **OPTIONS)


def _ids(llm, prompts, params=GREEDY, **kwargs):
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False, **kwargs)]


# ---- options of the wrong type ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["yes", "no", 1])
def test_enforce_eager_must_be_a_bool(value):
    """enforce_eager="no" was taken as true, without a word (CUDA graphs off where they were asked for)."""
    with pytest.raises(ValueError) as info:
        EngineOptions(enforce_eager=value)
    assert str(info.value) == f"enforce_eager must be true or false, got {value!r}"


def test_a_float_block_size_is_refused_naming_it(tiny_qwen3):
    """16.0 == 16 passed the check and failed in the KV cache's allocation: a torch TypeError on tuple of ints."""
    with pytest.raises(ValueError) as info:
        LLM(tiny_qwen3[0], **{**OPTIONS, "block_size": 16.0})
    assert str(info.value) == "block_size must be a power of two from 16 to 256, got 16.0"


def test_numpy_integer_options_are_their_ints(tiny_qwen3, llm):
    """np.int64(16) as block_size was refused as "num_gpu_blocks must be an integer >= 1, got np.int64(2048)", an
    option nobody passed; np.int64(128) as max_model_len as "must be an integer"."""
    numpy_llm = LLM(tiny_qwen3[0], device="cpu", block_size=np.int64(16), max_model_len=np.int64(128),
                    max_num_seqs=np.int32(8), max_cuda_graph_batch_size=np.int64(8))
    assert (numpy_llm.config.block_size, numpy_llm.config.max_model_len, numpy_llm.config.max_num_seqs) == (16, 128, 8)
    assert type(numpy_llm.config.num_gpu_blocks) is int and type(numpy_llm.options.max_cuda_graph_batch_size) is int
    assert _ids(numpy_llm, [[1, 2, 3]]) == _ids(llm, [[1, 2, 3]])
    assert type(EngineConfig(max_model_len=np.uint16(64), num_gpu_blocks=np.int8(3)).max_model_len) is int


def test_an_unknown_option_is_a_type_error_as_in_vllm_and_still_a_value_error(tiny_qwen3):
    """vLLM's LLM raises a TypeError for an unexpected keyword (EngineArgs'): `except TypeError` missed ours."""
    for kind in (TypeError, ValueError):
        with pytest.raises(kind, match=r"^unknown option\(s\) swap_space; supported: allow_long_max_model_len, "):
            LLM(tiny_qwen3[0], swap_space=4)


@pytest.mark.parametrize("dtype", ["float", torch.float32])
def test_vllms_other_dtype_spellings_are_taken(tiny_qwen3, llm, dtype):
    """vLLM takes dtype="half"/"float" and a torch.dtype; they were refused as not one of auto, bfloat16, ..."""
    other = LLM(tiny_qwen3[0], **OPTIONS, dtype=dtype)
    assert other.options.dtype == "float32" and other.ran_with["dtype"] == "float32"
    assert _ids(other, [[1, 2, 3]]) == _ids(llm, [[1, 2, 3]])
    assert EngineOptions.from_kwargs("m", dtype="half").dtype == "float16"
    assert EngineOptions.from_kwargs("m", dtype=torch.bfloat16).dtype == "bfloat16"
    with pytest.raises(ValueError, match="^dtype must be one of auto, bfloat16, float16, float32, got 'float64'$"):
        EngineOptions.from_kwargs("m", dtype=torch.float64)


# ---- sampling params -------------------------------------------------------------------------------------------------
def test_stop_token_ids_none_is_none_as_in_vllm(llm):
    """None is vLLM's default for stop_token_ids; it was refused as "must be a sequence of ints, got None"."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, stop_token_ids=None)
    assert params.stop_token_ids == frozenset()
    assert _ids(llm, [[1, 2, 3]], params) == _ids(llm, [[1, 2, 3]])


# ---- generate() and its progress bar ---------------------------------------------------------------------------------
def test_a_progress_bar_that_fails_leaves_nothing_queued(llm, monkeypatch):
    """The bar was made after the requests were queued and outside the try that aborts them: a failing (or
    interrupted) tqdm left the call's requests in the engine, run and counted by the next call."""
    import tqdm.auto

    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tqdm.auto, "tqdm", broken)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1, 2, 3], [4, 5]], GREEDY)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.scheduler.block_manager.num_used_blocks == 0


def test_use_tqdm_may_be_a_factory_as_in_vllm(llm):
    """vLLM's use_tqdm takes a tqdm-like callable; it was taken as True and the default bar used."""
    made = []

    class Bar:
        def __init__(self, **kwargs):
            made.append(kwargs["total"])
            self.n = 0

        def update(self, n):
            self.n += n

        def set_postfix(self, **kwargs):
            pass

        def close(self):
            made.append(self.n)

    outputs = llm.generate([[1, 2, 3], [4, 5]], GREEDY, use_tqdm=Bar)
    assert made == [2, 2] and [o["token_ids"] for o in outputs] == _ids(llm, [[1, 2, 3], [4, 5]])


# ---- after close() ---------------------------------------------------------------------------------------------------
def test_a_closed_llm_says_so(tiny_qwen3):
    """After close() (or its with block) generate() returned outputs finished as 'error' ("TypeError: 'NoneType'
    object is not callable") and logged a traceback per step; stream() likewise; warm_up() passed silently."""
    with LLM(tiny_qwen3[0], **OPTIONS) as closed:
        pass
    closed.close()  # twice is fine
    message = "this LLM is closed (close() or the end of its with block released its model); create a new LLM"
    for use in (lambda: closed.generate([[1, 2, 3]], GREEDY, use_tqdm=False),
                lambda: list(closed.stream([[1, 2, 3]], GREEDY)),
                lambda: closed.warm_up(1)):
        with pytest.raises(RuntimeError) as info:
            use()
        assert str(info.value) == message
    assert not closed.engine.has_unfinished_requests()
