"""``engine.LLM``: offline generation over the step loop, with a streaming form."""

from __future__ import annotations

import gc
import logging
import numbers
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as Seq
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.generation_defaults import LOGGER_NAME, read_generation_defaults
from engine.core.host_memory import host_memory_available
from engine.core.llm_engine import LLMEngine
from engine.core.messages import exception_line, one_line
from engine.core.model_config import CONFIG_DIR, ModelShape, generation_eos_token_ids, resolve_model_dir
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FinishReason, Sequence
from engine.options import EngineOptions

Prompt = str | list[int] | Mapping  # a mapping: vLLM's {"prompt": text} or {"prompt_token_ids": ids}


@dataclass(frozen=True)
class StreamEvent:
    index: int  # the prompt's position in the input list
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    error: str | None = None  # what failed, when finish_reason is "error"
    sample_index: int = 0  # which of the prompt's n samples (SamplingParams.n)
    stop_reason: str | int | None = None  # vLLM's, in the last event: the stop string or stop_token_ids token


class _Sample:
    """One of a prompt's n samples: its sequence, and its text, in which its stop strings are found as its tokens
    come (the engine makes no text). A stop string ends the sample at the token that completed it: the engine's
    request is aborted then, and what it ran on after is not part of the output."""

    def __init__(self, seq: Sequence, prompt_index: int, sample_index: int, tokenizer) -> None:
        self.seq = seq
        self.prompt_index = prompt_index
        self.sample_index = sample_index
        self.detokenizer = IncrementalDetokenizer.of(tokenizer, seq.sampling_params)
        self.num_read = 0  # completion tokens given to the detokenizer

    @property
    def is_finished(self) -> bool:
        return self.seq.is_finished or self.detokenizer.stopped

    @property
    def num_tokens(self) -> int:
        """The completion's length, up to the token that completed a stop string if one did."""
        return self.num_read if self.detokenizer.stopped else self.seq.num_completion_tokens

    def tokens_from(self, first: int) -> list[int]:
        """The completion's tokens from the ``first``-th on (a stream's new ones, without copying those sent)."""
        start = self.seq.num_prompt_tokens
        return self.seq.token_ids[start + first : start + self.num_tokens]

    @property
    def token_ids(self) -> list[int]:
        return self.tokens_from(0)

    @property
    def finish_reason(self) -> str | None:
        if self.detokenizer.stopped:
            return "stop"
        return self.seq.finish_reason.value if self.seq.finish_reason is not None else None

    @property
    def stop_reason(self) -> str | int | None:
        token_ids = self.token_ids
        return self.detokenizer.stop_reason(self.finish_reason, token_ids[-1] if token_ids else None,
                                            self.seq.sampling_params.stop_token_ids)

    def read(self) -> bool:
        """Give the detokenizer the tokens made since the last call, one at a time where a stop string may end the
        text (so the tokens end where it does), else at once; True when a stop string ended the sample now."""
        seq, detokenizer = self.seq, self.detokenizer
        was_stopped = detokenizer.stopped
        tokens = seq.token_ids
        end = len(tokens) - seq.num_prompt_tokens
        ends_with_stop_token = seq.finish_reason is FinishReason.STOP
        step = 1 if detokenizer.stop else max(end - self.num_read, 1)
        while self.num_read < end and not detokenizer.stopped:
            start = seq.num_prompt_tokens + self.num_read
            self.num_read = min(self.num_read + step, end)
            detokenizer.add(tokens[start : seq.num_prompt_tokens + self.num_read],
                            ends_with_stop_token and self.num_read == end)
        return detokenizer.stopped and not was_stopped

    def output(self, has_tokenizer: bool) -> dict:
        self.read()
        self.detokenizer.finish()
        return {"index": self.sample_index, "text": self.detokenizer.text if has_tokenizer else None,
                "token_ids": self.token_ids, "finish_reason": self.finish_reason, "stop_reason": self.stop_reason,
                "error": self.seq.error}


def load_tokenizer(model_dir: Path):
    has_tokenizer = any((model_dir / name).exists()
                        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    if not has_tokenizer:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds, most over several lines
        # (a tokenizer_config.json without its tokenizer.json was five lines on how to convert a slow tokenizer; a
        # config.json transformers refuses, a StrictDataclassFieldValidationError over two)
        raise ValueError(f"{model_dir}: its tokenizer cannot be loaded: {exception_line(exc)}") from None


def rope_table_bytes(shape: ModelShape, max_model_len: int) -> int:
    """The model's rotary table (one, shared by its layers) holds cos and sin (float32) for every position up to
    max_model_len; building it takes about two more for a moment (engine.gpu.layers.rotary_embedding)."""
    return 3 * max_model_len * shape.head_dim * 4


def check_host_memory(opts: EngineOptions, shape: ModelShape) -> None:
    """On the CPU the weights live in host memory: a model larger than what is free was killed by the kernel's
    out-of-memory killer halfway through the load (exit 137, no message, a staging folder left behind). So was a
    --max-model-len of 3e9 with --allow-long-max-model-len, whose rotary tables alone needed hundreds of GiB."""
    import torch

    from engine.gpu.model_runner import resolve_device, resolve_dtype

    device = resolve_device(opts)
    if device.type != "cpu":
        return
    available = host_memory_available()
    if available is None:
        return
    dtype = resolve_dtype(opts, device)
    weights = shape.weight_bytes(torch.empty((), dtype=dtype).element_size())
    if weights > available:
        raise ValueError(f"{opts.model}: its {str(dtype).removeprefix('torch.')} weights need {weights / 2**30:.1f} "
                         f"GiB of host memory on the CPU and {available / 2**30:.1f} GiB is available; use --dtype "
                         "bfloat16, a smaller model or a GPU")
    max_model_len = opts.max_model_len or shape.max_position_embeddings
    tables = rope_table_bytes(shape, max_model_len)
    if weights + tables > available:
        raise ValueError(f"max_model_len={max_model_len}: {opts.model}'s rotary tables for that many positions need "
                         f"{tables / 2**30:.1f} GiB of host memory besides {weights / 2**30:.1f} GiB of weights, and "
                         f"{available / 2**30:.1f} GiB is available; lower --max-model-len")


_PROMPT_TYPES = "expected a string or a list of token ids"
# Most warm-up requests (LLM.warm_up, and --warmup-requests of engine.replay and engine.serve): each prompt is built
# before the first step.
MAX_WARMUP_REQUESTS = 10_000


def _short(value: object) -> str:
    return one_line(repr(value), 60)


def _prompt_list(prompts) -> list:
    """``prompts`` as a list of prompts: a string, a sequence of ints or a vLLM prompt dict is one prompt. Bytes were
    taken as token ids (b"hi" as [104, 105]), a generator failed on its first index, and None or an int raised a
    TypeError."""
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray, AbstractSet)) or not hasattr(prompts, "__iter__"):
        raise ValueError(f"prompts is {_short(prompts)}; {_PROMPT_TYPES}, or a list of those")
    try:
        prompts = list(prompts)  # a generator, a tuple, a numpy array
    except TypeError:  # a 0-d numpy array or torch tensor has __iter__ but iterates nothing: was that TypeError
        raise ValueError(f"prompts is {_short(prompts)}; {_PROMPT_TYPES}, or a list of those") from None
    if prompts and isinstance(prompts[0], numbers.Integral) and not isinstance(prompts[0], bool):
        return [prompts]  # a single prompt of token ids
    return prompts


_PROMPT_DICT_KEYS = ("prompt", "prompt_token_ids")


def _unwrap_prompt_dict(index: int, prompt: Mapping) -> object:
    """vLLM's prompt dicts, ``{"prompt": text}`` and ``{"prompt_token_ids": ids}``, as the text or ids they hold. A dict
    was iterated as its keys: {"prompt_token_ids": [1, 2]} alone was the text "prompt_token_ids", without a word."""
    keys = sorted(map(str, prompt))
    if len(keys) != 1 or keys[0] not in _PROMPT_DICT_KEYS:
        raise ValueError(f"prompt {index} is a dict with keys {_short(keys)}; expected one key, 'prompt' (text) or "
                         "'prompt_token_ids' (as vLLM's prompt dicts; their other keys are not supported)")
    value = prompt[keys[0]]
    if (keys[0] == "prompt") != isinstance(value, str):
        raise ValueError(f"prompt {index}'s {keys[0]!r} is {_short(value)}; expected "
                         f"{'a string' if keys[0] == 'prompt' else 'a list of token ids'}")
    return value


def _check_unicode(index: int, text: str) -> None:
    """Half a surrogate pair (from JSON's "\\ud800", or a bad decode) is a string no tokenizer takes: its TypeError
    named neither the prompt nor the character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"prompt {index} holds an unpaired surrogate (U+{ord(text[exc.start]):04X}); expected "
                         "Unicode text") from None


class LLM:
    """``LLM(model, **options)``; ``model`` is an HF model directory or a shipped config name
    (with load_format="dummy"). ``generation_config`` is vLLM's: 'auto' takes the default sampling parameters of
    ``generate(prompts)`` without sampling params from the model's generation_config.json
    (``get_default_sampling_params``), 'vllm' ignores the file, a folder reads its generation_config.json."""

    def __init__(self, model: str, *, generation_config: str = "auto", **options: object) -> None:
        self._closed = False
        if not isinstance(model, (str, Path)):  # None reached pathlib as a TypeError that named no parameter
            raise ValueError(f"model must be a shipped model config name or a model folder, got {_short(model)}")
        self.options = opts = EngineOptions.from_kwargs(str(model), **options)
        model_dir = resolve_model_dir(model)
        self.shape = ModelShape.load(model_dir)
        opts.check_model(self.shape)
        self.model_dir = model_dir
        load_format = opts.load_format
        if load_format == "auto":
            load_format = "safetensors" if any(model_dir.glob("*.safetensors")) else "dummy"
            # Only a shipped config (engine/configs/NAME) runs on random weights unasked: any folder whose parent was
            # named "configs" did, a weightless /data/configs/MODEL served noise without a word.
            if load_format == "dummy" and model_dir.resolve().parent != CONFIG_DIR:
                raise FileNotFoundError(
                    f"{model_dir} has no *.safetensors weights; pass load_format='dummy' for random weights"
                )
        # read before the weights load: a bad file fails at once
        generation_eos = generation_eos_token_ids(model_dir, self.shape.vocab_size)
        self.generation_defaults = read_generation_defaults(model_dir, generation_config)
        for line in self.generation_defaults.report("generation_config='vllm'"):
            logging.getLogger(LOGGER_NAME).warning(line)  # vLLM warns that the model overrode its defaults, too
        self.tokenizer = load_tokenizer(model_dir)
        tokenizer_eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        if tokenizer_eos is not None and not 0 <= tokenizer_eos < self.shape.vocab_size:
            # the model can never sample it: as an eos id of config.json outside the vocabulary, it stopped nothing
            raise ValueError(f"{model_dir}: the tokenizer's eos_token ({self.tokenizer.eos_token!r}) has id "
                             f"{tokenizer_eos}, outside the model's vocabulary [0, {self.shape.vocab_size}) "
                             "(config.json's vocab_size); the tokenizer does not belong to this model")
        self.max_model_len = opts.max_model_len or self.shape.max_position_embeddings
        check_host_memory(opts, self.shape)
        eos = set(self.shape.eos_token_ids) | set(generation_eos)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        weights_dir = model_dir if load_format != "dummy" else None
        if opts.tensor_parallel_size > 1:
            from engine.gpu.distributed import TensorParallelRunner

            self.runner = TensorParallelRunner(opts, self.shape, weights_dir, eos_token_ids=eos)
        else:
            from engine.gpu.model_runner import ModelRunner

            self.runner = ModelRunner(opts, self.shape, weights_dir, eos_token_ids=eos)
        self.load_format = load_format  # what 'auto' became (ran_with)
        self.config = opts.resolved(num_gpu_blocks=self.runner.num_gpu_blocks, max_model_len=self.max_model_len)
        self.engine = LLMEngine(self.config, self.runner, eos_token_ids=eos)
        # The model, graphs and tokenizer live as long as the engine: moved out of the collector's sight,
        # its full passes (which would walk all of them) no longer stall a step now and then.
        gc.collect()
        gc.freeze()

    # ---- inputs ---------------------------------------------------------------------------------
    def _token_ids(self, index: int, prompt: Prompt) -> list[int]:
        if isinstance(prompt, Mapping):
            prompt = _unwrap_prompt_dict(index, prompt)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt {index} is text but {self.model_dir} has no tokenizer; pass token ids")
            _check_unicode(index, prompt)
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (bytes, bytearray, AbstractSet, Mapping)) or not hasattr(prompt, "__iter__"):
            raise ValueError(f"prompt {index} is {_short(prompt)}; {_PROMPT_TYPES}")
        else:
            try:
                prompt = list(prompt)
            except TypeError:  # a 0-d array or tensor (torch.tensor([1, 2]) as prompts is a list of them): a TypeError
                raise ValueError(f"prompt {index} is {_short(prompt)}; {_PROMPT_TYPES}") from None
            bad = next((t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
            if bad is not None:  # int() would truncate 1.5 to 1 without a word
                raise ValueError(f"prompt {index} has token id {bad!r}; expected integers")
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        if len(ids) > self.max_model_len:
            raise ValueError(f"prompt {index} has {len(ids)} tokens, more than max_model_len={self.max_model_len}")
        bad = [t for t in ids if not 0 <= t < self.shape.vocab_size]
        if bad:
            raise ValueError(f"prompt {index} has token id {bad[0]} outside the vocabulary "
                             f"[0, {self.shape.vocab_size})")
        return ids

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` and ``stream`` use without sampling params, as vLLM's: the model's generation config's
        temperature, top_p, top_k and max_new_tokens (as max_tokens) over SamplingParams' own defaults. A
        SamplingParams passed in is used as it is, as in vLLM."""
        return self.generation_defaults.sampling_params()

    def _check_open(self) -> None:
        """After close() the runner has no model: each request of a generate() or stream() finished as an 'error'
        (TypeError: 'NoneType' object is not callable), with a traceback logged per step, instead of one clear line."""
        if self._closed:
            raise RuntimeError("this LLM is closed (close() or the end of its with block released its model); "
                               "create a new LLM")

    def _add_all(self, prompts: Seq[Prompt], sampling_params) -> list[_Sample]:
        """Every prompt's n samples, queued in the engine, prompt by prompt."""
        self._check_open()
        prompts = _prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            self._check_params("sampling_params", sampling_params)
            sampling_params = [sampling_params] * len(prompts)
        else:
            # A dict of options (iterated as its keys) or a None in the list failed later, in the engine, as an
            # AttributeError that named neither.
            if not isinstance(sampling_params, Seq) or isinstance(sampling_params, (str, bytes)):
                # (a string was taken as a list: "sampling_params[0] must be a SamplingParams, got 'a'")
                raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got "
                                 f"{_short(sampling_params)}")
            bad = next((i for i, sp in enumerate(sampling_params) if not isinstance(sp, SamplingParams)), None)
            if bad is not None:
                raise ValueError(f"sampling_params[{bad}] must be a SamplingParams, got {_short(sampling_params[bad])}")
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling params for {len(prompts)} prompts")
            for i, sp in enumerate(sampling_params):
                self._check_params(f"sampling_params[{i}]", sp)
        token_ids = [self._token_ids(i, p) for i, p in enumerate(prompts)]
        # The n samples of a prompt are requests of their own, queued together: the later ones find the prompt's full
        # blocks in the prefix cache, registered by the first.
        samples = [_Sample(self.engine.add_request(ids, sp.sample(k), request_id=i), i, k, self.tokenizer)
                   for i, (ids, sp) in enumerate(zip(token_ids, sampling_params)) for k in range(sp.n)]
        for sample in samples:
            if sample.seq.reject_reason:
                self._abort_unfinished(samples)  # all or none of a call's prompts are queued
                raise ValueError(f"prompt {sample.prompt_index} cannot be served: {sample.seq.reject_reason}")
        return samples

    def _check_params(self, name: str, sp: SamplingParams) -> None:
        """An id outside the vocabulary (-1, 10**30, vocab_size) is never sampled: it stopped nothing, without a word.
        The server refuses these too, and stop strings without a tokenizer, which make no text to find them in."""
        vocab_size = self.shape.vocab_size
        bad = next((t for t in sp.stop_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"{name}.stop_token_ids has {bad}, outside the vocabulary [0, {vocab_size})")
        if sp.stop and self.tokenizer is None:
            raise ValueError(f"{name}.stop: stop strings need a tokenizer and {self.model_dir} has none; use "
                             "stop_token_ids")

    # ---- generation -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: Seq[Prompt] | Prompt,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., object] = True,
    ) -> list[dict]:
        """Outputs in input order, one per prompt: ``{"text", "token_ids", "finish_reason", "stop_reason", "error",
        "prompt_token_ids", "outputs"}``. ``outputs`` holds the prompt's n samples (SamplingParams.n), each
        ``{"index", "text", "token_ids", "finish_reason", "stop_reason", "error"}`` as vLLM's CompletionOutput; the
        fields outside it are its first sample's. text is None without a tokenizer; finish_reason says whether a
        sample stopped (an eos, a stop token or a stop string: stop_reason says which of the last two), got
        max_tokens, was cut by a limit (``max_model_len``, ``kv_capacity``, ``token_budget``) or failed (``error``,
        with its message). A failing request finishes alone; the engine keeps serving the others. ``use_tqdm`` may be
        a tqdm-like factory, as in vLLM."""
        samples = self._add_all(prompts, sampling_params)
        progress = None
        prefill_tps = decode_tps = 0.0
        ours = {s.seq.seq_id for s in samples}
        # the samples with stop strings, read as their tokens come
        watched = {s.seq.seq_id: s for s in samples if s.detokenizer.stop}
        remaining = len(samples)
        try:
            # Inside the try: a failing or interrupted progress bar (its first import takes a while) left this call's
            # requests queued in the engine, run by the next call and counted as unfinished.
            if use_tqdm:
                if callable(use_tqdm):  # vLLM's use_tqdm: a tqdm-like factory (was taken as True, and ignored)
                    progress = use_tqdm(total=len(samples), desc="generating", dynamic_ncols=True)
                else:
                    from tqdm.auto import tqdm

                    progress = tqdm(total=len(samples), desc="generating", dynamic_ncols=True)
            while remaining and self.engine.has_unfinished_requests():
                start = time.perf_counter()
                batch, finished = self.engine.step()
                elapsed = max(time.perf_counter() - start, 1e-9)
                num_done = sum(1 for s in finished if s.seq_id in ours)
                if watched:
                    num_done += self._end_stopped(watched, batch.seqs)
                remaining -= num_done
                if progress is not None:
                    if batch.num_prefill_tokens:
                        prefill_tps = batch.num_prefill_tokens / elapsed
                    if batch.num_decode_seqs:
                        decode_tps = batch.num_decode_seqs / elapsed
                    progress.set_postfix(prefill=f"{prefill_tps:.0f} tok/s", decode=f"{decode_tps:.0f} tok/s",
                                         refresh=False)
                    progress.update(num_done)
        finally:  # an exception or Ctrl-C: nothing of this call stays queued in the engine
            self._abort_unfinished(samples)
            if progress is not None:
                progress.close()
        return self._outputs(samples)

    def _end_stopped(self, watched: dict[int, _Sample], seqs: list[Sequence]) -> int:
        """Stop strings in the step's new tokens of the watched samples among ``seqs``; returns how many samples they
        ended, beyond those the step finished."""
        num_ended = 0
        for seq in seqs:
            sample = watched.get(seq.seq_id)
            if sample is None:
                continue
            num_ended += self._apply_stop_strings(sample)
            if sample.is_finished:
                del watched[seq.seq_id]
        return num_ended

    def _apply_stop_strings(self, sample: _Sample) -> bool:
        """Read the sample's new tokens where it has stop strings; one that ends it aborts its request (its blocks
        freed) unless the engine finished it in the same step. True when it ended the sample so."""
        if not sample.detokenizer.stop or not sample.read() or sample.seq.is_finished:
            return False
        self.engine.abort_request(sample.seq)
        return True

    def _outputs(self, samples: list[_Sample]) -> list[dict]:
        """One output per prompt, of its samples (consecutive in ``samples``)."""
        has_tokenizer = self.tokenizer is not None
        outputs: list[dict] = []
        for sample in samples:
            output = sample.output(has_tokenizer)
            if sample.sample_index == 0:  # the prompt's own fields: its first sample's, as before n
                outputs.append({**{k: v for k, v in output.items() if k != "index"},
                                "prompt_token_ids": sample.seq.prompt_token_ids, "outputs": []})
            outputs[-1]["outputs"].append(output)
        return outputs

    def _abort_unfinished(self, samples: list[_Sample]) -> None:
        for sample in samples:
            if not sample.seq.is_finished:
                self.engine.abort_request(sample.seq)

    def stream(
        self,
        prompts: Seq[Prompt] | Prompt,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> Iterator[StreamEvent]:
        """Yields each sample's new tokens as steps produce them; the last event of a sample has finished=True (and
        its stop_reason). Closing the iterator early (or abandoning it) aborts the requests it has not finished."""
        samples = self._add_all(prompts, sampling_params)
        sample_of = {s.seq.seq_id: s for s in samples}
        sent = {s.seq.seq_id: 0 for s in samples}
        open_ids = set(sample_of)

        def events(candidates) -> Iterator[StreamEvent]:
            for seq in candidates:
                if seq.seq_id not in open_ids:
                    continue  # another caller's request, or one already reported finished
                sample = sample_of[seq.seq_id]
                self._apply_stop_strings(sample)
                num_tokens = sample.num_tokens
                if num_tokens > sent[seq.seq_id] or sample.is_finished:
                    new = sample.tokens_from(sent[seq.seq_id])
                    sent[seq.seq_id] = num_tokens
                    if sample.is_finished:
                        open_ids.discard(seq.seq_id)
                    yield StreamEvent(sample.prompt_index, new, sample.is_finished, sample.finish_reason, seq.error,
                                      sample.sample_index, sample.stop_reason if sample.is_finished else None)

        num_steps = len(self.engine.step_log)
        try:
            while open_ids:
                if len(self.engine.step_log) != num_steps or not self.engine.has_unfinished_requests():
                    # Steps of another caller (a generate() or another stream while this one waited between events)
                    # ran these requests too, and may have finished them: their tokens and their final event were
                    # lost, the stream ending without finished=True, as it looked only at the batches of its own steps.
                    yield from events([s.seq for s in samples if s.seq.seq_id in open_ids])
                    if not open_ids or not self.engine.has_unfinished_requests():
                        break
                # Closed between two events (a stream consumed after its LLM's with block): the step ran on a runner
                # without a model, logged a traceback and ended each request as an 'error' (TypeError: 'NoneType'
                # object is not callable). The finally below aborts what is left.
                self._check_open()
                batch, _ = self.engine.step()
                num_steps = len(self.engine.step_log)
                yield from events(batch.seqs)
        finally:
            self._abort_unfinished(samples)

    def warm_up(self, num_requests: int = 8) -> None:
        """Run ``num_requests`` short requests of growing length, so kernels compile and caches fill before
        anything is timed; the engine starts over afterwards (its step log and prefix cache emptied)."""
        self._check_open()
        # The command lines' bound and line: a string or None was a TypeError from a comparison, and 10**8 built every
        # prompt before the first step (memory exhausted, no error); False and True are no counts either.
        if not (isinstance(num_requests, numbers.Integral) and not isinstance(num_requests, bool)
                and 0 <= num_requests <= MAX_WARMUP_REQUESTS):
            raise ValueError(f"num_requests must be an integer from 0 to {MAX_WARMUP_REQUESTS}, got "
                             f"{_short(num_requests)}")
        num_requests = int(num_requests)
        if num_requests == 0:
            return
        # Short prompts within max_model_len: the warm-up must never be what a small limit rejects.
        longest = max(1, min(64 + 32 * (num_requests - 1), self.config.max_seq_len - 16))
        vocab_size = self.shape.vocab_size
        prompts = [[(7 * i + j) % vocab_size for j in range(min(64 + 32 * i, longest))] for i in range(num_requests)]
        self.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
        self.engine.reset()

    @property
    def ran_with(self) -> dict[str, str | None]:
        """The choices options left to 'auto', as made: a run folder says what ran (bfloat16 on cuda:0, random
        weights, triton attention), not 'auto' for each. ``distributed_backend`` is None for one process."""
        runner = self.runner
        return {
            "device": str(runner.device),
            "dtype": str(runner.dtype).removeprefix("torch."),
            "load_format": self.load_format,
            "attention_backend": runner.attention_backend_name,
            "distributed_backend": getattr(runner, "distributed_backend_name", None),
        }

    def close(self) -> None:
        self._closed = True
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
