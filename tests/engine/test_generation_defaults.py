"""The model's generation_config.json sets the default sampling parameters of requests that leave them out, as vLLM's
``--generation-config auto`` does: read and checked at start-up, ignored under ``vllm``, read from another folder when
one is named; a request that sets a field keeps it (the server, over a scripted engine and over loopback), and
``LLM.generate`` without sampling params uses ``LLM.get_default_sampling_params()``."""

from __future__ import annotations

import functools
import json
import shutil
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.core.config import EngineConfig
from engine.core.generation_defaults import GenerationDefaults, read_generation_defaults
from engine.core.llm_engine import LLMEngine
from engine.core.runner import RunnerOutput
from engine.core.sampling_params import SamplingParams

QWEN3_DEFAULTS = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "eos_token_id": [151645, 151643]}


def _folder(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "generation_config.json").write_text(json.dumps(config))
    return path


# ---- reading the file ---------------------------------------------------------------------------------------------
def test_auto_takes_the_files_sampling_fields_exactly(tmp_path) -> None:
    model = _folder(tmp_path / "m", {**QWEN3_DEFAULTS, "max_new_tokens": 2048, "max_length": 40960})
    defaults = read_generation_defaults(model)
    source = str(model / "generation_config.json")
    assert defaults == GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20, max_tokens=2048, source=source,
                                          from_file=("temperature", "top_p", "top_k", "max_tokens"))
    # max_new_tokens is the default max_tokens; max_length and do_sample are ignored, as vLLM ignores them
    assert defaults.as_dict() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 2048}
    assert defaults.sampling_params() == SamplingParams(temperature=0.6, top_p=0.95, top_k=20, max_tokens=2048)
    assert defaults.report("--generation-config vllm") == [
        f"{source}: the model's generation config sets the default sampling parameters of requests that leave them "
        "out: temperature=0.6, top_p=0.95, top_k=20, max_tokens=2048 (as vLLM does; --generation-config vllm ignores "
        "the file)"]


def test_fields_the_file_leaves_out_keep_vllms_defaults(tmp_path) -> None:
    defaults = read_generation_defaults(_folder(tmp_path / "m", {"temperature": 0.7, "top_k": None}))
    assert (defaults.temperature, defaults.top_p, defaults.top_k, defaults.max_tokens) == (0.7, 1.0, -1, None)
    assert defaults.from_file == ("temperature",)  # a null is no value, as in vLLM
    # max_tokens 16 where the file sets none, as SamplingParams' (and vLLM's) own default
    assert defaults.sampling_params() == SamplingParams(temperature=0.7)
    assert read_generation_defaults(_folder(tmp_path / "w", {"top_k": 20.0})).top_k == 20  # a whole float counts


def test_a_model_without_a_generation_config_and_vllm_mode_have_no_defaults(tmp_path) -> None:
    assert read_generation_defaults(tmp_path) == GenerationDefaults()  # no generation_config.json at all
    assert read_generation_defaults(_folder(tmp_path / "e", {"eos_token_id": 2})) == GenerationDefaults(
        source=str(tmp_path / "e" / "generation_config.json"))  # only its eos ids: nothing set, nothing said
    assert read_generation_defaults(tmp_path / "e").report("x") == []
    model = _folder(tmp_path / "m", {**QWEN3_DEFAULTS, "max_new_tokens": 10, "temperature": -1})
    neutral = read_generation_defaults(model, "vllm")  # the file is not even read: its bad value does not matter
    assert neutral == GenerationDefaults() and neutral.report("x") == []
    assert neutral.sampling_params() == SamplingParams() == SamplingParams(temperature=1.0, top_p=1.0, top_k=-1)


def test_a_folder_reads_its_own_generation_config(tmp_path) -> None:
    model = _folder(tmp_path / "m", QWEN3_DEFAULTS)
    other = _folder(tmp_path / "other", {"temperature": 0.2, "max_new_tokens": 7})
    defaults = read_generation_defaults(model, str(other))
    assert defaults.as_dict() == {"temperature": 0.2, "max_tokens": 7}  # the model's own top_p and top_k are not used
    assert defaults.source == str(other / "generation_config.json")


@pytest.mark.parametrize(("value", "why"), [
    ("missing", "does not exist"), ("empty", "has no generation_config.json"),
    ("file", "is a file; pass the folder holding it")])
def test_a_folder_without_the_file_is_refused_in_one_line(tmp_path, value, why) -> None:
    (tmp_path / "empty").mkdir()
    _folder(tmp_path / "f", {})
    path = {"missing": tmp_path / "nope", "empty": tmp_path / "empty",
            "file": tmp_path / "f" / "generation_config.json"}[value]
    with pytest.raises(ValueError) as info:
        read_generation_defaults(tmp_path, str(path), option="--generation-config")
    assert str(info.value) == (f"--generation-config {str(path)!r} {why}; expected 'auto', 'vllm' or a folder "
                               "holding generation_config.json")
    with pytest.raises(ValueError, match="^generation_config must be 'auto', 'vllm' or a folder"):
        read_generation_defaults(tmp_path, "")


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("temperature", -1, "a request's temperature must be a number from 0 to 3.4e+38"),
    ("temperature", "0.6", "a request's temperature must be a number from 0 to 3.4e+38"),
    ("temperature", True, "a request's temperature must be a number from 0 to 3.4e+38"),
    ("top_p", 0, "a request's top_p must be in (0, 1]"),
    ("top_p", 1.5, "a request's top_p must be in (0, 1]"),
    ("top_k", -5, "a request's top_k must be -1 or 0 (off) or >= 1"),
    ("top_k", 2.5, "a request's top_k must be an int (<= 0 disables it)"),
    ("max_new_tokens", 0, "a request's max_tokens must be an int >= 1"),
    ("max_new_tokens", [16], "a request's max_tokens must be an int >= 1"),
])
def test_a_bad_value_is_refused_in_one_line_naming_the_file_and_field(tmp_path, field, value, rule) -> None:
    model = _folder(tmp_path / "m", {**QWEN3_DEFAULTS, field: value})
    with pytest.raises(ValueError) as info:
        read_generation_defaults(model)
    assert str(info.value) == f"{model / 'generation_config.json'}: {field!r} is {value!r}; {rule}"


def test_fields_the_engine_does_not_implement_are_a_note_not_a_failure(tmp_path) -> None:
    model = _folder(tmp_path / "m", {"temperature": 0.7, "repetition_penalty": 1.05, "min_p": 0.0})
    defaults = read_generation_defaults(model)
    assert defaults.not_applied == (("repetition_penalty", 1.05),)  # min_p 0 asks for nothing
    assert defaults.report("generation_config='vllm'")[1] == (
        f"note: {model / 'generation_config.json'}: repetition_penalty=1.05 not applied: the engine does not "
        "implement it (vLLM would)")
    neutral = read_generation_defaults(_folder(tmp_path / "n", {"repetition_penalty": 1.0, "min_p": 0}))
    assert neutral.not_applied == () and neutral.report("x") == []


def test_a_request_that_sets_a_field_keeps_it() -> None:
    defaults = GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20, max_tokens=64,
                                  from_file=("temperature", "top_p", "top_k", "max_tokens"))
    assert defaults.sampling_params(temperature=0.0, max_tokens=3) == SamplingParams(
        temperature=0.0, top_p=0.95, top_k=20, max_tokens=3)
    assert defaults.sampling_params(temperature=None).temperature == 0.6  # None: not given


# ---- the server, over a scripted engine (no torch) ----------------------------------------------------------------
VOCAB = 128
EOS = 127


class ParamsEchoRunner:
    """Samples a sequence's temperature x 10, then its top_p x 100, then its top_k (mod 90), over and over: the tokens
    of a response say which sampling parameters reached the engine."""

    def run(self, batch) -> RunnerOutput:
        tokens = []
        for seq in batch.seqs:
            sp = seq.sampling_params
            echo = (round(sp.temperature * 10), round(sp.top_p * 100), sp.top_k % 90)
            tokens.append(echo[seq.num_completion_tokens % 3])
        return RunnerOutput(tokens)

    def release(self, seqs) -> None:
        pass


ECHO_DEFAULTS = GenerationDefaults(temperature=0.6, top_p=0.85, top_k=20, max_tokens=4, source="g.json",
                                   from_file=("temperature", "top_p", "top_k", "max_tokens"))


def echo_llm(defaults: GenerationDefaults) -> SimpleNamespace:
    """The engine process's factory (module level, so the spawned process can import it)."""
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, block_size=16).resolved(
        num_gpu_blocks=64, max_model_len=256)
    engine = LLMEngine(config, ParamsEchoRunner(), eos_token_ids=[EOS])
    return SimpleNamespace(engine=engine, shape=SimpleNamespace(vocab_size=VOCAB), model_dir="echo",
                           generation_defaults=defaults)


@pytest.fixture(scope="module")
def echo_client():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from engine.server.api import build_app
    from engine.server.engine_client import EngineClient

    engine = EngineClient(functools.partial(echo_llm, ECHO_DEFAULTS), model_name="m", max_waiting_requests=100)
    engine.start(timeout_s=60)
    with TestClient(build_app(engine)) as client:
        yield client


def _echo(client, **fields) -> list[int]:
    r = client.post("/v1/completions", json={"prompt": [1], "return_token_ids": True, "max_tokens": 3, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_the_server_gives_a_request_the_models_defaults_for_what_it_leaves_out(echo_client) -> None:
    assert _echo(echo_client) == [6, 85, 20]
    assert _echo(echo_client, temperature=None, top_p=None, top_k=None) == [6, 85, 20]  # null is "not given"
    assert _echo(echo_client, temperature=0.2) == [2, 85, 20]  # what a request sets, it keeps
    assert _echo(echo_client, temperature=0, top_p=0.5, top_k=-1) == [0, 50, 89]


def test_the_server_takes_max_new_tokens_where_a_request_sets_no_limit(echo_client) -> None:
    assert len(_echo(echo_client, max_tokens=None)) == 4  # max_new_tokens
    assert len(_echo(echo_client, max_tokens=9)) == 9  # the request's own
    # a completion's max_tokens is 16 when left out (OpenAI's and vLLM's default), not the generation config's
    r = echo_client.post("/v1/completions", json={"prompt": [1], "return_token_ids": True})
    assert len(r.json()["choices"][0]["token_ids"]) == 16
    # within the room the prompt leaves, as vLLM (the least of the two), not refused as a request's own would be
    assert len(_echo(echo_client, prompt=[1] * 254, max_tokens=None)) == 2


# ---- engine.LLM and engine.serve on a tiny model (torch) ----------------------------------------------------------
def _tiny_model_with(tiny_qwen3, path: Path, sampling: dict) -> Path:
    shutil.copytree(tiny_qwen3[0], path)
    source = path / "generation_config.json"
    source.write_text(json.dumps({**json.loads(source.read_text()), **sampling}))  # keeps its eos id
    return path


def test_llm_generate_without_sampling_params_uses_the_models_defaults(tiny_qwen3, tmp_path, caplog) -> None:
    from engine.llm import LLM

    model = _tiny_model_with(tiny_qwen3, tmp_path / "m", {"temperature": 0.0, "top_k": 20, "max_new_tokens": 5,
                                                           "repetition_penalty": 1.1})
    other = _folder(tmp_path / "other", {"top_p": 0.5})
    with caplog.at_level("WARNING", logger="engine.generation_config"):
        llm = LLM(str(model), device="cpu", max_num_seqs=4, max_num_batched_tokens=512)
    with llm:
        expected = SamplingParams(temperature=0.0, top_k=20, max_tokens=5)
        assert llm.get_default_sampling_params() == expected
        [default] = llm.generate([[1, 2, 3]], use_tqdm=False)
        assert default["token_ids"] == llm.generate([[1, 2, 3]], expected, use_tqdm=False)[0]["token_ids"]
        assert len(default["token_ids"]) == 5 or default["finish_reason"] == "stop"
        # an explicit SamplingParams is used as it is (its max_tokens 16, temperature 1), as vLLM uses it
        explicit = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
        assert len(explicit[0]["token_ids"]) == 2
    source = model / "generation_config.json"
    assert [r.getMessage() for r in caplog.records] == [
        f"{source}: the model's generation config sets the default sampling parameters of requests that leave them "
        "out: temperature=0.0, top_k=20, max_tokens=5 (as vLLM does; generation_config='vllm' ignores the file)",
        f"note: {source}: repetition_penalty=1.1 not applied: the engine does not implement it (vLLM would)"]
    for mode, expected in (("vllm", SamplingParams()), (str(other), SamplingParams(top_p=0.5))):
        with LLM(str(model), generation_config=mode, device="cpu", max_num_seqs=4, max_num_batched_tokens=512) as llm:
            assert llm.get_default_sampling_params() == expected


def test_llm_refuses_a_bad_default_before_it_loads_the_model(tiny_qwen3, tmp_path) -> None:
    from engine.llm import LLM

    model = _tiny_model_with(tiny_qwen3, tmp_path / "m", {"top_p": 2})
    with pytest.raises(ValueError) as info:
        LLM(str(model), device="cpu")
    assert str(info.value) == f"{model / 'generation_config.json'}: 'top_p' is 2; a request's top_p must be in (0, 1]"


def test_engine_serve_refuses_a_bad_generation_config_at_start_up(tiny_qwen3, tmp_path, capsys) -> None:
    pytest.importorskip("fastapi")
    from cli.engine_serve import main
    from tests.traces.helpers import cli_error

    model = _tiny_model_with(tiny_qwen3, tmp_path / "m", {"temperature": "hot"})
    assert cli_error(main, ["--port", "0", "--model", str(model)], capsys) == (
        f"error: {model / 'generation_config.json'}: 'temperature' is 'hot'; a request's temperature must be a number "
        "from 0 to 3.4e+38")
    assert cli_error(main, ["--port", "0", "--model", str(model), "--generation-config", str(tmp_path / "x")],
                     capsys) == (f"error: --generation-config {str(tmp_path / 'x')!r} does not exist; expected 'auto', "
                                 "'vllm' or a folder holding generation_config.json")


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_engine_serve_over_loopback_applies_and_prints_the_defaults(tiny_qwen3, tmp_path) -> None:
    pytest.importorskip("fastapi")
    from engine.server import launch

    model = _tiny_model_with(tiny_qwen3, tmp_path / "m", {"temperature": 0.0, "max_new_tokens": 4})
    log = tmp_path / "server.log"
    proc, url = launch.start_server(["--model", str(model), "--device", "cpu", "--warmup-requests", "0"],
                                    env={"CUDA_VISIBLE_DEVICES": ""}, log=log, timeout_s=240)
    try:
        body = {"prompt": [1, 2, 3], "max_tokens": None, "ignore_eos": True, "n": 4, "seed": 1,
                "return_token_ids": True}
        default = [c["token_ids"] for c in _post(url, body)["choices"]]
        # temperature 0 from the file: four seeded copies are one greedy answer, of max_new_tokens tokens
        assert all(ids == default[0] for ids in default) and len(default[0]) == 4
        sampled = [c["token_ids"] for c in _post(url, {**body, "temperature": 1.0, "max_tokens": 8})["choices"]]
        assert all(len(ids) == 8 for ids in sampled)
        assert any(ids[:4] != default[0] for ids in sampled)  # the request's temperature 1 kept: they sample
    finally:
        launch.stop_server(proc)
    printed = log.read_text()
    assert (f"{model / 'generation_config.json'}: the model's generation config sets the default sampling parameters "
            "of requests that leave them out: temperature=0.0, max_tokens=4 (as vLLM does; --generation-config vllm "
            "ignores the file)\n") in printed
    assert printed.count("the model's generation config sets") == 1  # not again from the engine process
