"""``python -m engine.serve`` on a tiny random Qwen3 with a tokenizer, in a subprocess on a loopback port, driven
by the official ``openai`` client: completions and chat, streamed and not, 50 concurrent streams whose greedy
tokens equal offline ``LLM.generate``, a client that leaves frees its blocks, /metrics parses, bad starts exit 2."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from engine.server import launch  # noqa: E402

VOCAB = 512
STARTUP_TIMEOUT_S = 240


def make_tiny_model_with_tokenizer(path) -> str:
    """A 2-layer Qwen3 and a byte-level BPE tokenizer (trained here, offline) with a ChatML template."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=True,
        initializer_range=0.3, eos_token_id=VOCAB - 1)
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(path)
    words = [f"w{i}x{i * 7 % 13}" for i in range(400)]
    corpus = [" ".join(words[j:j + 20]) for j in range(0, 400, 5)] * 3
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=VOCAB - 2, special_tokens=["<|im_start|>", "<|im_end|>"],
                            show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|im_end|>")
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tokenizer.save_pretrained(path)
    return str(path)


def start_server(args: list[str]) -> tuple[subprocess.Popen, str]:
    return launch.start_server(args, env={"CUDA_VISIBLE_DEVICES": ""}, timeout_s=STARTUP_TIMEOUT_S)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return make_tiny_model_with_tokenizer(tmp_path_factory.mktemp("tiny-served"))


@pytest.fixture(scope="module")
def server(model_dir):
    proc, url = start_server(["--model", model_dir, "--served-model-name", "tiny", "--device", "cpu",
                              "--max-num-seqs", "64", "--max-num-batched-tokens", "2048"])
    yield url
    launch.stop_server(proc)


@pytest.fixture(scope="module")
def offline(model_dir):
    from engine.llm import LLM

    with LLM(model_dir, device="cpu", max_num_seqs=64, max_num_batched_tokens=2048) as llm:
        yield llm


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(offline, prompts, max_tokens):
    from engine.core.sampling_params import SamplingParams

    outs = offline.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                            use_tqdm=False)
    return [o["token_ids"] for o in outs]


def metrics(url) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels.keys()
            - {"model_name"}}


def test_models_and_health(server, client) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{server}/health").status_code == 200


def test_completion_text_and_tokens_match_offline_generate(client, offline) -> None:
    prompt = "w1x7 w2x1 w3x8 w4x2"
    [expected] = greedy(offline, [prompt], 12)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = r.choices[0]
    assert choice.model_extra["token_ids"] == expected
    assert choice.text == offline.tokenizer.decode(expected, skip_special_tokens=True)
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens == len(offline.tokenizer.encode(prompt))
    assert choice.finish_reason == "length"


def test_streamed_completion_equals_the_whole_one(client) -> None:
    kwargs = dict(model="tiny", prompt=[5, 6, 7, 8], max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) == 10  # one per token
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 10 and not chunks[-1].choices


def test_chat_streamed_and_not(client, offline) -> None:
    messages = [{"role": "user", "content": "w5x9 w6x3"}]
    prompt_ids = offline.tokenizer.encode(offline.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    [expected] = greedy(offline, [prompt_ids], 8)
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == offline.tokenizer.decode(expected, skip_special_tokens=True)
    assert r.usage.prompt_tokens == len(prompt_ids)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == r.choices[0].message.content


def test_fifty_concurrent_streams_all_finish_with_offline_tokens(server, offline) -> None:
    prompts = [[(7 * i + j) % 500 + 1 for j in range(3 + i % 17)] for i in range(50)]
    expected = greedy(offline, prompts, 16)

    async def one(client, prompt):
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True,
                                                                          "return_token_ids": True})
        tokens, num_chunks, finish = [], 0, None
        async for chunk in stream:
            if chunk.choices:
                num_chunks += 1
                tokens.extend(chunk.choices[0].model_extra["token_ids"])  # each chunk's new tokens
                finish = chunk.choices[0].finish_reason or finish
        return tokens, num_chunks, finish

    async def main():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0,
                                      timeout=120) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    results = asyncio.run(main())
    assert all(finish == "length" for _, _, finish in results)
    assert [tokens for tokens, _, _ in results] == expected
    assert all(num_chunks == 16 for _, num_chunks, _ in results)  # one chunk per token


def test_a_client_that_disconnects_frees_its_blocks(server) -> None:
    # 64 choices of 500 tokens: seconds of work on CPU, so the request is surely running when the client leaves.
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 500, "n": 64, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{server}/v1/completions", json=body) as r:
        lines = r.iter_lines()  # kept: a dropped line iterator closes the response (and so disconnects)
        assert next(lines).startswith("data: ")
        assert metrics(server)["vllm:num_requests_running"] == 64
        assert metrics(server)["vllm:kv_cache_usage_perc"] > 0
    # 30 s: on a loaded 2-core machine (CI beside other work) noticing the disconnect took over 10 s once
    deadline = time.time() + 30
    while metrics(server)["vllm:num_requests_running"] and time.time() < deadline:
        time.sleep(0.05)
    after = metrics(server)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:generation_tokens_total"] < 64 * 500 * 0.9  # stopped, not run to the end


def test_bad_requests_are_400s_through_the_client(client) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length is 512"):
        client.completions.create(model="tiny", prompt=[1, 2], max_tokens=600)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model="tiny", prompt=[1, 99999], max_tokens=2)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="other", prompt=[1], max_tokens=2)


def test_metrics_parse_and_count(server) -> None:
    text = httpx.get(f"{server}/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                 "vllm:num_preemptions", "vllm:request_success", "vllm:generation_tokens"):
        assert name in names
    assert "_created" not in text


def test_bad_starts_exit_2_with_one_line(model_dir) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "engine.serve", "--model", model_dir, "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot listen there" in r.stderr and "Traceback" not in r.stderr
    for args, fragment in ((["--max-num-seqs", "0"], "--max-num-seqs"), (["--port", "70000"], "--port"),
                           (["--model", "/nonexistent/model"], "/nonexistent/model"),
                           (["--max-request-body-bytes", "0"], "--max-request-body-bytes must be >= 1, got 0"),
                           (["--host", ""], "--host is empty")):  # bind("") listened on every interface
        r = subprocess.run([sys.executable, "-m", "engine.serve", "--port", "0", *args], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) <= 2  # argparse's usage line, then the error


@pytest.mark.parametrize(("args", "line"), [
    # read as the current folder: "error: model directory . has no config.json"
    (["--model", ""], "error: --model: model is empty; expected a shipped model config name or a Hugging Face model "
                      "folder, got ''"),
    # silently replaced by --model: clients sending the name they were given got 404s
    (["--served-model-name", " "], "error: --served-model-name is empty; expected the model name clients send (or "
                                   "leave it out: --model is used)"),
])
def test_empty_names_are_refused(args, line, capsys) -> None:
    from cli.engine_serve import main
    from tests.traces.helpers import cli_error

    assert cli_error(main, ["--port", "0", *args], capsys) == line


def test_a_model_that_cannot_run_with_the_options_is_refused_before_the_engine_starts(model_dir) -> None:
    """It was found by the engine process after its start, and named --model with the exception's type:
    "error: --model M: ValueError: max_model_len=100000 is more than ..."."""
    name = os.path.basename(model_dir)
    for args, line in (
            (["--max-model-len", "100000"], f"error: max_model_len=100000 is more than {name}'s "
                                            "max_position_embeddings=512 (--allow-long-max-model-len accepts it for "
                                            "timing studies)"),
            (["--tensor-parallel-size", "8"], f"error: {name}: attention heads (4) is not divisible by "
                                              "tensor_parallel_size (8)")):
        r = subprocess.run([sys.executable, "-m", "engine.serve", "--port", "0", "--model", model_dir, *args],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert r.returncode == 2 and r.stderr.strip() == line, r.stderr


@pytest.mark.slow
def test_a_tensor_parallel_engine_serves_the_same_tokens(model_dir, offline) -> None:
    """The engine process starts TP workers of its own (so it must not be a daemon process)."""
    proc, url = start_server(["--model", model_dir, "--device", "cpu", "--tensor-parallel-size", "2",
                              "--warmup-requests", "1"])
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        prompt = [3, 1, 4, 1, 5, 9, 2, 6]
        r = client.completions.create(model=model_dir, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        assert r.choices[0].model_extra["token_ids"] == greedy(offline, [prompt], 8)[0]
    finally:
        launch.stop_server(proc)


@pytest.mark.parametrize("signals", [("SIGINT", "SIGINT"), ("SIGTERM",)])
def test_ctrl_c_twice_or_sigterm_shuts_down_without_a_traceback(model_dir, tmp_path, signals) -> None:
    """uvicorn re-raised the signals it caught after its shutdown: two Ctrl-Cs logged a KeyboardInterrupt, then (the
    second forcing the exit, which skipped the app's shutdown) a CancelledError traceback from the lifespan task."""
    import signal

    log = tmp_path / "server.log"
    proc, url = launch.start_server(["--model", model_dir, "--device", "cpu"], env={"CUDA_VISIBLE_DEVICES": ""},
                                    log=log, timeout_s=STARTUP_TIMEOUT_S)
    try:
        assert httpx.get(f"{url}/health").status_code == 200
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(0.05)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)  # the pump thread copies the last lines
    assert "Traceback" not in log.read_text() and "Error" not in log.read_text(), log.read_text()[-3000:]
