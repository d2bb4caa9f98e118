"""OpenAI request bodies (with vLLM's extensions), their checks, and OpenAI-style error bodies.

Fields the engine cannot honour (logprobs, penalties, tools, ...) are refused with a 400 that names
the field, rather than ignored: a client that asked for them would otherwise get silently different
output. Unknown fields are ignored, as vLLM and OpenAI do.
"""

from __future__ import annotations

import functools
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class APIError(Exception):
    """An error answered as ``{"error": {...}}`` with its HTTP status."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str | None = None) -> None:
        # A message may quote the client's own text, and JSON may carry half a surrogate pair ("\\ud800") that no
        # UTF-8 encoder takes: a model name or a refused value quoting one was a 500 while rendering the 400.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or {404: "not_found_error", 503: "service_unavailable"}.get(
            status, "invalid_request_error" if 400 <= status < 500 else "internal_error")  # 405, 413, ...: the client's

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


# Strict types, as OpenAI's API checks them: in pydantic's lax mode max_tokens "5" or 5.0 became 5, true became 1
# token, and stream "no" (any non-empty string) became a stream the client did not ask for. An int still passes
# where a float is expected (temperature 1).
_STRICT = ConfigDict(strict=True)


class _NullMeansDefault(BaseModel):
    """A null for a field that has a default and cannot itself be null stands for that default. OpenAI's API marks
    its optional fields nullable and clients send null for "not set" (``"n": null``, ``"stream": null``), which
    strict types refused as "Input should be a valid integer". Fields that take null keep it (``max_tokens``)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        names = _defaults_not_nullable(cls)
        if not any(data.get(name, 0) is None for name in names):  # the common case: no copy
            return data
        return {k: v for k, v in data.items() if not (v is None and k in names)}


@functools.cache
def _defaults_not_nullable(cls: type[BaseModel]) -> frozenset[str]:
    def nullable(annotation) -> bool:
        return annotation is Any or annotation is None or type(None) in typing.get_args(annotation)

    return frozenset(name for name, info in cls.model_fields.items()
                     if not info.is_required() and not nullable(info.annotation))


class StreamOptions(_NullMeansDefault):
    model_config = _STRICT

    include_usage: bool = False
    continuous_usage_stats: bool = False


# Every new token of every choice searches the text for each stop string, in the server's event loop: 100,000 of them
# held /health for seconds per request. OpenAI accepts 4; vLLM sets no limit.
MAX_STOP_STRINGS = 64

# vLLM's extensions this engine does not implement, with the values that ask for nothing: any other value is refused
# (unknown fields are ignored, but a client setting one of these would silently get other output than it asked for).
_UNSUPPORTED_EXTENSIONS: dict[str, tuple] = {
    "min_p": (None, 0, 0.0), "skip_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,), "prompt_logprobs": (None,), "use_beam_search": (None, False),
    "bad_words": (None, []), "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
    "guided_grammar": (None,), "structured_outputs": (None,),
    "allowed_token_ids": (None,), "logits_processors": (None,), "prompt_embeds": (None,),
    # vLLM refuses a priority other than 0 unless its scheduler runs the priority policy; here it was ignored, and
    # a client that asked to go first waited its turn without a word
    "priority": (None, 0),
}
# The same, of vLLM's chat requests only: continue_final_message (the assistant's last message continued rather than
# answered) and echo (the last message repeated in the answer) changed the output and were silently ignored.
_UNSUPPORTED_CHAT_EXTENSIONS: dict[str, tuple] = {
    "continue_final_message": (None, False), "echo": (None, False), "documents": (None,),
}


class _Sampling(_NullMeansDefault):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False  # vLLM's extension
    return_token_ids: bool = False  # vLLM's extension: the completion's and the prompt's token ids (api.py)
    # vLLM takes response_format on completions too (as structured output): it was ignored there, and a client that
    # asked for JSON got free text.
    response_format: dict[str, Any] | None = None
    # vLLM's extension: the response's id (cmpl-<request_id>) where no X-Request-Id header names it (api.py)
    request_id: str | None = None
    max_tokens: int | None = None  # None: the room the prompt leaves (a completion's default is 16, as OpenAI's)
    # OpenAI's newer name for max_tokens, which wins over it. Completions took it for an unknown field and ignored it:
    # a client that moved to the new name got the default 16 tokens without a word.
    max_completion_tokens: int | None = None

    def check_supported(self) -> None:
        if self.n < 1:
            raise bad_request(f"n must be >= 1, got {self.n}", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                raise bad_request(f"{name} is not supported by this engine (got {value}); leave it at 0", name)
        if self.repetition_penalty not in (None, 1, 1.0):
            raise bad_request(f"repetition_penalty is not supported (got {self.repetition_penalty}); leave it at 1",
                              "repetition_penalty")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported by this engine", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise bad_request("response_format other than text is not supported by this engine", "response_format")
        self._refuse_extensions(_UNSUPPORTED_EXTENSIONS)

    def _refuse_extensions(self, unsupported: dict[str, tuple]) -> None:
        extra = self.model_extra or {}
        for name, inert in unsupported.items():
            if name in extra and extra[name] not in inert:
                raise bad_request(f"{name} is not supported by this engine (got {str(extra[name])[:80]})", name)

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > MAX_STOP_STRINGS:
            raise bad_request(f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted", "stop")
        return stops  # (an empty one, or half a surrogate pair JSON escaped, is refused by SamplingParams)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The field requested_max_tokens came from, for errors to name."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM's extension: every chunk carries the usage so far (with include_usage, as there)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


_PROMPT_TYPES = "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists"


class CompletionRequest(_Sampling):
    # Checked by prompts(), not by pydantic: its union of list types tried each element of a 2k-token prompt
    # several times (2 ms per request on a busy host, most of the server's time to first token).
    prompt: Any
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    # vLLM's extension: false leaves out the tokens the tokenizer adds around a text (a BOS); it was ignored.
    add_special_tokens: bool = True

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise bad_request("echo is not supported by this engine", "echo")
        if self.logprobs is not None:
            raise bad_request("logprobs is not supported by this engine", "logprobs")
        if self.best_of not in (None, self.n):
            raise bad_request(f"best_of must equal n ({self.n}) on this engine, got {self.best_of}", "best_of")
        if self.suffix:
            raise bad_request("suffix is not supported by this engine", "suffix")

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts, each text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not isinstance(prompt, list):
            raise bad_request(_PROMPT_TYPES, "prompt")
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if all(type(t) is int for t in prompt):  # token ids (a bool is not one)
            return [prompt]
        if all(type(p) is str for p in prompt):
            return prompt
        if all(type(p) is list and all(type(t) is int for t in p) for p in prompt):
            return prompt
        raise bad_request(_PROMPT_TYPES, "prompt")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The content as one string; only text parts are accepted, joined with newlines as vLLM (and SGLang) join
        them for a template that takes a string: they were joined with nothing, ["ab", "cd"] was "abcd" where vLLM
        renders "ab\\ncd", another prompt without a word."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise bad_request(f"message content parts must be of type 'text', got {part.get('type')!r}",
                                  "messages")
            if not isinstance(part.get("text"), str):  # (said "must be of type 'text', got 'text'")
                raise bad_request(f"a message content part of type 'text' needs a string 'text', got "
                                  f"{str(part.get('text'))[:80]}", "messages")
            parts.append(part["text"])
        return "\n".join(parts)

    def for_template(self) -> dict[str, Any]:
        """What the chat template sees: the role, the content as text, and every other field the client sent (name,
        tool_calls, tool_call_id, ...), as vLLM hands them on. They were dropped: an agent's earlier tool calls and
        results vanished from its prompt without a word."""
        return {**(self.model_extra or {}), "role": self.role, "content": self.text()}


_CHAT_TEMPLATE_ARGUMENTS = frozenset({
    "conversation", "messages", "tokenize", "tools", "documents", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    # vLLM's extension, as there: the rendered template already holds the special tokens it wants.
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        self._refuse_extensions(_UNSUPPORTED_CHAT_EXTENSIONS)
        if self.logprobs or self.top_logprobs:  # (top_logprobs alone was refused as "logprobs", a field not sent)
            name = "logprobs" if self.logprobs else "top_logprobs"
            raise bad_request(f"{name} is not supported by this engine", name)
        if self.tools:
            raise bad_request("tools are not supported by this engine", "tools")
        # Asking for a tool call (or the deprecated function calling) without tools was ignored: the client got text
        # where it required a call.
        extra = self.model_extra or {}
        for name in ("tool_choice", "function_call"):
            if extra.get(name) not in (None, "none", "auto"):
                raise bad_request(f"{name} {str(extra[name])[:80]} is not supported by this engine (no tool calls); "
                                  "leave it out, or 'none' or 'auto'", name)
        if extra.get("functions"):
            raise bad_request("functions are not supported by this engine", "functions")
        # Not a chat field of OpenAI's, but vLLM's chat requests took it (n samples, the best_of best returned): it was
        # ignored, and the client got n plain samples without a word.
        if extra.get("best_of") not in (None, self.n):
            raise bad_request(f"best_of must equal n ({self.n}) on this engine, got {str(extra['best_of'])[:80]}",
                              "best_of")
        # apply_chat_template's own arguments, not template variables: they were a 400 that quoted Python ("got multiple
        # values for keyword argument 'tokenize'"), or, as tools and documents, fed the template what is refused above.
        reserved = sorted(_CHAT_TEMPLATE_ARGUMENTS & set(self.chat_template_kwargs or {}))
        if reserved:
            raise bad_request(f"chat_template_kwargs may not set {', '.join(reserved)}: they are not template "
                              "variables", "chat_template_kwargs")
        # A client's Jinja template would render in the server's event loop, where a slow one stalls every request.
        for param, fields in (("chat_template", self.model_extra or {}), ("chat_template_kwargs",
                                                                         self.chat_template_kwargs or {})):
            if fields.get("chat_template") is not None:
                raise bad_request("chat templates from the request are not accepted; the model's own is used", param)


def validation_error(errors: list[dict]) -> APIError:
    """A 400 from pydantic's errors: one line that says where each is and what was expected, and ``param`` the
    top-level field of the first (clients and SDKs read it to point at the bad field; it was always null)."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "")
        return bad_request(f"the request body is not valid JSON{': ' + str(reason) if reason else ''}")
    if tuple(first.get("loc", ())) == ("body",):  # the body as a whole: absent, or not a JSON object
        if first.get("type") == "missing":
            return bad_request("the request body is empty; expected a JSON object")
        value = first.get("input")
        if isinstance(value, bytes):  # FastAPI reads a body as JSON only when it is declared so, else hands on bytes
            return bad_request("the request body is not read as JSON: send it with Content-Type: application/json")
        if first.get("type") == "string_unicode" and isinstance(value, str):  # a key of the object itself
            # (the string is a field name holding half a surrogate pair, "\\ud800"; it was said not to be read as JSON)
            return bad_request(f"the request body has a field name that is not Unicode text: {value[:80]!r}")
        return bad_request(f"the request body must be a JSON object, got {_json_type(value)}")
    parts = []
    for error in errors[:3]:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {error.get('msg', 'invalid')}" if loc else error.get("msg", "invalid"))
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    field = next((p for p in first.get("loc", ()) if p != "body"), None)
    return bad_request("invalid request: " + "; ".join(parts) + more, field if isinstance(field, str) else None)


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)
