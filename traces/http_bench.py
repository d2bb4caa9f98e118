"""Replay requests against an OpenAI-compatible server over HTTP and time them from the client's side.

The client behind ``python -m traces.bench`` (``cli.traces_bench`` builds the requests and writes the run);
``python -m traces.http_bench`` runs that command too.
Torch-free and free of the analysis layer, so any server's tests can drive it: it needs only aiohttp.

Each request is sent at its offset from the replay's start (a dispatcher sleeps until then, so pacing does
not drift with the number of requests in flight), at most ``max_concurrency`` at a time, streamed from
``/v1/completions`` with ``stream_options.include_usage``. Timing follows vLLM's ``bench serve``: the first
streamed chunk that carries a choice is the first token, every later one a token time (a chunk that
bundles several tokens counts once: the client cannot split it), the last one the end of the request.
Token counts come from the ``usage`` chunk, or from the chunks counted when the server sends none. A chunk
without text that closes the stream with the finish reason, or opens it, is no token where the counts say so
(``_drop_tokenless_chunk``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from engine.core.json_errors import json_problem
from engine.core.messages import one_line
from engine.core.sequence import FinishReason

MAX_ERROR_CHARS = 300  # an error body can be a whole HTML page: keep its start
SERVED_REASONS = ("stop", "length")  # what an OpenAI server says when a request ran to its end
# The limits that cut an output, as our server names them in a choice's "cut_by" (its finish reason is "length").
CUT_REASONS = tuple(r.value for r in FinishReason if r.is_cut)
# What a "length" short of max_tokens is recorded as when the server names no limit: the context length is the one
# limit at which OpenAI-compatible servers (vLLM, SGLang) end an output early with "length".
DEFAULT_CUT_BY = FinishReason.MAX_MODEL_LEN.value
# What a 400 answer says of a prompt the deployment can never serve: ours "prompt 0 cannot be served: prompt has N
# tokens, more than max_model_len=M" (or a text that "cannot fit in max_model_len"), vLLM "This model's maximum
# context length is M tokens" or "... longer than the maximum model length of M", SGLang "... longer than the
# model's context length". engine.replay and sim.replay record such a request as rejected (never admitted, no
# latency), so a served run counted it as failed where the simulation of the same trace counted it as rejected.
NEVER_SERVED_PHRASES = ("cannot be served", "cannot fit in max_model_len", "context length", "maximum model length")


@dataclass(frozen=True)
class BenchRequest:
    """One request to send: ``send_at_s`` after the replay's start, with exactly these tokens asked for."""

    request_id: str
    send_at_s: float
    prompt: list[int] | str
    prompt_tokens: int
    max_tokens: int


@dataclass
class BenchResult:
    """What the client saw of one request; times in seconds from the replay's start (perf_counter)."""

    request_id: str
    scheduled_s: float
    send_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    cut_by: str | None = None  # the limit that cut the output short of max_tokens (finish reason "length")
    error: str | None = None
    reject_reason: str | None = None  # the server refused the prompt as one it can never serve (not a failure)
    # Chunks that may carry no token: the first one without text or finish reason (a role chunk's kind), the last
    # one without text but with the finish reason.
    opens_without_text: bool = False
    closes_finish_only: bool = False

    @property
    def ok(self) -> bool:
        """Not failed: served, or rejected as never servable (as the engine's records tell the two apart)."""
        return self.error is None

    @property
    def recorded_reason(self) -> str:
        """The run's finish reason: a cut output says it was cut (by which limit), as the engine's records do."""
        if not self.ok:
            return "error"
        if self.reject_reason is not None:
            return FinishReason.REJECTED.value
        return self.cut_by or self.finish_reason


@dataclass(frozen=True)
class BenchTarget:
    """Where and how to send: the completions URL, the body fields every request shares, the limits."""

    completions_url: str
    model: str
    max_concurrency: int | None = None
    timeout_s: float = 600.0
    temperature: float = 0.0

    def body(self, request: BenchRequest) -> dict:
        return {
            "model": self.model,
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "ignore_eos": True,  # vLLM's extension: the output is exactly as long as the trace asks
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


def _short(text: str) -> str:
    return one_line(text, MAX_ERROR_CHARS)


def _error_message(status: int, body: bytes) -> str:
    """``HTTP 400: <the server's message>`` from an OpenAI-style error body, or the body's start."""
    return f"HTTP {status}: {_server_message(body) or 'no body'}"


def _server_message(body: bytes) -> str:
    """The message of an OpenAI-style error body, or the body's start, on one line."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # also nested thousands deep, or an integer of thousands of digits
        return _short(text)  # (those were a traceback out of the whole replay, or the request's error)
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    message = error.get("message") if isinstance(error, dict) else None
    return _short(str(message if message is not None else error))


def _count(value: object) -> int | None:
    """A token count a server reported, or None for what is none (true, -1, 10**30 failed the run's write after
    every request had been sent)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def _read_usage(usage: dict, result: BenchResult) -> None:
    if _count(usage.get("prompt_tokens")) is not None:
        result.prompt_tokens = usage["prompt_tokens"]
    if _count(usage.get("completion_tokens")) is not None:
        result.output_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
        result.cached_tokens = details["cached_tokens"]


def _on_event(data: str, result: BenchResult, now_s: float) -> bool:
    """Apply one SSE ``data:`` payload; True at ``[DONE]``."""
    if data == "[DONE]":
        return True
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        raise ValueError(f"not a JSON event: {_short(data)}") from None
    except (ValueError, RecursionError) as exc:  # nested too deeply (a traceback out of the replay), a huge integer
        raise ValueError(f"not a JSON event ({json_problem(exc)}): {_short(data)}") from None
    if not isinstance(event, dict):
        raise ValueError(f"not a JSON object event: {_short(data)}")
    if event.get("error") is not None:  # servers report a failure mid-stream as an error event
        error = event["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise ValueError(f"error event: {_short(str(message))}")
    choices = event.get("choices")
    if choices is not None and not isinstance(choices, list):  # a dict's choices[0] was a KeyError traceback
        raise ValueError(f"'choices' is not a list: {_short(data)}")
    if choices:
        result.chunk_times_s.append(now_s)
        reason = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
        has_text = _has_text(choices[0])
        if len(result.chunk_times_s) == 1:
            result.opens_without_text = not has_text and reason is None
        result.closes_finish_only = not has_text and reason is not None
        if reason is not None:
            result.finish_reason = str(reason)
            cut_by = choices[0].get("cut_by")  # our server's extension; kept only when it names a limit
            result.cut_by = cut_by if cut_by in CUT_REASONS else None
    usage = event.get("usage")
    if isinstance(usage, dict):
        _read_usage(usage, result)
    return False


def _has_text(choice: object) -> bool:
    """Whether a streamed choice carries text (a completion's ``text``, or a chat ``delta``'s ``content``)."""
    if not isinstance(choice, dict):
        return False
    text = choice.get("text")
    if text is None and isinstance(choice.get("delta"), dict):
        text = choice["delta"].get("content")
    return bool(text)


def _drop_tokenless_chunk(result: BenchResult, max_tokens: int) -> None:
    """Count the tokens of a served stream, and leave in ``chunk_times_s`` no opening chunk that carried none.

    Without usage, a closing chunk with only the finish reason is no token (vLLM's bench counts the text's tokens
    then, and that chunk has none): counted, a 5-token output was 6 tokens, and one the server cut read as complete.
    With usage, one chunk more than its count is the closing finish-only chunk if there is one (the request still
    ends at it: ``result_rows`` drops its time), else an opening chunk without text: taken for the last chunk, that
    opening chunk was the first token (a TTFT of the role chunk's time) and the last token's time was lost."""
    times = result.chunk_times_s
    if result.output_tokens is None:
        num_tokens = len(times) - (result.closes_finish_only and len(times) > 1)
        if num_tokens > max_tokens and result.opens_without_text:
            del times[0]
            num_tokens -= 1
        result.output_tokens = num_tokens
    elif len(times) == result.output_tokens + 1 and result.opens_without_text and not result.closes_finish_only:
        del times[0]


async def _stream(response: aiohttp.ClientResponse, result: BenchResult, clock: Callable[[], float]) -> bool:
    """Read the event stream into ``result``; True if it ended with ``[DONE]``."""
    buffer = b""
    async for chunk in response.content.iter_any():
        now_s = clock()
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments (":"), event names
            if _on_event(line[5:].strip().decode("utf-8", errors="replace"), result, now_s):
                return True
    line = buffer.strip()
    if line.startswith(b"data:"):
        return _on_event(line[5:].strip().decode("utf-8", errors="replace"), result, clock())
    return False


async def _send(session: aiohttp.ClientSession, target: BenchTarget, request: BenchRequest, result: BenchResult,
                clock: Callable[[], float]) -> None:
    result.send_s = clock()
    async with session.post(target.completions_url, json=target.body(request)) as response:
        if response.status != 200:
            body = await response.read()
            message = _server_message(body)
            if response.status == 400 and any(phrase in message.lower() for phrase in NEVER_SERVED_PHRASES):
                result.reject_reason = message
            else:
                result.error = _error_message(response.status, body)
            return
        done = await _stream(response, result, clock)
        content_type = response.content_type
    if not result.chunk_times_s:
        # A server that ignores "stream": true answers one JSON body: say so rather than leave "no token" a riddle.
        kind = "" if content_type == "text/event-stream" else f" (the answer is {content_type}, not an event stream)"
        result.error = f"the stream carried no token{kind}"
    elif not done and result.finish_reason is None:
        result.error = "the stream ended before its last token (no finish_reason, no [DONE])"
    elif result.finish_reason not in SERVED_REASONS:
        result.error = f"finish_reason {result.finish_reason!r}"
    else:
        result.error = _usage_problem(request, result)
        if result.error is not None:  # the server's counts are wrong: the run counts the chunks it saw instead
            result.prompt_tokens = result.output_tokens = result.cached_tokens = None


def _usage_problem(request: BenchRequest, result: BenchResult) -> str | None:
    """Why the counts the server's usage reports cannot be this stream's, or None. They are the run's token
    counts, so a wrong one was a silent wrong figure: 1,000 completion tokens reported for 10 streamed made TPOT
    100x too small, 10**6 cached tokens of a 100-token prompt a prefix-cache hit rate of 1,000,000 %."""
    output, chunks = result.output_tokens, len(result.chunk_times_s)
    if isinstance(request.prompt, list) and result.prompt_tokens is not None \
            and result.prompt_tokens != len(request.prompt):
        # Token ids were sent: their number is the prompt's length, whatever the server counts.
        return (f"the server's usage reports {result.prompt_tokens} prompt tokens for the {len(request.prompt)} "
                "token ids sent; expected that many")
    if output is not None:
        if output > request.max_tokens:
            return (f"the server's usage reports {output} completion tokens, more than the {request.max_tokens} "
                    "asked (max_tokens)")
        # One chunk per token at most, and one more that carries only the finish reason.
        if chunks > output + 1 or output == 0:
            return (f"the server's usage reports {output} completion tokens for {chunks} streamed chunks; expected "
                    "at least one token, and at most one chunk per token plus one finish-only chunk")
    prompt = result.prompt_tokens if result.prompt_tokens is not None else request.prompt_tokens
    if result.cached_tokens is not None and result.cached_tokens > prompt:
        return (f"the server's usage reports {result.cached_tokens} cached prompt tokens of a {prompt}-token "
                "prompt; expected at most the prompt")
    return None


async def _one(session: aiohttp.ClientSession, target: BenchTarget, request: BenchRequest,
               semaphore: asyncio.Semaphore | None, clock: Callable[[], float]) -> BenchResult:
    result = BenchResult(request_id=request.request_id, scheduled_s=request.send_at_s)
    try:
        if semaphore is None:
            await asyncio.wait_for(_send(session, target, request, result, clock), target.timeout_s)
        else:
            async with semaphore:  # the timeout runs from the send, not from the wait for a slot
                await asyncio.wait_for(_send(session, target, request, result, clock), target.timeout_s)
    except asyncio.TimeoutError:
        result.error = f"no complete answer within the per-request timeout of {target.timeout_s:g} s"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {_short(str(exc)) or 'connection lost'}"
    if result.error is None:
        _drop_tokenless_chunk(result, request.max_tokens)  # its tokens counted; an opening chunk of none left out
    if result.error is None and result.finish_reason == "length" and result.output_tokens < request.max_tokens:
        # "length" short of max_tokens is a limit of the server's (its context length): counted as a plain "length",
        # the output was a complete one and the run's summary said no request was cut
        result.cut_by = result.cut_by or DEFAULT_CUT_BY
    else:
        result.cut_by = None  # a "cut_by" on an output that got every token asked for (or failed) cut nothing
    return result


async def replay_over_http(
    target: BenchTarget,
    requests: Sequence[BenchRequest],
    on_done: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    """Send ``requests`` (ordered by ``send_at_s``) on their schedule; results in the same order.

    Cancelling the returned coroutine (a command's Ctrl-C, through ``engine.core.interrupt.run_async``) cancels every
    request in flight and closes the connections.
    """
    semaphore = asyncio.Semaphore(target.max_concurrency) if target.max_concurrency else None
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    async def tracked(request: BenchRequest) -> BenchResult:
        result = await _one(session, target, request, semaphore, clock)
        if on_done is not None:
            on_done(result)
        return result

    # No connection cap of aiohttp's own (its default of 100 would queue requests unseen): the semaphore is it.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks: list[asyncio.Task] = []
        try:
            for request in requests:
                delay_s = request.send_at_s - clock()
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                tasks.append(asyncio.create_task(tracked(request)))
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()


async def first_model(base_url: str, timeout_s: float = 30.0) -> str:
    """The id of the first model the server lists at ``/v1/models`` (what ``vllm bench serve`` does without
    ``--model``); ValueError naming the URL when there is none."""
    url = f"{base_url}/v1/models"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(url) as response:
                if response.status != 200:
                    raise ValueError(f"{url}: {_error_message(response.status, await response.read())}")
                body = await response.read()
    except asyncio.TimeoutError:  # its message is empty: say what timed out
        raise ValueError(f"{url}: cannot reach the server (no answer within {timeout_s:g} s)") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ValueError(f"{url}: cannot reach the server ({type(exc).__name__}: {exc})") from None
    try:
        listing = json.loads(body)
    except (ValueError, RecursionError) as exc:  # nested too deeply was a traceback, a huge integer Python's own advice
        raise ValueError(f"{url}: the answer is not JSON ({json_problem(exc)})") from None
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise ValueError(f"{url}: the server lists no model; pass --model")
    return str(models[0]["id"])


if __name__ == "__main__":  # `python -m traces.http_bench --help` ran the definitions above and printed nothing
    from engine.core.interrupt import run_command

    run_command("cli.traces_bench")  # the command this is the client of: python -m traces.bench
