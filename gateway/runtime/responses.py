"""``POST /v1/responses``: the Responses API (the Codex CLI's only API, the OpenAI Agents SDK's default),
translated into the same :class:`~gateway.runtime.api_request.ChatRequest` and answered by the same
turn as ``/v1/chat/completions``; only the answer's shape differs (:class:`ResponseShape`, and its
event stream :class:`ResponseEvents`).

Which conversation a request continues:

- ``previous_response_id``: the conversation that response belongs to; the gateway keeps its history,
  so ``input`` holds only what is new (a user message, ``function_call_output`` items).
- ``conversation`` (an id, or ``{"id": ...}``): a conversation the gateway keeps under that id (per
  ``user``); ``input`` holds what is new.
- A Codex ``session_id`` header: like Open WebUI's chat id, the client keeps the history and sends
  it all (as the Codex CLI does), lined up with the stored one as for chat completions.
- None of these: ``X-Session-Key``, ``user`` and the fingerprint, as for chat completions.

Each response's id is recorded (routing key ``agent:<agent>:api:resp:<id>``) with the session it
was answered in, before the answer is sent, so a ``previous_response_id`` always finds it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web

import state
from gateway.keys import api_conversation_key
from gateway.router import Ticket
from gateway.runtime import api_tools
from gateway.runtime.api_request import ApiError, ChatRequest, parse_chat_request
from gateway.runtime.responses_request import ResponsesOptions, chat_body_of
from gateway.runtime.sse import SseSink
from gateway.types import ChatType, InboundMessage

if TYPE_CHECKING:
    from gateway.runtime.api import LocalApi

log = logging.getLogger(__name__)

CODEX_SESSION_HEADER = "session_id"  # the Codex CLI names its conversation so


class ResponsesApi:
    """The ``/v1/responses`` handler of a :class:`~gateway.runtime.api.LocalApi`."""

    def __init__(self, api: LocalApi):
        self.api = api

    async def create(self, request: web.Request) -> web.StreamResponse:
        api = self.api
        chat_body, options = chat_body_of(await api.read_json(request))
        shape = ResponseShape(api.router.db, api.conversations.agent, f"resp_{uuid.uuid4().hex}", api.model_name,
                              time.time(), options, chat_body)
        chat = parse_chat_request(chat_body)
        chat = replace(chat, include_usage=chat.stream, front=shape)  # usage is part of response.completed
        api_tools.check_names(chat, api.router.turn.tools.names())
        if options.previous_response_id is not None:
            session = await api.router.db.get_routed_session(shape.route_key(options.previous_response_id))
            if session is None or not session.get("session_key"):
                raise ApiError(400, f"no response with the id {options.previous_response_id!r} is known here; "
                                    "send the whole conversation as 'input' instead", param="previous_response_id",
                               code="previous_response_not_found")
            return await self._kept(request, chat, session["session_key"])
        if options.conversation is not None:
            scope = f"conversation:{chat.user or ''}:{options.conversation}"
            return await self._kept(request, chat, api_conversation_key(api.conversations.agent, scope))
        codex = request.headers.get(CODEX_SESSION_HEADER)
        return await api.answer(request, chat, ("codex", codex) if codex else None)

    async def _kept(self, request: web.Request, chat: ChatRequest, key: str) -> web.StreamResponse:
        """A conversation the gateway keeps: what ``input`` brings is stored after it, and answered."""
        api = self.api
        user = chat.user or chat.safety_identifier
        msg = InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=key, user_id=user, user_name=user,
                             text=chat.last_user.text if chat.messages else "", attachments=chat.images)
        ticket = Ticket(msg, key, "", sink=SseSink() if chat.stream else None, system_notes=chat.system,
                        params=chat.params, client_tools=chat.tools)
        ticket.prepare = api_tools.with_results(api.router.db, chat, lambda: self._append(key, chat, user))
        return await api._client_kept(ticket, request, chat, None)

    async def _append(self, key: str, chat: ChatRequest, user: str | None) -> str:
        db = self.api.router.db
        session = await db.get_routed_session(key)
        if session is None:
            session_id = state.new_session_id()
            await db.create_session(session_id, "api", self.api.model_name, user, None, session_key=key,
                                    user_name=user, system_prompt=self.api.conversations.persona)
            await db.set_route(key, session_id)
        else:
            session_id = session["id"]
        if chat.messages:
            await db.append_messages(session_id, [{"role": m.role, "content": m.stored} for m in chat.messages])
        return session_id


@dataclass
class ResponseShape:
    """One response: its id and what its request said, rendered whole (:meth:`body`) or as events
    (:meth:`open`); :meth:`wrap` records the session it is answered in."""

    db: Any
    agent: str
    id: str
    model: str
    created: float
    options: ResponsesOptions
    chat_body: dict

    def route_key(self, response_id: str) -> str:
        return api_conversation_key(self.agent, response_id, kind="resp")

    def wrap(self, prepare: Callable[[], Awaitable[str | None]]) -> Callable[[], Awaitable[str | None]]:
        async def prepared() -> str | None:
            session_id = await prepare()
            if session_id is not None:
                await self.db.set_route(self.route_key(self.id), session_id)
            return session_id

        return prepared

    def output(self, content: str, calls: list[dict]) -> list[dict]:
        items: list[dict] = []
        if content or not calls:
            items.append(_message_item(f"msg_{self.id[5:]}", content, "completed"))
        items += [_call_item(call, "completed") for call in calls]
        return items

    def body(self, answer: Any, status: str = "completed", output: list[dict] | None = None) -> dict:
        chat = self.chat_body
        body = {
            "id": self.id, "object": "response", "created_at": int(self.created), "status": status,
            "model": self.model, "output": self.output(answer.content, answer.tool_calls) if output is None else output,
            "error": None, "incomplete_details": None, "instructions": self.options.instructions,
            "metadata": self.options.metadata or {}, "parallel_tool_calls": True,
            "previous_response_id": self.options.previous_response_id,
            "temperature": chat.get("temperature"), "top_p": chat.get("top_p"),
            "tool_choice": _tool_choice(chat.get("tool_choice", "auto")),
            "tools": [{"type": "function", **t["function"]} for t in chat.get("tools") or []],
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "session_id": answer.session_id,
        }
        if self.options.conversation is not None:
            body["conversation"] = {"id": self.options.conversation}
        if status == "completed":
            body["usage"] = _usage(answer.prompt_tokens, answer.completion_tokens)
        return body

    async def open(self, request: web.Request, answer: Any, headers: dict) -> ResponseEvents:
        events = ResponseEvents(self, answer, headers)
        await events.start(request)
        return events


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


def _message_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(call: dict, status: str) -> dict:
    return {"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if status == "completed" else "", "status": status}


class ResponseEvents:
    """The Responses API's event stream for one answer, fed as :class:`~gateway.runtime.sse.ChunkEvents`
    is (``send(delta, finish_reason)``, ``usage``, ``error``, ``comment``, ``close``): response.created,
    then the output items as they come (response.output_item.added, response.output_text.delta,
    response.function_call_arguments.delta/done, response.output_item.done), then response.completed.
    A client that left is noted (``gone``), never raised."""

    def __init__(self, shape: ResponseShape, answer: Any, headers: dict):
        self.shape = shape
        self.answer = answer
        self.headers = headers
        self.gone = False
        self._response: web.StreamResponse | None = None
        self._sequence = 0
        self._output: list[dict] = []
        self._text: str | None = None  # the message item being written, while it is open
        self._finished = False
        self._usage = (0, 0)

    async def start(self, request: web.Request) -> None:
        self._response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                     "X-Accel-Buffering": "no", **self.headers})
        try:
            await self._response.prepare(request)
        except ConnectionError:
            self.gone = True
        head = self.shape.body(self.answer, "in_progress", [])
        await self._event("response.created", response=head)
        await self._event("response.in_progress", response=head)

    @property
    def _item_id(self) -> str:
        return f"msg_{self.shape.id[5:]}"

    async def send(self, delta: dict, finish_reason: str | None = None) -> None:
        if delta.get("content"):
            if self._text is None:
                self._text = ""
                await self._event("response.output_item.added", output_index=len(self._output),
                                  item=_message_item(self._item_id, "", "in_progress"))
                await self._event("response.content_part.added", item_id=self._item_id,
                                  output_index=len(self._output), content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": []})
            self._text += delta["content"]
            await self._event("response.output_text.delta", item_id=self._item_id, output_index=len(self._output),
                              content_index=0, delta=delta["content"])
        for call in delta.get("tool_calls") or []:
            await self._close_message()
            await self._call(call)
        if finish_reason is not None:
            await self._close_message()
            self._finished = True

    async def _call(self, call: dict) -> None:
        index, item = len(self._output), _call_item(call, "completed")
        await self._event("response.output_item.added", output_index=index, item=_call_item(call, "in_progress"))
        await self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                          delta=item["arguments"])
        await self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                          name=item["name"], arguments=item["arguments"])
        await self._event("response.output_item.done", output_index=index, item=item)
        self._output.append(item)

    async def _close_message(self) -> None:
        if self._text is None:
            return
        text, self._text, index = self._text, None, len(self._output)
        part = {"type": "output_text", "text": text, "annotations": []}
        await self._event("response.output_text.done", item_id=self._item_id, output_index=index, content_index=0,
                          text=text)
        await self._event("response.content_part.done", item_id=self._item_id, output_index=index, content_index=0,
                          part=part)
        item = _message_item(self._item_id, text, "completed")
        await self._event("response.output_item.done", output_index=index, item=item)
        self._output.append(item)

    async def usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        self._usage = (prompt_tokens, completion_tokens)

    async def error(self, message: str, kind: str, code: str | None = None) -> None:
        """An ``error`` event (the openai SDK raises it as an ``APIError``); the response does not complete."""
        self._finished = False
        await self._event("error", message=message, code=code, param=None,
                          error={"message": message, "type": kind, "code": code, "param": None})

    async def comment(self, line: str) -> None:
        await self._write(f": {' '.join(line.splitlines())}\n\n")

    async def close(self) -> web.StreamResponse:
        assert self._response is not None
        if self._finished:
            self.answer.prompt_tokens, self.answer.completion_tokens = self._usage
            await self._event("response.completed", response=self.shape.body(self.answer, "completed", self._output))
        if not self.gone:
            try:
                await self._response.write_eof()
            except ConnectionError:
                self.gone = True
        return self._response

    async def _event(self, kind: str, **fields) -> None:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        await self._write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n")

    async def _write(self, text: str) -> None:
        if self.gone or self._response is None:
            return
        try:
            await self._response.write(text.encode())
        except ConnectionError:
            self.gone = True
            log.info("a Responses API client left mid-stream; its answer is still stored")
