"""ShareGPT conversations (a JSON list of {"id", "conversations": [{"from", "value"}, ...]}).

The published variants are read as they are:
- ShareGPT_V3_unfiltered_cleaned_split.json and ShareGPT52K/90K: `conversations` of
  `{"from": "human"|"gpt"|..., "value"}`; a conversation may be empty, open with the model
  or end with an unanswered message;
- OpenChat's sharegpt_gpt4.json keeps the messages under `items`;
- chat-style exports (LLaMA-Factory's second layout, UltraChat) use `messages` of
  `{"role": "user"|"assistant"|"system", "content"}` (`role` with `value` too); a content
  that is an OpenAI-style list of text parts is read as its texts joined by newlines;
- LLaMA-Factory's function calling adds the roles `function_call` (the model's) and
  `observation` (the tool's result, which the model then answers), and a top-level
  `system` prompt (and `tools` text) that opens the conversation's context;
- a JSON Lines file (one conversation object per line), as several mirrors publish it.
Roles are matched without regard to case ("USER", "Assistant").

Every user message (or tool result) that is followed by a model answer becomes one request. Its prompt
is the whole conversation so far plus the new message, tokenized message by message
(no chat template, no special tokens) and concatenated, so the ids of turn k are an
exact prefix of the ids of turn k+1 and prefix caching sees the real reuse. output_tokens
is the token count of the answer. Requests whose prompt or answer tokenizes to nothing
are dropped and counted (their messages stay in the history).

Arrivals: conversations start as a seeded Poisson process at rate qps / (mean requests
per conversation), so the long-run request rate is --qps; each later turn arrives a think
time (gamma, mean --think-time-s, CV --think-time-cv) after the previous turn's arrival.
request_id numbers requests in file order; session_id is the conversation's "id" (lmsys-chat-1m's
"conversation_id"; its index in the list when it has neither; an id already taken by an earlier
conversation gets "#index" appended).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from engine.core.json_errors import json_problem, json_type_name
from engine.core.messages import one_line, shown
from traces.arrivals import arrival_times_s, gamma_gaps_s
from traces.errors import TraceError
from traces.files import existing_path
from traces.formats.base import Converted, ConvertOptions, RepeatedKey, json_error_at, json_syntax_hint, unique_keys
from traces.formats.tabular import READ_ERRORS, check_source_file, open_text, read_error

USER_ROLES = frozenset({"human", "user"})
TOOL_ROLES = frozenset({"observation", "tool", "function"})  # a tool's result, which the model answers next
INPUT_ROLES = USER_ROLES | TOOL_ROLES  # a message that, answered, makes a request
MODEL_ROLES = frozenset({"gpt", "chatgpt", "bing", "bard", "assistant", "model", "function_call"})
CONTEXT_ROLES = frozenset({"system"})
KNOWN_ROLES = INPUT_ROLES | MODEL_ROLES | CONTEXT_ROLES
# Where a conversation's messages live: ShareGPT and Vicuna, OpenChat, chat-style exports, lmsys-style.
MESSAGE_LIST_KEYS = ("conversations", "items", "messages", "conversation")
# Top-level text that a chat template puts before the first message (LLaMA-Factory's layout).
CONTEXT_FIELDS = ("system", "tools")
_CHUNK_CONVERSATIONS = 256  # conversations per tokenizer call


def load_tokenizer(name_or_path: str | None) -> Any:
    """A local Hugging Face tokenizer; never downloads."""
    if not name_or_path:
        raise TraceError("sharegpt needs --tokenizer PATH (a local Hugging Face tokenizer directory)")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is a dev dependency
        raise TraceError(f"sharegpt needs the transformers package ({exc})") from exc
    # None also for a name too long to be a file's: Path.exists() raised OSError, reported as "-o OUT: File name too
    # long"
    path = existing_path(name_or_path)
    if path is not None and not path.is_dir():  # transformers' message was about a config "mapping, not list"
        raise TraceError(f"--tokenizer {name_or_path}: is a file; expected a Hugging Face tokenizer directory")
    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a missing or broken tokenizer
        if path is None:  # its message spoke of repo ids and internet connections, over several lines
            raise TraceError(f"--tokenizer {name_or_path}: no such directory (nor a tokenizer of that name in the "
                             "local Hugging Face cache); expected a tokenizer directory") from None
        reason = one_line(exc, 300)  # transformers' messages span lines; an error is one line
        raise TraceError(f"--tokenizer {name_or_path}: cannot load a local tokenizer ({reason})") from None


def _parse_json(path: Path, text: str, line: int | None = None) -> Any:
    """One JSON document (the whole file, or one line of a JSON Lines file, numbered `line`)."""
    where = f"{path}: line {line}" if line is not None else f"{path}"
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except RepeatedKey as exc:  # a turn's second "value" replaced its first, without a word
        raise TraceError(f"{where}: {exc.problem}") from None
    except RecursionError:  # arrays nested thousands deep: no conversation list looks like that
        raise TraceError(f"{where}: JSON nested too deeply to read; expected a list of conversations") from None
    except json.JSONDecodeError as exc:
        if line is None and exc.msg == "Extra data" and exc.lineno > 1:
            raise  # a second document on a later line: JSON Lines, read line by line
        hint = json_syntax_hint(text, exc, "file" if line is None else "line") if text.lstrip()[:1] in ("[", "{") \
            else "; expected a JSON list of conversations or JSON Lines"
        raise TraceError(f"{path}: line {line or exc.lineno}: not valid JSON ({json_error_at(exc)}){hint}") from None
    except ValueError as exc:  # an integer of 5000 digits: the message named neither the file nor the problem
        raise TraceError(f"{where}: cannot read the JSON ({json_problem(exc)}); expected a list of "
                         "conversations") from None


def _load_conversations(path: Path) -> tuple[list, list[int] | None]:
    """The conversations, and for a JSON Lines file the line each is on (None for one JSON document)."""
    check_source_file(path, "a ShareGPT JSON file")
    try:
        with open_text(path) as handle:  # compressed or not; a byte order mark (Windows editors) is no JSON
            text = handle.read()
    except READ_ERRORS as exc:
        raise TraceError(read_error(path, exc)) from None
    if not text.strip():  # json's 'Expecting value' at line 1 said nothing of an empty file
        raise TraceError(f"{path}: the file is empty; expected a JSON list of conversations or JSON Lines")
    try:
        data = _parse_json(path, text)
    except json.JSONDecodeError:
        return _json_lines(path, text)
    if isinstance(data, dict) and any(key in data for key in MESSAGE_LIST_KEYS):
        return [data], None  # one conversation object: JSON Lines of one line, or a file of its own
    if not isinstance(data, list):
        raise TraceError(f"{path}: top level is a JSON {json_type_name(data)}; expected a list of conversations")
    return data, None


def _json_lines(path: Path, text: str) -> tuple[list, list[int]]:
    """One conversation per non-blank line (ShareGPT mirrors published as .jsonl)."""
    data, lines = [], []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            data.append(_parse_json(path, line, number))
            lines.append(number)
    return data, lines


def _messages(path: Path, index: int, item: object, line: int | None = None) -> tuple[str, list[tuple[str, str]]]:
    """(session id, [(role, text), ...]) for one conversation, checking its shape; `line` for JSON Lines."""
    at = f"{path}: line {line}:" if line is not None else f"{path}:"
    if not isinstance(item, dict):
        raise TraceError(f"{at} conversation {index}: expected an object, got {type(item).__name__}")
    # lmsys-chat-1m and its exports name the conversation "conversation_id" and have no "id": its own id, not the
    # list index, is what a user looks the session up by.
    given = item.get("id") if item.get("id") is not None else item.get("conversation_id")
    session = str(index) if given is None else str(given)  # null is no id either
    where = f"{at} conversation {index} (id {shown(repr(session))})"
    if not session.isascii():  # the parquet's session_id is UTF-8: a lone surrogate failed its write, unnamed
        try:
            session.encode("utf-8")
        except UnicodeEncodeError:
            raise TraceError(f"{where}: field 'id' holds an unpaired surrogate, which is no Unicode text; "
                             "expected text") from None
    key = next((key for key in MESSAGE_LIST_KEYS if key in item), "conversations")
    turns = item.get(key)
    if not isinstance(turns, list):
        raise TraceError(f"{where}: field {key!r} is missing or not a list (the messages are read from "
                         f"{', '.join(repr(k) for k in MESSAGE_LIST_KEYS)})")
    messages = _context(where, item)
    for position, message in enumerate(turns):
        messages.append(_message(f"{where}, message {position}", message))
    return session, messages


def _context(where: str, item: dict) -> list[tuple[str, str]]:
    """The conversation-level system prompt and tool descriptions, as context messages before the first turn."""
    context = []
    for field in CONTEXT_FIELDS:
        text = item.get(field)
        if text is None or text == "" or (field == "tools" and text == "[]"):  # "[]": no tools, nothing rendered
            continue
        if not isinstance(text, str):
            raise TraceError(f"{where}: field {field!r} is {type(text).__name__}; expected a string")
        context.append(("system", _checked_text(where, field, text)))
    return context


def _checked_text(where: str, field: str, text: str) -> str:
    """`text`, refused if it holds a lone surrogate such as "\\ud800" (JSON allows one, UTF-8 cannot hold it, and the
    tokenizer failed with a TypeError). Checked here, where the message's position is known: a system prompt
    before the turns shifts the positions the tokenizer sees."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as bad:
            raise TraceError(f"{where}: field {field!r} holds {text[bad.start:bad.end]!r} at character {bad.start}, "
                             "which is no Unicode text (an unpaired surrogate); expected text") from None
    return text


def _message(where: str, message: object) -> tuple[str, str]:
    """(role, text) of one message, `from`/`value` (ShareGPT) or `role`/`content` (chat style)."""
    if not isinstance(message, dict):
        raise TraceError(f"{where}: expected an object with 'from' and 'value'")
    role_field = "from" if "from" in message or "role" not in message else "role"
    text_field = "value" if "value" in message or "content" not in message else "content"
    role, text = message.get(role_field), message.get(text_field)
    role = role.lower() if isinstance(role, str) else role
    # An OpenAI-style assistant message that only calls tools has "content": null: it says nothing, as "" does (an
    # answer of 0 tokens is dropped and counted).
    text = "" if text is None and text_field in message else text
    if role not in KNOWN_ROLES:
        raise TraceError(
            f"{where}: field {role_field!r} is {shown(repr(message.get(role_field)))}; expected 'human' or 'gpt' "
            f"(also accepted: {', '.join(sorted(KNOWN_ROLES - {'human', 'gpt'}))})"
        )
    if isinstance(text, list):
        text = _text_of_parts(where, text_field, text)
    if not isinstance(text, str):
        raise TraceError(f"{where}: field {text_field!r} is {type(text).__name__}; expected a string")
    return role, _checked_text(where, text_field, text)


def _text_of_parts(where: str, field: str, parts: list) -> str:
    """The text of an OpenAI-style content list ([{"type": "text", "text": ...}, ...], as chat exports write a message
    since the API took images): its text parts joined by newlines, as vLLM's chat front end joins them. A part of
    another kind (an image, audio) is refused: its prefill cost is unknown here, and leaving it out would shorten the
    prompt silently. Before, any list was refused as 'field is list; expected a string'."""
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = ("a text part whose 'text' is no string" if kind == "text" else f"of type {shown(repr(kind))}"
                    if isinstance(kind, str) else f"a JSON {json_type_name(part)}")
            raise TraceError(f"{where}: field {field!r} is a list whose part {index} is {what}; expected a string, or "
                             "a list of {'type': 'text', 'text': ...} parts (images and other media are not simulated)")
        texts.append(part["text"])
    return "\n".join(texts)


def _tokenize(path: Path, tokenizer: Any, texts: list[str], start: int, chunk: list) -> list[list[int]]:
    """Token ids of every message of a chunk of conversations (their texts are checked as they are read: a lone
    surrogate was a TypeError traceback here); a failure names the chunk's conversations."""
    if not texts:
        return []
    try:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    except Exception as exc:  # tokenizers raise TypeError, ValueError, their own exceptions
        raise TraceError(f"{path}: conversations {start} to {start + len(chunk) - 1}: the tokenizer failed "
                         f"({one_line(exc)[:200]})") from None


def _requests_of(messages: list[tuple[str, str]],
                 ids: list[list[int]]) -> tuple[list[tuple[list[int], int]], list[int]]:
    """[(prompt ids, output tokens)] for each answered human turn, and for each dropped one how many found
    requests precede it."""
    history: list[int] = []
    found: list[tuple[list[int], int]] = []
    dropped: list[int] = []
    for position, ((role, _), message_ids) in enumerate(zip(messages, ids)):
        answered = (
            role in INPUT_ROLES and position + 1 < len(messages) and messages[position + 1][0] in MODEL_ROLES
        )
        history = history + message_ids
        if answered:
            output_tokens = len(ids[position + 1])
            if history and output_tokens:
                found.append((history, output_tokens))
            else:
                dropped.append(len(found))
    return found, dropped


def read(path: Path, options: ConvertOptions) -> Converted:
    tokenizer = load_tokenizer(options.tokenizer)
    if options.qps is None or not options.qps > 0:
        raise TraceError("sharegpt needs --qps Q (> 0): the data has no arrival times")
    data, lines = _load_conversations(path)
    columns: dict[str, list] = {"prompt_token_ids": [], "output_tokens": [], "session_id": [], "turn": []}
    kept_before_drops: list[int] = []  # in file order, the order --limit takes requests in
    sessions: set[str] = set()
    for start in range(0, len(data), _CHUNK_CONVERSATIONS):
        chunk = [_messages(path, start + i, item, lines[start + i] if lines else None)
                 for i, item in enumerate(data[start : start + _CHUNK_CONVERSATIONS])]
        texts = [text for _, messages in chunk for _, text in messages]
        encoded = _tokenize(path, tokenizer, texts, start, chunk)
        offset = 0
        for index, (session, messages) in enumerate(chunk, start=start):
            # One session per conversation: an id seen before gets the conversation's index, or two conversations
            # would read as one (two first turns) to session-aware consumers such as analysis.capacity.
            while session in sessions:
                session = f"{session}#{index}"
            sessions.add(session)
            ids = encoded[offset : offset + len(messages)]
            offset += len(messages)
            found, dropped = _requests_of(messages, ids)
            kept_before_drops.extend(len(columns["turn"]) + k for k in dropped)
            for turn, (prompt_ids, output_tokens) in enumerate(found):
                for name, value in zip(columns, (prompt_ids, output_tokens, session, turn)):
                    columns[name].append(value)
        if options.limit is not None and len(columns["turn"]) >= options.limit:
            break
    if not columns["turn"] and kept_before_drops:
        raise TraceError(f"{path}: all {len(kept_before_drops)} answered human messages have a prompt or an answer "
                         "of 0 tokens; nothing to convert")
    if not columns["turn"]:
        raise TraceError(f"{path}: no human message with a model answer; nothing to convert")
    if options.limit is not None:
        columns = {name: values[: options.limit] for name, values in columns.items()}
    requests = pl.DataFrame(
        columns,
        schema={"prompt_token_ids": pl.List(pl.Int64), "output_tokens": pl.Int64, "session_id": pl.String,
                "turn": pl.Int64},
    )
    requests = requests.with_columns(
        request_id=pl.int_range(pl.len(), dtype=pl.Int64),
        prompt_tokens=pl.col("prompt_token_ids").list.len().cast(pl.Int64),
        arrival_s=pl.Series(_arrivals_s(requests["turn"].to_numpy(), options)),
    )
    return Converted(requests, kept_before_drops=np.array(kept_before_drops, dtype=np.int64),
                     drop_note="dropped {} turn{s} whose prompt or answer has 0 tokens", arrivals_assigned=True)


def _arrivals_s(turns: np.ndarray, options: ConvertOptions) -> np.ndarray:
    """Arrival of every request: its conversation's Poisson start plus think times."""
    first = np.flatnonzero(turns == 0)
    num_conversations = len(first)
    start_rng, think_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(options.arrival_seed).spawn(2))
    conversation_rate = options.qps * num_conversations / len(turns)
    starts = arrival_times_s(num_conversations, conversation_rate, 1.0, start_rng)
    thinks = gamma_gaps_s(len(turns), options.think_time_s, options.think_time_cv, think_rng, "--think-time-cv")
    thinks[first] = 0.0
    conversation = np.cumsum(turns == 0) - 1
    # cumulative think time within each conversation: global cumsum minus its value at the start
    total = np.cumsum(thinks)
    return starts[conversation] + total - total[first][conversation]
