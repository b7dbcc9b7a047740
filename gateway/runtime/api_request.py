"""A Chat Completions request as the gateway reads it: one parsed :class:`ChatRequest`, or an
:class:`ApiError` naming what is wrong.

    request = parse_chat_request(body)      # raises ApiError(400, ..., param="n")

The request's ``messages`` become the conversation as the client sees it (:class:`ClientMessage`:
user and assistant messages, in order, with the text as the store keeps it), the client's
``system`` (and ``developer``) messages, and its images.  The fields the model should get
(:data:`gateway.model.PASSED_PARAMS`) are checked and kept in ``params``.

This is the one place that reads a request body, so other front doors (a client's own tools, the
Responses API) translate into the same :class:`ChatRequest` and go through the same path.

A client's own ``tools`` are kept in ``tools``.  A request that continues a turn with the results of
its tools ends with ``tool`` messages (after the assistant message that called them): those, and
the tool-call messages since the last user message, are ``continued``
(:mod:`gateway.runtime.api_tools` stores them and the model answers on).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import mimetypes
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import SwitchboardError
from gateway.types import Attachment, attachment_kind

MAX_STOP_SEQUENCES = 4
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
SIDE_REQUEST_PREFIX = "### Task:"  # Open WebUI's title, tag and follow-up prompts
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # as OpenAI accepts a function's name


class ApiError(SwitchboardError):
    """A request the API refuses: an OpenAI-shaped error (``status``, ``message``, ``type``, ``code``, ``param``)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", *, code: str | None = None,
                 param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class ClientMessage:
    """One user or assistant message of the client's conversation."""

    role: str
    text: str  # its text parts, joined by spaces
    images: tuple[Attachment, ...] = ()  # its image_url parts, and its input_audio and file parts

    @property
    def stored(self) -> str:
        """The text as the store keeps it (images named after it)."""
        return stored_text(self.text, self.images)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What a client asked: its conversation, its system messages, how it wants the answer."""

    messages: tuple[ClientMessage, ...]  # user and assistant messages, oldest first; the last is a user's
    system: tuple[str, ...] = ()  # the client's system (and developer) messages, in order
    stream: bool = False
    include_usage: bool = False
    params: dict[str, Any] = field(default_factory=dict)  # for the model: temperature, response_format, ...
    model: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    tools: tuple[dict, ...] = ()  # the client's own function tools, as Chat Completions names them
    # A continuation: the assistant tool-call messages and ``tool`` results after the last user message
    # (store form: {"role": "assistant", "content", "tool_calls"}, {"role": "tool", "tool_call_id",
    # "content"}); the request ends with a result.  Empty for a request that asks something new.
    continued: tuple[dict, ...] = ()
    first_calls: str | None = None  # the first reply, when it was a tool call (``calls_signature``)

    @property
    def new_messages(self) -> tuple[ClientMessage, ...]:
        """The user messages at the end, after the last assistant message: what this request asks."""
        at = len(self.messages)
        while at > 0 and self.messages[at - 1].role == "user":
            at -= 1
        return self.messages[at:]

    @property
    def last_user(self) -> ClientMessage:
        return self.messages[-1]

    @property
    def is_side_request(self) -> bool:
        """Open WebUI's own prompts (a title, tags, follow-ups) sent with the chat's id: not the chat."""
        return not self.continued and self.last_user.text.lstrip().startswith(SIDE_REQUEST_PREFIX)

    @property
    def images(self) -> tuple[Attachment, ...]:
        if self.continued:
            return ()  # the user message's images went with the turn that called the tools
        return tuple(image for m in self.new_messages for image in m.images)


def calls_signature(calls: list[dict] | tuple[dict, ...]) -> str:
    """A tool-call answer as text, for a fingerprint (the first reply of a conversation may be one)."""
    return "[tool calls: " + ", ".join(f"{c.get('function', {}).get('name')}#{c.get('id')}" for c in calls) + "]"


def stored_text(text: str, images: tuple[Attachment, ...]) -> str:
    """A message's text as the store keeps it: attached images named after the text (as
    ``gateway.router`` stores a platform message's attachments)."""
    if not images:
        return text
    names = ", ".join(f"{a.kind}: {a.name}" for a in images)
    return f"{text}\n[attached {names}]" if text else f"[attached {names}]"


def parse_chat_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ApiError(400, "expected a JSON object with a 'messages' list", param="messages")
    n = body.get("n")
    if n is not None and n != 1:
        raise ApiError(400, "'n' must be 1: the gateway answers with one choice", param="n",
                       code="unsupported_value")
    stream, include_usage = _stream_fields(body)
    read = _read_messages(body["messages"])
    continued = _continued(read)
    return ChatRequest(
        messages=tuple(read.messages), system=tuple(read.system), stream=stream,
        include_usage=include_usage, params=_params(body),
        model=_text_field(body, "model"), user=_text_field(body, "user"),
        safety_identifier=_text_field(body, "safety_identifier"),
        prompt_cache_key=_text_field(body, "prompt_cache_key"),
        tools=_tools(body), continued=continued, first_calls=read.first_calls,
    )


@dataclass(slots=True)
class _ReadMessages:
    """A request's ``messages`` as :func:`_read_messages` read them."""

    system: list[str] = field(default_factory=list)  # the system and developer messages' text
    messages: list[ClientMessage] = field(default_factory=list)  # user and assistant messages
    tail: list[dict] = field(default_factory=list)  # tool-call messages and tool results since the last user or answer
    first_calls: str | None = None  # the first reply, when it was a tool call


def _stream_fields(body: dict) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage``, checked: (stream, include usage)."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise ApiError(400, "'stream_options' must be an object such as {\"include_usage\": true}",
                       param="stream_options")
    return stream, stream and bool(options.get("include_usage"))


def _read_messages(raws: list) -> _ReadMessages:
    """Each of a request's ``messages`` checked and sorted: system text, the conversation, the tail of
    tool calls and results (each error names the message's place)."""
    read = _ReadMessages()
    seen_user = replied = False  # a user message came; an assistant message came after the first one
    for i, raw in enumerate(raws):
        where = f"messages[{i}]"
        if not isinstance(raw, dict):
            raise ApiError(400, f"{where} must be an object with a 'role'", param=where)
        role = raw.get("role")
        if role in ("system", "developer"):
            text, _ = _content(raw.get("content"), where, images=False)
            if text.strip():
                read.system.append(text)
        elif role == "user":
            text, images = _content(raw.get("content"), where, images=True)
            read.messages.append(ClientMessage("user", text, images))
            read.tail, seen_user = [], True
        elif role == "assistant":
            text, _ = _content(raw.get("content"), where, images=False)
            if raw.get("tool_calls"):  # kept apart from the conversation as read (see ``continued``)
                calls = _tool_calls(raw["tool_calls"], f"{where}.tool_calls")
                if seen_user and not replied:
                    read.first_calls = calls_signature(calls)
                replied = replied or seen_user
                read.tail.append({"role": "assistant", "content": text or None, "tool_calls": calls})
                continue
            replied = replied or seen_user
            read.messages.append(ClientMessage("assistant", text))
            read.tail = []
        elif role == "tool":
            call_id = raw.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ApiError(400, f"{where}.tool_call_id must name the call this is the result of",
                               param=f"{where}.tool_call_id")
            text, _ = _content(raw.get("content"), where, images=False)
            read.tail.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif role == "function":
            continue  # the deprecated function-call form: not read
        else:
            raise ApiError(400, f"{where}.role must be system, developer, user, assistant or tool, not {role!r}",
                           param=f"{where}.role")
    return read


def _continued(read: _ReadMessages) -> tuple[dict, ...]:
    """What the request continues (its tail, when it ends with a tool result), after checking the
    request ends with something to answer."""
    tail, messages = read.tail, read.messages
    continued = tuple(tail) if tail and tail[-1]["role"] == "tool" else ()
    if tail and not continued:
        raise ApiError(400, "the assistant's tool calls at the end of 'messages' have no results: send a 'tool' "
                            "message with each call's result after it", param="messages")
    if not continued and (not messages or messages[-1].role != "user"):
        raise ApiError(400, "no user message with text content at the end of 'messages'", param="messages")
    if not continued and not messages[-1].text.strip() and not messages[-1].images:
        raise ApiError(400, "the last user message is only whitespace: send some text", param="messages")
    return continued


def _tools(body: dict) -> tuple[dict, ...]:
    """The client's function tools, checked (each error names the tool's place)."""
    tools = body.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function tools", param="tools")
    found: list[dict] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise ApiError(400, f"{where} must be a function tool: {{\"type\": \"function\", \"function\": "
                                "{\"name\": ..., \"parameters\": {...}}}", param=where)
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ApiError(400, f"{where}.function.name must be 1-64 letters, digits, '_' or '-'",
                           param=f"{where}.function.name")
        if name in names:
            raise ApiError(400, f"the tool {name!r} is given twice in 'tools'", param=f"{where}.function.name")
        if not isinstance(function.get("parameters", {}), dict):
            raise ApiError(400, f"{where}.function.parameters must be a JSON schema object",
                           param=f"{where}.function.parameters")
        names.add(name)
        found.append({"type": "function", "function": {k: function[k] for k in
                                                        ("name", "description", "parameters", "strict")
                                                        if function.get(k) is not None}})
    return tuple(found)


def _tool_calls(value: Any, where: str) -> list[dict]:
    """An assistant message's tool calls, in the form the store and the model get them."""
    if not isinstance(value, list):
        raise ApiError(400, f"{where} must be a list of calls", param=where)
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str) or not call["id"] or \
                not isinstance(function.get("name"), str):
            raise ApiError(400, f"{at} must be a call: {{\"id\": ..., \"type\": \"function\", \"function\": "
                                "{\"name\": ..., \"arguments\": \"...\"}}}", param=at)
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append({"id": call["id"], "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})
    return calls


def _text_field(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise ApiError(400, f"'{name}' must be a string of at most 256 characters", param=name)
    return value


def _content(content: Any, where: str, *, images: bool) -> tuple[str, tuple[Attachment, ...]]:
    """A message's text (its text parts joined by spaces) and, for a user message, its images."""
    if content is None:
        return "", ()
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of parts", param=f"{where}.content")
    texts: list[str] = []
    found: list[Attachment] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url" and images:
            found.append(_image(part.get("image_url"), at))
        elif kind == "input_audio" and images:
            found.append(_audio(part.get("input_audio"), at))
        elif kind == "file" and images:
            found.append(_file(part.get("file"), at))
        else:
            raise ApiError(400, f"{at} is not a part the gateway reads (text parts, and image_url, input_audio and "
                                "file parts in a user message)", param=at)
    return " ".join(texts), tuple(found)


def _image(value: Any, where: str) -> Attachment:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"{where}.image_url must hold a 'url'", param=where)
    name = "image-" + hashlib.sha256(url.encode()).hexdigest()[:12]
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        mime = head[5:].split(";")[0] or "image/png"
        if ";base64" not in head:
            raise ApiError(400, f"{where}: a data URL image must be base64", param=where)
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, f"{where}: the image's base64 data does not decode", param=where) from None
        return Attachment("image", name + (mimetypes.guess_extension(mime) or ""), mime_type=mime,
                          size=len(decoded), data=decoded)
    if not url.startswith(("http://", "https://")):
        raise ApiError(400, f"{where}: an image URL must be http(s) or a data URL", param=where)
    return Attachment("image", name, url=url)


#: ``input_audio.format`` values and the type each is stored as
AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "ogg": "audio/ogg", "flac": "audio/flac",
                 "m4a": "audio/mp4", "webm": "audio/webm"}


def _decoded(data: Any, where: str, what: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise ApiError(400, f"{where}: the {what} must be base64 text", param=where)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where}: the {what}'s base64 data does not decode", param=where) from None


def _audio(value: Any, where: str) -> Attachment:
    """An ``input_audio`` part (``{"data": base64, "format": "wav"}``): an audio attachment."""
    if not isinstance(value, dict):
        raise ApiError(400, f"{where}.input_audio must hold 'data' and 'format'", param=where)
    fmt = value.get("format")
    if fmt not in AUDIO_FORMATS:
        raise ApiError(400, f"{where}.input_audio.format must be one of {', '.join(AUDIO_FORMATS)}", param=where)
    decoded = _decoded(value.get("data"), where, "audio")
    name = f"audio-{hashlib.sha256(decoded).hexdigest()[:12]}.{fmt}"
    return Attachment("audio", name, mime_type=AUDIO_FORMATS[fmt], size=len(decoded), data=decoded)


def _file(value: Any, where: str) -> Attachment:
    """A ``file`` part (``{"file_data": "data:application/pdf;base64,...", "filename": "q3.pdf"}``): a document
    (or a picture or audio, by its type).  A ``file_id`` names an upload this gateway never had: refused."""
    if not isinstance(value, dict) or not isinstance(value.get("file_data"), str):
        raise ApiError(400, f"{where}.file must hold 'file_data' (a data URL) and 'filename'; uploaded file ids "
                            "are not kept by this gateway", param=where)
    head, _, data = value["file_data"].partition(",")
    if not head.startswith("data:") or ";base64" not in head:
        raise ApiError(400, f"{where}.file.file_data must be a base64 data URL", param=where)
    mime = head[5:].split(";")[0] or "application/octet-stream"
    decoded = _decoded(data, where, "file")
    given = value.get("filename")
    name: str = given if isinstance(given, str) and given else \
        "file-" + hashlib.sha256(decoded).hexdigest()[:12] + (mimetypes.guess_extension(mime) or "")
    return Attachment(attachment_kind(mime, name), name[:200], mime_type=mime, size=len(decoded), data=decoded)


def _params(body: dict) -> dict[str, Any]:
    """The request's fields for the model, checked (each error names its field)."""
    params: dict[str, Any] = {}
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ApiError(400, f"'{name}' must be a number from {low:g} to {high:g}", param=name)
        params[name] = value
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ApiError(400, f"'{name}' must be a positive whole number", param=name)
        params[name] = value
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not 0 < len(stops) <= MAX_STOP_SEQUENCES or \
                not all(isinstance(s, str) and s for s in stops):
            raise ApiError(400, f"'stop' must be a string or a list of 1-{MAX_STOP_SEQUENCES} strings", param="stop")
        params["stop"] = stop
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ApiError(400, "'seed' must be a whole number", param="seed")
        params["seed"] = seed
    response_format = body.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict) or response_format.get("type") not in RESPONSE_FORMATS:
            raise ApiError(400, "'response_format' must be an object whose type is text, json_object or json_schema",
                           param="response_format")
        if response_format["type"] == "json_schema" and not isinstance(response_format.get("json_schema"), dict):
            raise ApiError(400, "'response_format' of type json_schema needs a 'json_schema' object",
                           param="response_format")
        params["response_format"] = response_format
    tool_choice = body.get("tool_choice")
    if tool_choice is not None:
        if not (tool_choice in ("none", "auto", "required") or isinstance(tool_choice, dict)):
            raise ApiError(400, "'tool_choice' must be none, auto, required or an object naming a tool",
                           param="tool_choice")
        params["tool_choice"] = tool_choice
    return params
