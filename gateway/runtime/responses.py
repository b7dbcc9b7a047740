"""``POST /v1/responses``: the Responses API (the Codex CLI's only API, the OpenAI Agents SDK's default),
translated into the same :class:`~gateway.runtime.api_request.ChatRequest` and answered by the same
turn as ``/v1/chat/completions`` (:meth:`~gateway.runtime.api.LocalApi.answer`); only the answer's
shape differs: :class:`ResponsesFormat` is the :class:`~gateway.runtime.api_render.Format` that writes
it out, whole or as the Responses event stream (:class:`ResponseEvents`).

Which conversation a request continues:

- ``previous_response_id``: the conversation that response belongs to; the gateway keeps its history,
  so ``input`` holds only what is new (a user message, ``function_call_output`` items).
- ``conversation`` (an id, or ``{"id": ...}``): a conversation the gateway keeps under that id (per
  ``user``); ``input`` holds what is new.
- A Codex ``session_id`` header: like Open WebUI's chat id, the client keeps the history and sends
  it all (as the Codex CLI does), lined up with the stored one as for chat completions.
- None of these: ``X-Session-Key``, ``user`` and the fingerprint, as for chat completions.

Each response's id is recorded (routing key ``agent:<agent>:api:resp:<id>``) with the session it
was answered in once its answer is stored, before the answer is written out
(:meth:`ResponsesFormat.kept`), so a ``previous_response_id`` always finds it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

import state
from gateway.control import Request, RequestExtras, Requests
from gateway.keys import api_conversation_key
from gateway.runtime import api_tools
from gateway.runtime.api_render import Answer, Format
from gateway.runtime.api_request import ApiError, ChatRequest, parse_chat_request
from gateway.runtime.api_sessions import Conversations
from gateway.runtime.responses_request import ResponsesOptions, chat_body_of
from gateway.runtime.sse import SseSink
from gateway.turn import AgentTurn
from gateway.types import ChatType, InboundMessage

log = logging.getLogger(__name__)

CODEX_SESSION_HEADER = "session_id"  # the Codex CLI names its conversation so


class ApiHost(Protocol):
    """What the Responses API uses of the local API (:class:`~gateway.runtime.api.LocalApi`)."""

    requests: Requests
    turn: AgentTurn
    conversations: Conversations
    model_name: str

    async def read_json(self, request: web.Request) -> Any: ...

    def extras_of(self, request: web.Request, chat: ChatRequest, model: str | None = None) -> RequestExtras: ...

    def chosen_model(self, chat: ChatRequest, user_id: str | None, key: str) -> str | None: ...

    async def answer(self, request: web.Request, chat: ChatRequest, fmt: Format,
                     client_id: tuple[str, str] | None = None) -> web.StreamResponse: ...

    async def answer_request(self, key: str, submitted: Request, request: web.Request, chat: ChatRequest,
                             fmt: Format) -> web.StreamResponse: ...


class ResponsesApi:
    """The ``/v1/responses`` handler of a :class:`~gateway.runtime.api.LocalApi`."""

    def __init__(self, api: ApiHost):
        self.api = api

    async def create(self, request: web.Request) -> web.StreamResponse:
        api = self.api
        chat_body, options = chat_body_of(await api.read_json(request))
        fmt = ResponsesFormat(api.requests.db, api.conversations.agent, f"resp_{uuid.uuid4().hex}", api.model_name,
                              time.time(), options, chat_body)
        chat = parse_chat_request(chat_body)
        api_tools.check_names(chat, api.turn.tools.names())
        if options.previous_response_id is not None:
            session = await api.requests.db.routes.session(fmt.route_key(options.previous_response_id))
            if session is None or not session.get("session_key"):
                raise ApiError(400, f"no response with the id {options.previous_response_id!r} is known here; "
                                    "send the whole conversation as 'input' instead", param="previous_response_id",
                               code="previous_response_not_found")
            return await self._kept(request, chat, fmt, session["session_key"])
        if options.conversation is not None:
            scope = f"conversation:{chat.user or ''}:{options.conversation}"
            return await self._kept(request, chat, fmt, api_conversation_key(api.conversations.agent, scope))
        codex = request.headers.get(CODEX_SESSION_HEADER)
        return await api.answer(request, chat, fmt, ("codex", codex) if codex else None)

    async def _kept(self, request: web.Request, chat: ChatRequest, fmt: ResponsesFormat,
                    key: str) -> web.StreamResponse:
        """A conversation the gateway keeps: what ``input`` brings is stored after it, and answered."""
        api = self.api
        user = chat.user or chat.safety_identifier
        msg = InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=key, user_id=user, user_name=user,
                             text=chat.last_user.text if chat.messages else "", attachments=chat.images)
        model = api.chosen_model(chat, user, api.requests.key_for(msg))
        submitted = Request(msg, SseSink() if chat.stream else None, api.extras_of(request, chat, model),
                            api_tools.with_results(api.requests.db, chat, lambda: self._append(key, chat, user)))
        return await api.answer_request(key, submitted, request, chat, fmt)

    async def _append(self, key: str, chat: ChatRequest, user: str | None) -> str:
        db = self.api.requests.db
        session = await db.routes.session(key)
        if session is None:
            session_id = state.new_session_id()
            await db.sessions.create(session_id, "api", self.api.model_name, user, None, session_key=key,
                                    user_name=user, system_prompt=self.api.conversations.persona)
            await db.routes.set(key, session_id)
        else:
            session_id = session["id"]
        if chat.messages:
            await db.messages.append_many(session_id, [{"role": m.role, "content": m.stored} for m in chat.messages])
        return session_id


@dataclass
class ResponsesFormat:
    """One response: its id and what its request said, rendered whole (:meth:`body`) or as events
    (:meth:`open`); :meth:`kept` records the session it is answered in."""

    db: state.AsyncSessionDB
    agent: str
    id: str
    model: str
    created: float
    options: ResponsesOptions
    chat_body: dict

    def route_key(self, response_id: str) -> str:
        return api_conversation_key(self.agent, response_id, kind="resp")

    async def kept(self, answer: Answer) -> None:
        if answer.session_id:
            await self.db.routes.set(self.route_key(self.id), answer.session_id)

    def output(self, content: str, calls: list[dict]) -> list[dict]:
        items: list[dict] = []
        if content or not calls:
            items.append(_message_item(f"msg_{self.id[5:]}", content, "completed"))
        items += [_call_item(call, "completed") for call in calls]
        return items

    def body(self, answer: Answer, status: str = "completed", output: list[dict] | None = None) -> dict:
        chat = self.chat_body
        body = {
            "id": self.id, "object": "response", "created_at": int(self.created), "status": status,
            "model": answer.model or self.model, "output": self.output(answer.content, answer.tool_calls) if output is None else output,
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

    async def open(self, request: web.Request, answer: Answer, headers: dict) -> ResponseEvents:
        events = ResponseEvents(self, answer, headers)
        await events.prepare(request)
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
    """The Responses API's event stream for one answer (an :class:`~gateway.runtime.api_render.Events`):
    response.created, then the output items as they come (response.output_item.added,
    response.output_text.delta, response.function_call_arguments.delta/done,
    response.output_item.done), then response.completed.  A client that left is noted (``gone``),
    never raised."""

    def __init__(self, fmt: ResponsesFormat, answer: Answer, headers: dict):
        self.fmt = fmt
        self.answer = answer
        self.headers = headers
        self.gone = False
        self._response: web.StreamResponse | None = None
        self._sequence = 0
        self._output: list[dict] = []
        self._text: str | None = None  # the message item being written, while it is open

    async def prepare(self, request: web.Request) -> None:
        self._response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                     "X-Accel-Buffering": "no", **self.headers})
        try:
            await self._response.prepare(request)
        except ConnectionError:
            self.gone = True

    async def start(self) -> None:
        head = self.fmt.body(self.answer, "in_progress", [])
        await self._event("response.created", response=head)
        await self._event("response.in_progress", response=head)

    @property
    def _item_id(self) -> str:
        return f"msg_{self.fmt.id[5:]}"

    async def content(self, text: str) -> None:
        if not text:
            return
        if self._text is None:
            self._text = ""
            await self._event("response.output_item.added", output_index=len(self._output),
                              item=_message_item(self._item_id, "", "in_progress"))
            await self._event("response.content_part.added", item_id=self._item_id,
                              output_index=len(self._output), content_index=0,
                              part={"type": "output_text", "text": "", "annotations": []})
        self._text += text
        await self._event("response.output_text.delta", item_id=self._item_id, output_index=len(self._output),
                          content_index=0, delta=text)

    async def finish(self, answer: Answer, include_usage: bool) -> None:
        """The calls of the client's tools as function_call items, then response.completed (its usage
        always: the Responses API has it there)."""
        await self._close_message()
        for call in answer.tool_calls:
            await self._call(call)
        await self._event("response.completed", response=self.fmt.body(answer, "completed", self._output))

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

    async def error(self, message: str, kind: str, code: str | None = None) -> None:
        """An ``error`` event (the openai SDK raises it as an ``APIError``); the response does not complete."""
        await self._event("error", message=message, code=code, param=None,
                          error={"message": message, "type": kind, "code": code, "param": None})

    async def comment(self, line: str) -> None:
        await self._write(f": {' '.join(line.splitlines())}\n\n")

    async def close(self) -> web.StreamResponse:
        assert self._response is not None
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
