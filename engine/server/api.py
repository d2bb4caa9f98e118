"""The OpenAI-compatible HTTP API over one engine loop (FastAPI; served by uvicorn, as vLLM and SGLang are).

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (streamed as server-sent events when asked,
with ``stream_options.include_usage``), ``/v1/models``, ``/health`` and ``/metrics`` (Prometheus,
vLLM's metric names). A request is tokenized and checked here, then joins the engine's next step; a
client that goes away aborts its request, which frees its KV blocks at the next step boundary.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.generation_defaults import GenerationDefaults
from engine.core.json_errors import json_problem
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES, BodyReads, RequestBodyLimit
from engine.server.engine_client import EngineClient, EngineDead, RequestStream, ServerOverloaded
from engine.server.engine_process import Update
from engine.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    _Sampling,
    bad_request,
    validation_error,
)

_log = logging.getLogger(__name__)

# Finish reasons of the engine as OpenAI names them; the limits that cut an output are "length", and the
# choice says which limit it was in "cut_by" (a cut output says it was cut).
_CUT_REASONS = ("max_model_len", "kv_capacity", "token_budget")
DISCONNECT_POLL_S = 0.5  # how often a non-streamed request checks that its client is still there
# A request whose texts add up to more than this many characters is tokenized on a worker thread (Hugging Face's Rust
# tokenizers release the GIL): in the event loop, one client's 4 MB prompt held /health and every stream for seconds,
# and so did 4,096 prompts of 500 characters each (2 MB, 3 s), each one short. Smaller requests stay inline, where
# they cost no thread hop on the time to first token.
THREAD_TOKENIZE_CHARS = 20_000
# Chat requests with more messages than this render the chat template on a worker thread too: Jinja is pure Python,
# and 200,000 one-word messages held the event loop for 2 s before a token was counted (the GIL still lets the loop
# run between the thread's bytecodes).
THREAD_RENDER_MESSAGES = 256
# What FastAPI answers for a body its JSON parser gave up on with an error other than a syntax error (a
# RecursionError from arrays nested thousands deep).
_FASTAPI_PARSE_ERROR = "There was an error parsing the body"
_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
# A text prompt is refused untokenized when it has more characters than max_model_len tokens of this tokenizer could
# spell, with this much to spare (a normalizer such as NFC merges up to 4 characters into one of 3 bytes). Tokenizing
# first, as vLLM does, took 40 s and 5 GB of memory, kept by the server afterwards, for a 15 MB prompt of a model of
# 512 tokens, to say it had 12 million.
PROMPT_CHARS_MARGIN = 2
# A client's request id (X-Request-Id, or vLLM's request_id field) names the response, as in vLLM; every chunk of a
# stream repeats it, so a 1 MB id would make each token of the answer a 1 MB copy in the event loop. Trace ids and UUIDs
# are far shorter.
MAX_REQUEST_ID_CHARS = 512


@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: object | None  # a transformers tokenizer, or None (token-id prompts only)
    model_name: str
    max_model_len: int
    vocab_size: int
    model_dir: str
    rejection_reason_for: object  # the scheduler's own check: why a prompt of n tokens can never be served
    longest_token_chars: int | None = None  # the tokenizer's longest token, in characters (None: unknown)
    # What a request that leaves temperature, top_p, top_k or max_tokens out gets (the model's generation config)
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_prompt_chars(self) -> int | None:
        """More characters than this can never be max_model_len tokens or fewer (None: no such bound is known)."""
        if self.longest_token_chars is None:
            return None
        return self.max_model_len * self.longest_token_chars * PROMPT_CHARS_MARGIN


@dataclass
class _Choice:
    """What one choice has produced so far."""

    detokenizer: IncrementalDetokenizer
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop_token_ids token that ended the choice
    cut_by: str | None = None
    num_cached_tokens: int = 0
    finished: bool = False
    prompt_ids_sent: bool = False  # return_token_ids: the prompt's ids went out (a stream sends them once)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def build_app(engine: EngineClient, tokenizer=None, *,
              max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES) -> FastAPI:
    """The app over a started ``EngineClient``; the engine process stops with the app. A request body over
    ``max_request_body_bytes`` is answered 413 before it is read whole (engine.server.body_limit says why)."""
    info = engine.info
    if info is None:
        raise RuntimeError("start the engine (EngineClient.start) before building the app")
    config = info.config
    if tokenizer is not None:
        # A Hugging Face tokenizer shipped with truncation or padding set rewrites that setting on its first encode;
        # two first encodes at once on worker threads (long texts, _encode) would race ("Already borrowed"). Later
        # encodes only read it.
        tokenizer.encode("x")
    state = ServerState(engine, tokenizer, engine.model_name, config.max_model_len, info.vocab_size, info.model_dir,
                        Scheduler(config).rejection_reason_for, _longest_token_chars(tokenizer),
                        info.generation_defaults)
    model_name = engine.model_name

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.attach(asyncio.get_running_loop())
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="nanoserve", lifespan=lifespan)
    app.state.server = state
    body_reads = BodyReads()
    app.add_middleware(RequestBodyLimit, max_body_bytes=max_request_body_bytes, reads=body_reads)

    def end_open_requests(reason: str) -> int:
        """What a server shutting down calls once its grace period is over (engine.server.signals): the requests in the
        engine, and those whose body is still arriving, are answered 503 with ``reason``; returns how many."""
        return engine.end_open_requests(reason) + body_reads.end(reason)

    app.state.end_open_requests = end_open_requests

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        unread = first.get("type") == "json_invalid" or tuple(first.get("loc", ())) == ("body",)
        encoded = _encoded_body_error(request) if unread else None  # (a body read as JSON was not compressed)
        if encoded is not None:
            return JSONResponse(encoded.body(), status_code=encoded.status)
        return JSONResponse(validation_error(errors).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        detail = str(exc.detail)
        encoded = _encoded_body_error(request) if exc.status_code == 400 else None
        if encoded is not None:
            return JSONResponse(encoded.body(), status_code=encoded.status)
        if exc.status_code == 400 and detail == _FASTAPI_PARSE_ERROR:  # says neither what nor why
            # FastAPI raises its 400 from the parser's exception: every such body was said to be nested too deeply,
            # also one that is not UTF-8 or holds an integer of 5000 digits
            why = json_problem(exc.__cause__) if exc.__cause__ is not None else "unknown error"
            detail = f"the request body could not be parsed as JSON: {why}"
        if exc.status_code == 404 and detail == "Not Found":  # said nothing of what is there
            detail = f"there is no {request.url.path} on this server; it serves {', '.join(_ROUTES)}"
        headers = exc.headers
        allowed = (exc.headers or {}).get("Allow") if exc.status_code == 405 else None
        if allowed:  # "Method Not Allowed" alone did not say which one is
            # Starlette names the methods of the first route of the path only: POST /health was told "use HEAD",
            # which answers no body, though GET is served there too.
            allowed = _methods_of(app, request.url.path) or allowed
            headers = {**exc.headers, "Allow": allowed}
            detail = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
        return JSONResponse(APIError(exc.status_code, detail).body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):  # logged here; the client gets one line
        _log.exception("internal error on %s", request.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}: {exc}").body(), status_code=500)

    # Load balancers' checks often send HEAD: it was a 405. Two routes, not one of two methods: FastAPI gave both the
    # same operation id, and warned of it in the server's log whenever /docs was opened.
    @app.get("/health")
    @app.head("/health", include_in_schema=False)
    async def health():
        if not engine.is_alive:
            raise APIError(503, f"the engine has stopped: {engine.stop_reason}")
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": state.created, "owned_by": "nanoserve",
            "root": state.model_dir, "max_model_len": state.max_model_len}]}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(engine.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        body.check_supported()
        _check_model(state, body.model)
        request_id = _request_id(request, body, "cmpl")
        texts_or_ids = body.prompts()
        _check_num_choices(state, body.n, len(texts_or_ids))  # before tokenizing: 100,000 prompts took seconds
        for i, p in enumerate(texts_or_ids):  # before tokenizing any
            if isinstance(p, str):
                _check_prompt_chars(state, p, f"prompt {i}", "prompt")
        text_chars = sum(len(p) for p in texts_or_ids if isinstance(p, str))
        prompts = await _in_worker_if(text_chars > THREAD_TOKENIZE_CHARS, _prompts_ids, state, texts_or_ids,
                                      body.add_special_tokens)
        return await _serve(state, request, body, prompts, request_id, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        body.check_supported()
        _check_model(state, body.model)
        request_id = _request_id(request, body, "chatcmpl")
        _check_num_choices(state, body.n, 1)  # before the template renders
        prompt = await _chat_prompt_ids(state, body)
        return await _serve(state, request, body, [prompt], request_id, chat=True)

    return app


def _methods_of(app: FastAPI, path: str) -> str:
    """Every method some route of ``path`` answers, as an Allow header lists them."""
    methods = {m for route in app.routes if getattr(route, "path", None) == path for m in getattr(route, "methods", ())}
    return ", ".join(sorted(methods))


# ---- inputs ----------------------------------------------------------------------------------------
def _encoded_body_error(request: Request) -> APIError | None:
    """A 415 for a body the client compressed (Content-Encoding: gzip, ...), which nothing here decodes: it was a 400
    that said the body was "not UTF-8 text (byte 8b at 1)" or not valid JSON, not what to send instead."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    return APIError(415, f"the request body has Content-Encoding: {encoding[:40]}, which this server does not decode; "
                         "send it uncompressed (Content-Encoding: identity, or none)")


def _check_num_choices(state: ServerState, n: int, num_prompts: int) -> None:
    limit = state.engine.max_waiting_requests
    if n * num_prompts > limit:  # could never be queued: a 400, not an overload
        prompts = f"{num_prompts} prompt{'s' if num_prompts != 1 else ''}"
        raise bad_request(f"the request asks for {n * num_prompts} sequences ({prompts} x n={n}); "
                          f"the server queues at most {limit} (--max-waiting-requests)", "n")


def _check_model(state: ServerState, model: str | None) -> None:
    # An empty name asks for the served model, as in vLLM (which checks a name only when one is given): it was a 404.
    if model and model != state.model_name:
        raise APIError(404, f"the model '{model}' does not exist; this server serves '{state.model_name}'",
                       param="model")


def _request_id(request: Request, body: _Sampling, prefix: str) -> str:
    """The response's id, as vLLM names it: ``prefix-`` and the client's X-Request-Id header, else vLLM's request_id
    field, else a random one. The header was ignored: a gateway's trace id never reached the answer."""
    given = request.headers.get("x-request-id") or None
    what, param = "the X-Request-Id header", "X-Request-Id"
    if given is None:
        given, what, param = body.request_id or None, "request_id", "request_id"
    if given is None:
        return f"{prefix}-{uuid.uuid4().hex}"
    if len(given) > MAX_REQUEST_ID_CHARS:
        raise bad_request(f"{what} has {len(given)} characters; at most {MAX_REQUEST_ID_CHARS} are taken (every chunk "
                          "of a stream repeats it)", param)
    _check_unicode(given, what, param)  # a JSON id may hold half a surrogate pair: the response failed to encode, a 500
    return f"{prefix}-{given}"


async def _in_worker_if(big: bool, function, *args):
    """``function(*args)``: on a worker thread when ``big``, else inline (no thread hop for a small request)."""
    return await asyncio.to_thread(function, *args) if big else function(*args)


def _prompts_ids(state: ServerState, texts_or_ids: list[str | list[int]], add_special_tokens: bool) -> list[list[int]]:
    return [_prompt_ids(state, i, p, add_special_tokens) for i, p in enumerate(texts_or_ids)]


def _prompt_ids(state: ServerState, index: int, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
    if isinstance(prompt, str):
        if state.tokenizer is None:
            raise bad_request(f"prompt {index} is text but the model has no tokenizer; send token ids", "prompt")
        _check_unicode(prompt, f"prompt {index}", "prompt")
        ids = _encode(state.tokenizer, prompt, add_special_tokens)
    else:
        ids = prompt
    return _checked_ids(state, ids, f"prompt {index}", "prompt")


def _longest_token_chars(tokenizer) -> int | None:
    """The most characters one token of ``tokenizer`` spells, from its vocabulary (a byte-level token's string has a
    character per byte, so this bounds bytes too); None where that bounds nothing: a tokenizer that may drop text or
    lump any amount of it into one unknown token, or one whose make-up cannot be read."""
    try:
        if not _keeps_every_character(tokenizer.backend_tokenizer):
            return None
        return max((len(token) for token in tokenizer.get_vocab()), default=0) or None
    except Exception:  # noqa: BLE001 - no Hugging Face fast tokenizer, or an odd one: no bound, prompts are tokenized
        return None


# Normalizers that may merge characters (PROMPT_CHARS_MARGIN) but drop none, and pre-tokenizers that split text
# without dropping any of it: those of the byte-level BPE tokenizers of Qwen, Llama 3 and GPT-2, and SentencePiece's.
_KEEPING_NORMALIZERS = frozenset({"Sequence", "NFC", "NFKC", "NFD", "NFKD", "Prepend"})
_KEEPING_PRE_TOKENIZERS = frozenset({"Sequence", "ByteLevel", "Split", "Metaspace", "Digits", "Punctuation"})


def _keeps_every_character(backend) -> bool:
    """Whether every character of a text ends in some token that spells it: a BPE model with no unknown token (or
    byte fallback for one), and no normalizer or pre-tokenizer that drops text (Whitespace, Strip, ...)."""
    model = backend.model
    if type(model).__name__ != "BPE" or (model.unk_token is not None and not model.byte_fallback):
        return False
    for part, keeping in ((backend.normalizer, _KEEPING_NORMALIZERS), (backend.pre_tokenizer, _KEEPING_PRE_TOKENIZERS)):
        if part is None:
            continue
        for step in _json_types(json.loads(part.__getstate__())):
            if step.get("type") not in keeping or step.get("behavior") == "Removed":  # a Split that drops its matches
                return False
    return True


def _json_types(node) -> list[dict]:
    """Every object with a "type" in a tokenizer component's JSON (a Sequence holds its steps in a list)."""
    if isinstance(node, list):
        return [found for item in node for found in _json_types(item)]
    if not isinstance(node, dict):
        return []
    own = [node] if "type" in node else []
    return own + [found for value in node.values() for found in _json_types(value)]


def _check_prompt_chars(state: ServerState, text: str, what: str, param: str) -> None:
    limit = state.max_prompt_chars
    if limit is not None and len(text) > limit:
        longest = state.longest_token_chars
        raise bad_request(
            f"{what} has {len(text)} characters and cannot fit in max_model_len={state.max_model_len} tokens, which "
            f"spell at most {state.max_model_len * longest} (this tokenizer's longest token has {longest}); prompts of "
            f"more than {limit} characters are refused untokenized", param)


def _check_unicode(text: str, what: str, param: str) -> None:
    """JSON may escape half of a surrogate pair ("\\ud800") into a string no encoder takes; the tokenizer's
    TypeError was a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(f"{what} holds an unpaired surrogate (U+{ord(text[exc.start]):04X}); expected Unicode text",
                          param) from None


# What a chat request's prompt is called in its errors: it has no field "prompt" (a prompt too long was said to be
# "prompt 0", param "prompt", though the client sent messages).
_CHAT_PROMPT = "messages (as the chat template renders them)"


def _checked_ids(state: ServerState, ids: list[int], what: str, param: str) -> list[int]:
    if not ids:
        raise bad_request(f"{what} is empty", param)
    vocab_size = state.vocab_size
    if min(ids) < 0 or max(ids) >= vocab_size:  # min and max run in C; the offender is looked up only on failure
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise bad_request(f"{what} has token id {bad} outside the vocabulary [0, {vocab_size})", param)
    reason = state.rejection_reason_for(len(ids))
    if reason is not None:
        raise bad_request(f"{what} cannot be served: {reason}", param)
    return ids


async def _chat_prompt_ids(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    tokenizer = state.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise bad_request("the model has no chat template; use /v1/completions", "messages")
    messages = [m.for_template() for m in body.messages]
    # chat_template_kwargs override add_generation_prompt, as in vLLM (a keyword given twice was a TypeError)
    kwargs = {"add_generation_prompt": body.add_generation_prompt, **(body.chat_template_kwargs or {})}
    # A message's other fields (tool calls and their arguments) may be of any size, uncounted here: on the thread too.
    big = (len(messages) > THREAD_RENDER_MESSAGES or any(m.model_extra for m in body.messages)
           or sum(len(m["content"]) for m in messages) > THREAD_TOKENIZE_CHARS)
    text = await _in_worker_if(big, _render_chat, tokenizer, messages, kwargs)
    _check_unicode(text, "messages", "messages")
    _check_prompt_chars(state, text, _CHAT_PROMPT, "messages")
    ids = await _in_worker_if(len(text) > THREAD_TOKENIZE_CHARS, _encode, tokenizer, text, body.add_special_tokens)
    return _checked_ids(state, ids, _CHAT_PROMPT, "messages")


def _encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """A chat request's rendered template holds the special tokens it wants (add_special_tokens false, its default);
    a completion's text gets the tokenizer's own (a BOS) unless the client says otherwise, as in vLLM."""
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _render_chat(tokenizer, messages: list[dict], kwargs: dict) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception as exc:  # a template that refuses these messages (roles out of order, ...)
        raise bad_request(f"the chat template cannot render these messages: {exc}", "messages") from exc


def _stop_token_ids(state: ServerState, body: _Sampling) -> frozenset[int]:
    """The request's stop_token_ids, checked once and shared by all its choices (SamplingParams keeps a frozenset as
    given): each choice checked and copied them, and 200 prompts with 100,000 ids (a 390 KB body) held the event loop,
    /health and every stream, for 18 s."""
    stop_token_ids = body.stop_token_ids or ()
    bad = next((t for t in stop_token_ids if not 0 <= t < state.vocab_size), None)
    if bad is not None:
        raise bad_request(f"stop_token_ids has {bad}, outside the vocabulary", "stop_token_ids")
    return frozenset(stop_token_ids)


def _sampling_params(state: ServerState, body: _Sampling, num_prompt_tokens: int, max_tokens: int | None,
                     copy: int, *, stop_token_ids: frozenset[int],
                     stop: list[str] | tuple[str, ...] = ()) -> SamplingParams:
    """Errors name the field the client set the limit with (``body.max_tokens_param``: a chat request's
    max_completion_tokens was refused as "max_tokens must be >= 1", a field it had not sent); ``stop_token_ids``:
    _stop_token_ids' of the request; ``stop``: its stop strings."""
    max_tokens_param = body.max_tokens_param
    max_model_len = state.max_model_len
    room = max_model_len - num_prompt_tokens
    defaults = state.defaults
    if max_tokens is None:  # the generation config's max_new_tokens, within the room left (as vLLM: the least)
        max_tokens = room if defaults.max_tokens is None else min(room, defaults.max_tokens)
    elif max_tokens < 1:
        raise bad_request(f"{max_tokens_param} must be >= 1, got {max_tokens}", max_tokens_param)
    elif max_tokens > room:  # vLLM refuses these too, rather than cutting the answer short
        # A completion that leaves max_tokens out asks for OpenAI's default 16: said so, or the client was told of a
        # field it never sent.
        unset = max_tokens_param not in getattr(body, "model_fields_set", {max_tokens_param})
        raise bad_request(
            f"this model's maximum context length is {max_model_len} tokens; the request asks for "
            f"{num_prompt_tokens + max_tokens} ({num_prompt_tokens} in the prompt, {max_tokens_param}={max_tokens} to "
            f"generate{', the default: the request does not set it' if unset else ''})", max_tokens_param)
    seed = body.seed
    if seed == -1:  # vLLM's "no seed" (its SamplingParams takes -1 as None), what clients send for a random draw
        seed = None
    if seed is not None and not 0 <= seed < 2**64:
        raise bad_request(f"seed must be -1 (no seed) or an integer in [0, 2**64), got {seed}", "seed")
    # A field the request leaves out (or sends as null) takes the model's default; one it sets keeps its value.
    top_k = defaults.top_k if body.top_k is None else body.top_k
    if top_k < -1:
        raise bad_request(f"top_k must be -1 or 0 (off) or >= 1, got {top_k}", "top_k")
    try:
        return SamplingParams(
            temperature=defaults.temperature if body.temperature is None else body.temperature,
            top_p=defaults.top_p if body.top_p is None else body.top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            ignore_eos=body.ignore_eos,
            stop_token_ids=stop_token_ids,
            seed=seed,
            stop=stop,
            include_stop_str_in_output=body.include_stop_str_in_output,
            min_tokens=body.min_tokens,  # up to max_tokens, the room the prompt leaves where the request sets none
        ).sample(copy)  # n copies of one prompt sample differently, reproducibly
    except ValueError as exc:
        name = str(exc).split(" ", 1)[0].removeprefix("SamplingParams.")
        raise bad_request(str(exc).removeprefix("SamplingParams."), name) from exc


# ---- serving ---------------------------------------------------------------------------------------
async def _serve(state: ServerState, request: Request, body: _Sampling, prompts: list[list[int]], request_id: str, *,
                 chat: bool):
    stop = body.stop_strings
    max_tokens = body.requested_max_tokens
    if stop and state.tokenizer is None:
        raise bad_request("stop strings need a tokenizer; this model has none (use stop_token_ids)", "stop")
    n = body.n
    if max_tokens is None:  # max_tokens becomes the room the prompt leaves: a prompt that fills the context leaves none
        full = next((i for i, ids in enumerate(prompts) if len(ids) >= state.max_model_len), None)
        if full is not None:
            what, param = (_CHAT_PROMPT, "messages") if chat else (f"prompt {full}", "prompt")
            raise bad_request(f"{what} has {len(prompts[full])} tokens, which leaves no room to generate "
                              f"within max_model_len={state.max_model_len}", param)
    choice_prompts = [ids for ids in prompts for _ in range(n)]
    stop_token_ids = _stop_token_ids(state, body)
    params = [_sampling_params(state, body, len(ids), max_tokens, i % n, stop_token_ids=stop_token_ids, stop=stop)
              for i, ids in enumerate(choice_prompts)]
    try:
        stream = state.engine.submit(choice_prompts, params)
    except (ServerOverloaded, EngineDead) as exc:
        raise APIError(503, str(exc)) from exc
    choices = [_Choice(IncrementalDetokenizer.of(state.tokenizer, sp), ids) for sp, ids in zip(params, choice_prompts)]
    response = _Response(state, body, request_id, choices, chat, num_prompts=len(prompts),
                         stop_token_ids=stop_token_ids)
    # The client's X-Request-Id comes back, as vLLM's --enable-request-id-headers sends it
    echoed = {"X-Request-Id": request.headers["x-request-id"]} if request.headers.get("x-request-id") else {}
    if body.stream:
        return StreamingResponse(response.events(stream), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **echoed})
    whole = await response.collect(stream, request)
    whole.headers.update(echoed)
    return whole


class _Response:
    """Turns a request's engine updates into OpenAI objects, streamed or whole."""

    def __init__(self, state: ServerState, body: _Sampling, request_id: str, choices: list[_Choice],
                 chat: bool, num_prompts: int, stop_token_ids: frozenset[int]) -> None:
        self.state = state
        self.body = body
        self.stop_token_ids = stop_token_ids
        self.request_id = request_id
        self.choices = choices
        self.chat = chat
        self.num_copies = len(choices) // num_prompts
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self._templates: dict[int, list[str]] = {}  # choice index -> a token chunk split around its text

    # -- state --
    def _apply(self, stream: RequestStream, update: Update) -> str:
        """Fold an update into its choice; returns the new text to send."""
        if update.index < 0 or update.error is not None or update.finish_reason == "rejected":
            raise _Failed(update.error or "the request failed", shutdown=update.finish_reason == "shutdown")
        choice = self.choices[update.index]
        if choice.finished:  # ended by a stop string: the steps the engine ran before its abort landed add nothing
            return ""
        choice.token_ids.extend(update.new_token_ids)
        if update.num_cached_tokens:  # sent with the first token (continuous usage reported 0 until the last)
            choice.num_cached_tokens = update.num_cached_tokens
        # The engine's "stop" is an eos or a stop_token_ids token, its last: its text is left out (the detokenizer's
        # rule); the token stays in token_ids and the usage, as in vLLM.
        text = choice.detokenizer.add(update.new_token_ids, update.finished and update.finish_reason == "stop")
        if choice.detokenizer.stopped and not update.finished:  # a stop string ends this choice here
            self.state.engine.abort(stream, update.index, reason="stop", num_tokens=len(choice.token_ids))
            choice.finished, choice.finish_reason = True, "stop"
            choice.stop_reason = choice.detokenizer.stop_string
            return text
        if update.finished:
            choice.finished = True
            choice.num_cached_tokens = update.num_cached_tokens
            text += choice.detokenizer.finish()
            reason = update.finish_reason
            if choice.detokenizer.stopped or reason == "aborted":
                reason = "stop"
            elif reason in _CUT_REASONS:
                choice.cut_by, reason = reason, "length"
            choice.finish_reason = reason
            choice.stop_reason = choice.detokenizer.stop_reason(
                update.finish_reason, choice.token_ids[-1] if choice.token_ids else None, self.stop_token_ids)
        return text

    def _usage(self) -> dict:
        firsts = self.choices[::self.num_copies]  # a prompt counts once however many copies it has
        prompt = sum(c.num_prompt_tokens for c in firsts)
        completion = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(c.num_cached_tokens for c in firsts)}}

    def _choice_extras(self, choice: _Choice, token_ids: list[int]) -> dict:
        """What a choice carries beyond OpenAI's fields: the limit that cut it, and when asked for, ``token_ids`` (all
        of them in a whole response, a chunk's new ones in a stream) and a completion's ``prompt_token_ids`` (in a
        stream's first chunk of the choice only), as vLLM's return_token_ids gives them; a chat response carries its
        prompt's itself (_prompt_ids). The prompt's were left out: a client that asked got half, without a word."""
        extras = {}
        if choice.finished and choice.cut_by is not None:
            extras["cut_by"] = choice.cut_by
        if self.body.return_token_ids:
            if not self.chat and not choice.prompt_ids_sent:
                extras["prompt_token_ids"] = choice.prompt_token_ids
                choice.prompt_ids_sent = True
            extras["token_ids"] = list(token_ids)
        return extras

    def _prompt_ids(self, index: int) -> dict:
        """A chat response's (or stream chunk's) ``prompt_token_ids`` when asked for, as vLLM's: the rendered template's
        tokens, which the client cannot rebuild without the server's template."""
        return {"prompt_token_ids": self.choices[index].prompt_token_ids} if self.body.return_token_ids else {}

    # -- whole --
    async def collect(self, stream: RequestStream, request: Request) -> JSONResponse:
        task = asyncio.ensure_future(self._consume(stream))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    break
                if await request.is_disconnected():
                    task.cancel()
                    self.state.engine.abort(stream)
                    return JSONResponse({}, status_code=499)
            task.result()
        except _Failed as exc:
            # The engine still runs the choices that did not fail (or all of them, at a shutdown): free them, as a
            # stream's end does; left, a request of several prompts ran the rest to their end for nobody.
            if not all(c.finished for c in self.choices):
                self.state.engine.abort(stream)
            raise exc.api_error() from exc
        finally:
            if not task.done():
                task.cancel()
            self.state.engine.release(stream)
        out_choices = []
        for i, c in enumerate(self.choices):
            text = c.detokenizer.text
            body = ({"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                     "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} if self.chat else
                    {"index": i, "text": text, "logprobs": None, "finish_reason": c.finish_reason,
                     "stop_reason": c.stop_reason})
            body.update(self._choice_extras(c, c.token_ids))
            out_choices.append(body)
        return JSONResponse({"id": self.request_id, "object": self.object, "created": self.created,
                             "model": self.state.model_name, "choices": out_choices, "usage": self._usage(),
                             **(self._prompt_ids(0) if self.chat else {})})

    async def _consume(self, stream: RequestStream) -> None:
        async for update in stream.updates(lambda: self.state.engine.is_alive):
            self._apply(stream, update)
            if all(c.finished for c in self.choices):
                return

    # -- streamed --
    def _token_chunk(self, index: int, text: str) -> str:
        """A chunk with new text and nothing else, the one sent for nearly every token: formatted from a template
        (a dict through json.dumps costs several times more, per token of every stream)."""
        template = self._templates.get(index)
        if template is None:
            template = self._templates[index] = self._chunk(index, "\x00", None).split('"\\u0000"')
        if len(template) != 2:  # the marker occurs elsewhere too (a model name holding it): format in full
            return self._chunk(index, text, None)
        return json.dumps(text).join(template)

    def _chunk(self, index: int, text: str | None, finish_reason: str | None, first: bool = False,
               extras: dict | None = None) -> str:
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:  # a choice's last chunk says what ended it, as vLLM's does
            choice["stop_reason"] = self.choices[index].stop_reason
        if extras:
            choice.update(extras)
        chunk = {"id": self.request_id, "object": f"{self.object}.chunk" if self.chat else self.object,
                 "created": self.created, "model": self.state.model_name, "choices": [choice]}
        if self.body.include_usage:
            chunk["usage"] = self._usage() if self.body.continuous_usage else None
        if first:  # a chat choice's role chunk: its first
            chunk.update(self._prompt_ids(index))
        return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"

    async def events(self, stream: RequestStream) -> AsyncIterator[str]:
        engine = self.state.engine
        continuous_usage = self.body.continuous_usage
        try:
            if self.chat:  # the role first, as OpenAI's stream does
                for i in range(len(self.choices)):
                    yield self._chunk(i, "", None, first=True)
            async for update in stream.updates(lambda: engine.is_alive):
                choice = self.choices[update.index] if update.index >= 0 else None
                if choice is not None and choice.finished:
                    continue  # ended by a stop string: no chunk for what the engine ran before the abort landed
                try:
                    text = self._apply(stream, update)
                except _Failed as exc:
                    yield f"data: {json.dumps(exc.api_error().body())}\n\n"
                    break
                extras = self._choice_extras(choice, update.new_token_ids)
                # One chunk per step that produced tokens, text or not, so a client timing chunks sees every
                # token arrive (its text may wait for the rest of a character).
                if not extras and not choice.finished and not continuous_usage:  # the template has no usage
                    yield self._token_chunk(update.index, text)
                else:
                    yield self._chunk(update.index, text, choice.finish_reason if choice.finished else None,
                                      extras=extras)
                if all(c.finished for c in self.choices):
                    break
            if self.body.include_usage and all(c.finished for c in self.choices):
                usage = {"id": self.request_id, "object": f"{self.object}.chunk" if self.chat else self.object,
                         "created": self.created, "model": self.state.model_name, "choices": [],
                         "usage": self._usage()}
                yield f"data: {json.dumps(usage, separators=(',', ':'))}\n\n"
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the response is cancelled) or a choice failed: free what is left
            if not all(c.finished for c in self.choices):
                engine.abort(stream)
            engine.release(stream)


class _Failed(Exception):
    """The engine finished a request with an error, or the server ended it as it shut down (``shutdown``)."""

    def __init__(self, message: str, shutdown: bool = False) -> None:
        super().__init__(message)
        self.shutdown = shutdown

    def api_error(self) -> APIError:
        if self.shutdown:  # the client may retry elsewhere: a 503, as for a request that arrives while stopping
            return APIError(503, str(self))
        return APIError(500, f"the request failed in the engine: {self}", kind="engine_error")
