"""How a local API answer is written out: one :class:`Answer`, rendered by a :class:`Format`.

The request path is the same for every front door: a body is read into one
:class:`~gateway.runtime.api_request.ChatRequest`, answered by one turn (or from the store, or
unstored for a side request), and the outcome is one :class:`Answer`.  A :class:`Format` turns it
into the wire shape: a whole JSON body, or a stream of events (:class:`Events`) fed as the model
writes.  :class:`ChatCompletions` is the Chat Completions shape (``chat.completion`` and
``chat.completion.chunk`` Server-Sent Events); the Responses API is another Format
(:class:`gateway.runtime.responses.ResponsesFormat`).

An answer that calls the client's own tools holds the calls (``tool_calls``, OpenAI's form) and ends
with ``finish_reason`` ``"tool_calls"``; its ``content`` is the text the model wrote before them.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from gateway.runtime.sse import ChunkEvents, usage_of


@dataclass(slots=True)
class Answer:
    """What one completion says, and where it belongs."""

    content: str
    session_id: str
    session_key: str
    idempotency_key: str | None
    created: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    notices: list[str] = field(default_factory=list)  # sent beside the content, never in it
    finish_reason: str = "stop"  # "tool_calls": the answer ends with calls of the client's tools
    tool_calls: list[dict] = field(default_factory=list)  # those calls, for the client to run
    model: str | None = None  # the model that answered (None: the configured one's name is shown)

    def response_id(self) -> str:
        """A new id, or (with an Idempotency-Key) the same one for a replay of the same request."""
        if self.idempotency_key is None:
            return uuid.uuid4().hex[:24]
        return hashlib.sha256(f"{self.session_key}\0{self.idempotency_key}".encode()).hexdigest()[:24]


class Events(Protocol):
    """One streamed answer on the wire; a client that left is noted (``gone``), never raised."""

    gone: bool

    async def start(self) -> None:
        """The stream's opening (the assistant's role)."""

    async def content(self, text: str) -> None: ...

    async def comment(self, line: str) -> None:
        """A line the client's parser skips (a tool's status, a notice)."""

    async def finish(self, answer: Answer, include_usage: bool) -> None:
        """The end of the answer: its finish reason, and its usage when asked for."""

    async def error(self, message: str, kind: str, code: str | None) -> None:
        """A failure after the stream began (the openai SDK raises it)."""

    async def close(self) -> web.StreamResponse: ...


class Format(Protocol):
    def body(self, answer: Answer) -> dict:
        """The whole answer as one JSON body."""

    async def open(self, request: web.Request, answer: Answer, headers: dict) -> Events:
        """A stream of the answer (``answer`` holds what is known when it starts: ids, session)."""

    async def kept(self, answer: Answer) -> None:
        """The turn's answer is stored (in ``answer.session_id``); called before it is written out, for
        what the format keeps of it (the Responses API: its response id, for ``previous_response_id``)."""


class ChatCompletions:
    """The Chat Completions shape: ``chat.completion``, or ``chat.completion.chunk`` events."""

    def __init__(self, model_name: str):
        self.model_name = model_name

    def _head(self, answer: Answer, kind: str) -> dict:
        return {"id": f"chatcmpl-{answer.response_id()}", "object": kind, "created": int(answer.created),
                "model": answer.model or self.model_name}

    def body(self, answer: Answer) -> dict:
        return {
            **self._head(answer, "chat.completion"),
            "choices": [{"index": 0, "message": message_of(answer.content, answer.tool_calls),
                         "finish_reason": answer.finish_reason}],
            "usage": usage_of(answer.prompt_tokens, answer.completion_tokens),
            "session_id": answer.session_id,
            "session_key": answer.session_key,
        }

    async def open(self, request: web.Request, answer: Answer, headers: dict) -> Events:
        base = {**self._head(answer, "chat.completion.chunk"), "session_id": answer.session_id,
                "session_key": answer.session_key}
        return await ChunkEvents.open(request, base, headers)

    async def kept(self, answer: Answer) -> None:
        return None


def message_of(content: str, calls: list[dict]) -> dict:
    """The answer as a Chat Completions ``message`` (with its calls of the client's tools, if any)."""
    if not calls:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": content or None, "tool_calls": calls}
