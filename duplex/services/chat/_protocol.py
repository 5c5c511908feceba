"""The chat completion requests and answers, sans I/O: OpenAI's wire, checked field by field.

`parse_chat` turns the body of ``POST /v1/chat/completions`` into a `ChatCompletion`,
`parse_batch` the body of ``POST /v1/chat/completions/batch`` into a `ChatBatch`; both
return a `Refusal` naming the field instead (unknown fields are refused, never ignored:
a misspelt ``max_token`` would otherwise run with no limit). vLLM's extension
parameters (``top_k``, ``min_p``, ...) are taken at the top level (the ``openai`` SDK
merges its ``extra_body`` there) or inside an ``extra_body`` object; one given twice, by
either route or as a repeated JSON key, is refused by name.

Images come only as data URLs (``data:image/png;base64,...``): nothing is fetched. Every
size has a bound checked before the work it bounds (the body, the parts, an image's
base64 before it is decoded), so hostile input costs at most the bytes read.

`Choice` gathers one choice's deltas into its message; `chunk`, `completion_body` and
`usage_chunk` write the answers. Nothing here touches a socket or a clock.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

from duplex.exceptions import ProtocolError
from duplex.models.agent import (
    ChatPart,
    ChatRequest,
    ChatTurn,
    ReplyDelta,
    ResponseFormat,
    Sampling,
    ToolCall,
    ToolSpec,
)
from duplex.refusals import Refusal, echo

from .._models import CHAT

__all__ = [
    "EXTENSION_PARAMETERS",
    "MAX_BATCH_CONVERSATIONS",
    "MAX_CHAT_BODY",
    "MAX_CONTENT_PARTS",
    "MAX_IMAGE_BYTES",
    "MAX_MESSAGES",
    "MAX_N",
    "ChatBatch",
    "ChatCompletion",
    "Choice",
    "ModelInfo",
    "chunk",
    "completion_body",
    "parse_batch",
    "parse_chat",
    "usage_chunk",
]

MAX_CHAT_BODY: Final = 32 * 1024 * 1024
"""The largest body read (images come inline, base64)."""
MAX_MESSAGES: Final = 1024
"""The most messages one conversation holds."""
MAX_CONTENT_PARTS: Final = 512
"""The most content parts of one request, all messages together (a batch: each
conversation)."""
MAX_TEXT_CHARS: Final = 1024 * 1024
"""The most characters of text one conversation holds (the model's context bounds it
further; the engine refuses a prompt past it)."""
MAX_IMAGE_BYTES: Final = 8 * 1024 * 1024
"""The largest image, decoded (its base64 is checked before it is decoded)."""
MAX_N: Final = 8
"""The most choices one request asks for."""
MAX_TOOLS: Final = 128
MAX_STOP: Final = 4
"""OpenAI's limit on ``stop`` strings."""
MAX_TOKENS: Final = 1 << 20
MAX_BATCH_CONVERSATIONS: Final = 64
"""The most conversations one ``/v1/chat/completions/batch`` takes."""

IMAGE_TYPES: Final = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/webp": (b"RIFF",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}
"""The image types a data URL may carry, by their first bytes."""

ROLES: Final = ("system", "developer", "user", "assistant", "tool")

EXTENSION_PARAMETERS: Final = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
)
"""vLLM's sampling extensions this server takes (top level or in ``extra_body``)."""

_OPENAI: Final = (
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "stop", "seed", "n", "tools", "tool_choice", "response_format",
    "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "user",
    "parallel_tool_calls", "extra_body",
)  # fmt: skip
_NOT_IN_BATCH: Final = {
    "stream": "streaming",
    "stream_options": "streaming",
    "tools": "tools",
    "tool_choice": "tools",
    "use_beam_search": "beam search",
}


@final
@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the loaded model takes: the names it answers to, images and how many."""

    names: tuple[str, ...]
    multimodal: bool = False
    max_images: int = 0


@final
@dataclass(frozen=True, slots=True)
class ChatCompletion:
    """One parsed ``POST /v1/chat/completions``."""

    request: ChatRequest
    model: str
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    parallel_tool_calls: bool = True


@final
@dataclass(frozen=True, slots=True)
class ChatBatch:
    """One parsed ``POST /v1/chat/completions/batch``: one request per conversation."""

    requests: tuple[ChatRequest, ...]
    model: str


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _bad(
    message: str, param: str | None, code: str = "invalid_value", status: int = 400
) -> _Refused:
    return _Refused(Refusal(status, message, code, param))


def parse_chat(body: bytes, model: ModelInfo) -> ChatCompletion | Refusal:
    """The body of ``POST /v1/chat/completions``, or the refusal naming what is wrong."""
    try:
        fields = _fields(body)
        request = _request(fields, model, fields.get("messages"), "messages")
        stream = _bool(fields, "stream", False)
        options = fields.get("stream_options")
        include_usage = False
        if options is not None:
            if not stream:
                raise _bad("stream_options is only allowed with stream: true.", "stream_options")
            include_usage = _stream_options(options)
        n = _int(fields, "n", 1, 1, MAX_N)
        if n > 1 and request.sampling.temperature == 0:
            pass  # greedy choices are identical, as OpenAI's; allowed
        return ChatCompletion(
            request,
            _model(fields, model),
            n=n,
            stream=stream,
            include_usage=include_usage,
            parallel_tool_calls=_bool(fields, "parallel_tool_calls", True),
        )
    except _Refused as refused:
        return refused.refusal


def parse_batch(body: bytes, model: ModelInfo) -> ChatBatch | Refusal:
    """The body of ``POST /v1/chat/completions/batch`` (``messages``: a list of
    conversations), or the refusal naming what is wrong."""
    try:
        fields = _fields(body, batch=True)
        if "n" in fields and fields["n"] != 1:
            raise _bad(
                "n: the batch endpoint answers one choice per conversation.",
                "n",
                "unsupported_parameter",
            )
        conversations = fields.get("messages")
        if not isinstance(conversations, list) or not conversations:
            raise _bad(
                "messages must be a non-empty list of conversations (each a list of messages).",
                "messages",
                "invalid_type",
            )
        if len(conversations) > MAX_BATCH_CONVERSATIONS:
            raise _bad(
                f"messages holds {len(conversations)} conversations; at most "
                f"{MAX_BATCH_CONVERSATIONS}.",
                "messages",
            )
        requests = tuple(
            _request(fields, model, conversation, f"messages[{i}]")
            for i, conversation in enumerate(conversations)
        )
        return ChatBatch(requests, _model(fields, model))
    except _Refused as refused:
        return refused.refusal


# ---- the body -------------------------------------------------------------------------


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _bad(f"{key} is given twice.", key, "duplicate_parameter")
        seen[key] = value
    return seen


def _fields(body: bytes, *, batch: bool = False) -> dict[str, Any]:
    """The body's fields, ``extra_body`` merged in (a name given twice refused); ``batch``:
    what the batch endpoint cannot do refused first, saying so."""
    if len(body) > MAX_CHAT_BODY:
        raise _bad(f"The body is over {MAX_CHAT_BODY} bytes.", None, "body_too_large", 413)
    try:
        fields = json.loads(body, object_pairs_hook=_no_repeats)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, _Refused):
            raise
        raise _bad(f"The body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(fields, dict):
        raise _bad("The body must be a JSON object.", None, "invalid_json")
    extra = fields.pop("extra_body", None)
    if extra is not None:
        if not isinstance(extra, dict):
            raise _bad("extra_body must be an object.", "extra_body", "invalid_type")
        for key, value in extra.items():
            if key in fields:
                raise _bad(
                    f"{key} is given twice (at the top level and in extra_body).",
                    key,
                    "duplicate_parameter",
                )
            if key not in EXTENSION_PARAMETERS:
                raise _bad(
                    f"extra_body.{key} is not a parameter this server takes (it takes "
                    f"{', '.join(EXTENSION_PARAMETERS)}).",
                    f"extra_body.{key}",
                    "unknown_parameter",
                )
            fields[key] = value
    for name, what in _NOT_IN_BATCH.items() if batch else ():
        if name in fields and not (name == "stream" and fields[name] is False):
            raise _bad(
                f"{name}: the batch endpoint takes no {what} (use /v1/chat/completions).",
                name,
                "unsupported_parameter",
            )
    for key in fields:
        if key not in _OPENAI and key not in EXTENSION_PARAMETERS:
            if key in ("use_beam_search", "best_of", "audio", "modalities", "prediction"):
                raise _bad(f"{key} is not supported.", key, "unsupported_parameter")
            raise _bad(f"Unknown parameter: {echo(key)}.", key, "unknown_parameter")
    return fields  # type: ignore[no-any-return]


def _model(fields: Mapping[str, Any], model: ModelInfo) -> str:
    """The checkpoint's name as the client wrote it (no alias: ``duplex.services._models``)."""
    try:
        name = CHAT.accepted(fields.get("model"), model.names)
    except ProtocolError as exc:
        raise _Refused(Refusal.of(exc)) from None
    assert name is not None  # CHAT requires one
    return name


def _request(
    fields: Mapping[str, Any], model: ModelInfo, messages: object, where: str
) -> ChatRequest:
    turns = _turns(messages, model, where)
    tools = _tools(fields.get("tools"))
    choice = _tool_choice(fields.get("tool_choice"), tools)
    if fields.get("logprobs") not in (None, False) or fields.get("top_logprobs") is not None:
        raise _bad("logprobs is not supported yet.", "logprobs", "unsupported_parameter")
    return ChatRequest(
        turns,
        _sampling(fields),
        tools=tools,
        tool_choice=choice,
        response_format=_response_format(fields.get("response_format")),
    )


# ---- messages -------------------------------------------------------------------------


def _turns(messages: object, model: ModelInfo, where: str) -> tuple[ChatTurn, ...]:
    if not isinstance(messages, list) or not messages:
        raise _bad(f"{where} must be a non-empty list of messages.", where, "invalid_type")
    if len(messages) > MAX_MESSAGES:
        raise _bad(f"{where} holds {len(messages)} messages; at most {MAX_MESSAGES}.", where)
    budget = _Budget(model, where)
    return tuple(_turn(m, f"{where}[{i}]", budget) for i, m in enumerate(messages))


@dataclass(slots=True)
class _Budget:
    """What one conversation may still hold: parts, images, text."""

    model: ModelInfo
    where: str
    parts: int = 0
    images: int = 0
    chars: int = 0

    def part(self, param: str) -> None:
        self.parts += 1
        if self.parts > MAX_CONTENT_PARTS:
            raise _bad(f"{self.where} holds more than {MAX_CONTENT_PARTS} content parts.", param)

    def text(self, text: str, param: str) -> None:
        self.chars += len(text)
        if self.chars > MAX_TEXT_CHARS:
            raise _bad(f"{self.where} holds more than {MAX_TEXT_CHARS} characters.", param)

    def image(self, param: str) -> None:
        if not self.model.multimodal:
            raise _bad(
                f"{param}: the loaded model takes no images (it is a text-only model).",
                param,
                "image_input_not_supported",
            )
        self.images += 1
        if self.images > self.model.max_images:
            raise _bad(f"{param}: at most {self.model.max_images} images per conversation.", param)


def _turn(message: object, where: str, budget: _Budget) -> ChatTurn:
    if not isinstance(message, dict):
        raise _bad(f"{where} must be an object.", where, "invalid_type")
    role = message.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role must be one of {', '.join(ROLES)}.", f"{where}.role")
    allowed = {"role", "content", "name"}
    if role == "assistant":
        allowed |= {"tool_calls", "refusal"}
    if role == "tool":
        allowed.add("tool_call_id")
    for key in message:
        if key not in allowed:
            raise _bad(
                f"Unknown parameter: {where}.{echo(key)} (role {role}).",
                f"{where}.{key}",
                "unknown_parameter",
            )
    name = message.get("name", "")
    if not isinstance(name, str):
        raise _bad(f"{where}.name must be a string.", f"{where}.name", "invalid_type")
    calls = _calls(message.get("tool_calls"), f"{where}.tool_calls")
    content = message.get("content")
    if content is None and not (role == "assistant" and (calls or "content" in message)):
        raise _bad(
            f"{where}.content is required.", f"{where}.content", "missing_required_parameter"
        )
    parts = _parts(content, role, f"{where}.content", budget)
    call_id = ""
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(
                f"{where}.tool_call_id is required (a string).",
                f"{where}.tool_call_id",
                "missing_required_parameter",
            )
    return ChatTurn(
        "system" if role == "developer" else role, parts, calls, tool_call_id=call_id, name=name
    )


def _parts(content: object, role: str, where: str, budget: _Budget) -> tuple[ChatPart, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        budget.part(where)
        budget.text(content, where)
        return (ChatPart("text", content),)
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of parts.", where, "invalid_type")
    parts = []
    for j, part in enumerate(content):
        param = f"{where}[{j}]"
        budget.part(param)
        if not isinstance(part, dict):
            raise _bad(f"{param} must be an object.", param, "invalid_type")
        kind = part.get("type")
        if kind == "text":
            _only(part, ("type", "text"), param)
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{param}.text must be a string.", f"{param}.text", "invalid_type")
            budget.text(text, param)
            parts.append(ChatPart("text", text))
        elif kind == "image_url":
            _only(part, ("type", "image_url"), param)
            if role != "user":
                raise _bad(f"{param}: only user messages carry images.", param)
            budget.image(f"{param}.image_url")
            parts.append(
                ChatPart("image", image=_image(part.get("image_url"), f"{param}.image_url"))
            )
        elif kind == "refusal" and role == "assistant":
            text = part.get("refusal")
            if not isinstance(text, str):
                raise _bad(f"{param}.refusal must be a string.", f"{param}.refusal", "invalid_type")
            parts.append(ChatPart("text", text))
        elif kind in ("input_audio", "file", "video_url", "audio_url"):
            raise _bad(
                f"{param}: {kind} parts are not supported (text and image_url are).",
                param,
                "unsupported_parameter",
            )
        else:
            raise _bad(
                f"{param}.type must be text or image_url, not {echo(kind)}.", f"{param}.type"
            )
    return tuple(parts)


def _only(part: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    for key in part:
        if key not in keys:
            raise _bad(
                f"Unknown parameter: {where}.{echo(key)}.", f"{where}.{key}", "unknown_parameter"
            )


def _image(value: object, where: str) -> bytes:
    """A data URL's image bytes: its type and size checked before it is decoded."""
    url = value.get("url") if isinstance(value, dict) else value
    if isinstance(value, dict):
        _only(value, ("url", "detail"), where)
        if value.get("detail", "auto") not in ("auto", "low", "high"):
            raise _bad(f"{where}.detail must be auto, low or high.", f"{where}.detail")
    if not isinstance(url, str):
        raise _bad(f"{where}.url must be a string.", f"{where}.url", "invalid_type")
    if not url.startswith("data:"):
        raise _bad(
            f"{where}.url: only data URLs are taken (data:image/png;base64,...); this server "
            "fetches nothing.",
            f"{where}.url",
            "invalid_image_url",
        )
    head, comma, data = url.partition(",")
    if not comma or not head.endswith(";base64"):
        raise _bad(
            f"{where}.url: a data URL must be base64 (data:<type>;base64,<data>).",
            f"{where}.url",
            "invalid_image_url",
        )
    media = head[5 : -len(";base64")].lower()
    if media not in IMAGE_TYPES:
        raise _bad(
            f"{where}.url: the image type must be one of {', '.join(IMAGE_TYPES)}, not "
            f"{echo(media)}.",
            f"{where}.url",
            "invalid_image_url",
        )
    if len(data) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
        raise _bad(
            f"{where}.url: the image is over {MAX_IMAGE_BYTES} bytes.",
            f"{where}.url",
            "image_too_large",
        )
    try:
        image = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(
            f"{where}.url: the data is not valid base64.", f"{where}.url", "invalid_image_url"
        ) from None
    if not any(image.startswith(magic) for magic in IMAGE_TYPES[media]):
        raise _bad(
            f"{where}.url: the data is not a {media} image.", f"{where}.url", "invalid_image"
        )
    return image


def _calls(value: object, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list.", where, "invalid_type")
    calls = []
    for i, call in enumerate(value):
        param = f"{where}[{i}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise _bad(f"{param} must be a function call object.", param, "invalid_type")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _bad(f"{param}.function must be an object.", f"{param}.function", "invalid_type")
        name, arguments, call_id = function.get("name"), function.get("arguments"), call.get("id")
        if (
            not isinstance(name, str)
            or not isinstance(arguments, str)
            or not isinstance(call_id, str)
        ):
            raise _bad(
                f"{param} needs id, function.name and function.arguments (strings).",
                param,
                "invalid_type",
            )
        try:
            json.loads(arguments)
        except ValueError:
            raise _bad(
                f"{param}.function.arguments is not JSON.", f"{param}.function.arguments"
            ) from None
        calls.append(ToolCall(call_id, name, arguments))
    return tuple(calls)


# ---- tools and formats ----------------------------------------------------------------


def _tools(value: object) -> tuple[ToolSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad("tools must be a list.", "tools", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise _bad(f"tools holds {len(value)} tools; at most {MAX_TOOLS}.", "tools")
    specs = []
    names = set()
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _bad(
                f'{param} must be {{"type": "function", "function": {{...}}}}.',
                param,
                "invalid_type",
            )
        _only(tool, ("type", "function"), param)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _bad(f"{param}.function must be an object.", f"{param}.function", "invalid_type")
        _only(function, ("name", "description", "parameters", "strict"), f"{param}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise _bad(
                f"{param}.function.name must be a string of 1-64 characters.",
                f"{param}.function.name",
            )
        if name in names:
            raise _bad(f"{param}.function.name: {name!r} is given twice.", f"{param}.function.name")
        names.add(name)
        description = function.get("description", "")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise _bad(
                f"{param}.function: description must be a string, parameters an object.",
                f"{param}.function",
                "invalid_type",
            )
        specs.append(ToolSpec(name, description, json.dumps(parameters)))
    return tuple(specs)


def _tool_choice(value: object, tools: Sequence[ToolSpec]) -> str:
    if value is None:
        return "auto" if tools else "none"
    if value in ("none", "auto"):
        return str(value)
    if value == "required":
        raise _bad(
            "tool_choice 'required' is not supported yet (use auto, none, or a named function).",
            "tool_choice",
            "unsupported_parameter",
        )
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not any(t.name == name for t in tools):
            raise _bad(f"tool_choice names {echo(name)}, which is not among tools.", "tool_choice")
        return str(name)
    raise _bad(
        'tool_choice must be none, auto, or {"type": "function", "function": {"name": ...}}.',
        "tool_choice",
    )


def _response_format(value: object) -> ResponseFormat | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("response_format must be an object.", "response_format", "invalid_type")
    kind = value.get("type")
    if kind == "text":
        _only(value, ("type",), "response_format")
        return None
    if kind == "json_object":
        _only(value, ("type",), "response_format")
        return ResponseFormat("json_object")
    if kind == "json_schema":
        _only(value, ("type", "json_schema"), "response_format")
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _bad(
                "response_format.json_schema needs a name.",
                "response_format.json_schema",
                "invalid_type",
            )
        _only(spec, ("name", "schema", "strict", "description"), "response_format.json_schema")
        if not isinstance(schema, dict):
            raise _bad(
                "response_format.json_schema.schema must be an object.",
                "response_format.json_schema.schema",
                "invalid_type",
            )
        return ResponseFormat("json_schema", json.dumps(schema))
    raise _bad(
        "response_format.type must be text, json_object or json_schema.", "response_format.type"
    )


# ---- sampling -------------------------------------------------------------------------


def _sampling(fields: Mapping[str, Any]) -> Sampling:
    if "max_tokens" in fields and "max_completion_tokens" in fields:
        raise _bad(
            "Give max_completion_tokens or max_tokens, not both.",
            "max_tokens",
            "duplicate_parameter",
        )
    limit_name = "max_completion_tokens" if "max_completion_tokens" in fields else "max_tokens"
    max_tokens = _int(fields, limit_name, None, 1, MAX_TOKENS)
    min_tokens = _int(fields, "min_tokens", 0, 0, MAX_TOKENS)
    if max_tokens is not None and min_tokens > max_tokens:
        raise _bad(f"min_tokens ({min_tokens}) is over {limit_name} ({max_tokens}).", "min_tokens")
    return Sampling(
        max_tokens=max_tokens,
        temperature=_float(fields, "temperature", 1.0, 0.0, 2.0),
        top_p=_float(fields, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=_top_k(fields),
        min_p=_float(fields, "min_p", 0.0, 0.0, 1.0),
        seed=_int(fields, "seed", None, -(1 << 63), (1 << 63) - 1),
        stop=_stop(fields.get("stop")),
        stop_token_ids=_ids(fields.get("stop_token_ids")),
        presence_penalty=_float(fields, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_float(fields, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_float(fields, "repetition_penalty", 1.0, 0.0, 2.0, low_open=True),
        min_tokens=min_tokens,
        ignore_eos=_bool(fields, "ignore_eos", False),
    )


def _top_k(fields: Mapping[str, Any]) -> int:
    value = _int(fields, "top_k", 0, -1, 1 << 20)
    return 0 if value == -1 else int(value)  # vLLM: -1 and 0 both mean off


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop must be a string or a list of non-empty strings.", "stop", "invalid_type")
    if len(stops) > MAX_STOP:
        raise _bad(f"stop holds {len(stops)} strings; at most {MAX_STOP}.", "stop")
    if any(len(s) > 256 for s in stops):
        raise _bad("a stop string is over 256 characters.", "stop")
    return tuple(stops)


def _ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > 64
        or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 31) for v in value
        )
    ):
        raise _bad("stop_token_ids must be a list of at most 64 token ids.", "stop_token_ids")
    return tuple(value)


def _stream_options(value: object) -> bool:
    if not isinstance(value, dict):
        raise _bad("stream_options must be an object.", "stream_options", "invalid_type")
    _only(value, ("include_usage",), "stream_options")
    usage = value.get("include_usage", False)
    if not isinstance(usage, bool):
        raise _bad(
            "stream_options.include_usage must be a boolean.",
            "stream_options.include_usage",
            "invalid_type",
        )
    return usage


def _bool(fields: Mapping[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"{name} must be a boolean.", name, "invalid_type")
    return value


def _int(fields: Mapping[str, Any], name: str, default: Any, low: int, high: int) -> Any:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer.", name, "invalid_type")
    if not low <= value <= high:
        raise _bad(f"{name} must be in [{low}, {high}], not {value}.", name)
    return value


def _float(
    fields: Mapping[str, Any],
    name: str,
    default: float,
    low: float,
    high: float,
    *,
    low_open: bool = False,
) -> float:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{name} must be a number.", name, "invalid_type")
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise _bad(f"{name} must be in {bracket}{low:g}, {high:g}], not {value}.", name)
    return float(value)


# ---- answers --------------------------------------------------------------------------


@dataclass(slots=True)
class Choice:
    """One choice's deltas gathered into its message, and its stream chunks' deltas."""

    index: int
    only_first_call: bool = False
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    finish: str | None = None
    _by_id: dict[str, int] = field(default_factory=dict)

    def add(self, delta: ReplyDelta) -> dict[str, Any] | None:
        """Take one delta; the chunk ``delta`` object it makes, if any."""
        if delta.finish is not None:
            self.finish = delta.finish
            if delta.finish == "tool_calls" and not self.calls:
                self.finish = "stop"
        if not delta.call_name:
            if not delta.text:
                return None
            self.text += delta.text
            return {"content": delta.text}
        index = self._by_id.get(delta.call_id)
        if index is None:
            if self.only_first_call and self.calls:
                return None
            index = self._by_id[delta.call_id] = len(self.calls)
            function = {"name": delta.call_name, "arguments": delta.text}
            self.calls.append({"id": delta.call_id, "type": "function", "function": function})
            return {
                "tool_calls": [
                    {
                        "index": index,
                        "id": delta.call_id,
                        "type": "function",
                        "function": dict(function),
                    }
                ]
            }
        if not delta.text:
            return None
        self.calls[index]["function"]["arguments"] += delta.text
        return {"tool_calls": [{"index": index, "function": {"arguments": delta.text}}]}

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.calls:
            message["tool_calls"] = self.calls
        elif message["content"] is None:
            message["content"] = ""
        return message

    def body(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "message": self.message(),
            "logprobs": None,
            "finish_reason": self.finish or "stop",
        }


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(
    id_: str, created: int, model: str, choices: Iterable[Choice], prompt: int, completion: int
) -> dict[str, Any]:
    """A whole ``chat.completion``."""
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [c.body() for c in choices],
        "usage": _usage(prompt, completion),
    }


def chunk(
    id_: str,
    created: int,
    model: str,
    index: int,
    delta: Mapping[str, Any],
    finish: str | None = None,
    *,
    include_usage: bool = False,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` for choice ``index``."""
    body: dict[str, Any] = {
        "id": id_,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "delta": dict(delta), "logprobs": None, "finish_reason": finish}
        ],
    }
    if include_usage:
        body["usage"] = None
    return body


def usage_chunk(id_: str, created: int, model: str, prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk of a stream that asked for usage: no choices, the whole usage."""
    return {
        "id": id_,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": _usage(prompt, completion),
    }
